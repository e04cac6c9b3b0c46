"""The bytes of request bodies an HTTP process holds: first come first served, a body larger than the
whole budget alone, and a body that gave up waiting lets those behind it in."""

import gevent
from gevent.event import Event

from container.body_budget import BodyBudget


def holder(budget: BodyBudget, size: int, order: list, done: Event, timeout: float = 5) -> None:
    """Take `size`, note it, hold it until `done`, then give it back."""
    if budget.take(size, timeout):
        order.append(size)
        done.wait()
        budget.give(size)
    else:
        order.append(-size)


def test_bodies_wait_for_room_in_the_order_they_came():
    budget, order, done = BodyBudget(10), [], Event()
    first = gevent.spawn(holder, budget, 6, order, done)
    gevent.sleep(0)
    waiting = [gevent.spawn(holder, budget, size, order, Event()) for size in (5, 1)]
    gevent.sleep(0)
    assert order == [6] and budget.used == 6  # the 1 would fit, but waits behind the 5 that came first
    done.set()
    first.join(timeout=5)
    gevent.sleep(0)
    assert order == [6, 5, 1] and budget.used == 6
    gevent.killall(waiting)


def test_a_body_larger_than_the_budget_goes_alone():
    budget, order, done = BodyBudget(10), [], Event()
    large = gevent.spawn(holder, budget, 25, order, done)
    gevent.sleep(0)
    small = gevent.spawn(holder, budget, 1, order, done)
    gevent.sleep(0)
    assert order == [25]
    done.set()
    gevent.joinall([large, small], timeout=5)
    assert order == [25, 1] and budget.used == 0


def test_a_body_that_gives_up_lets_those_behind_it_in():
    budget, order, done = BodyBudget(10), [], Event()
    first = gevent.spawn(holder, budget, 6, order, done)
    gevent.sleep(0)
    impatient = gevent.spawn(holder, budget, 5, order, Event(), timeout=0.01)
    gevent.sleep(0)
    behind = gevent.spawn(holder, budget, 4, order, Event())
    impatient.join(timeout=5)
    gevent.sleep(0)
    assert order == [6, -5, 4] and budget.used == 10
    done.set()
    first.join(timeout=5)
    gevent.kill(behind)
