"""The bytes of requests a front-end process holds: first come first served, one larger than the whole
budget alone, and one that gave up waiting (its deadline passed, or its gRPC call ended) lets those behind
it in; an HTTP body waits as a greenlet, a gRPC call as an asyncio task."""

import asyncio

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


def test_a_grpc_call_waits_as_a_task_and_one_cancelled_while_waiting_leaves_the_line():
    async def scenario() -> None:
        budget = BodyBudget(10)
        assert await budget.take_async(6, 5)
        cancelled = asyncio.create_task(budget.take_async(5, 5))
        behind = asyncio.create_task(budget.take_async(4, 5))
        await asyncio.sleep(0)  # both wait in line
        cancelled.cancel()  # its call ended: the 4 behind it fits now
        assert await asyncio.wait_for(behind, 5) and budget.used == 10
        assert not await budget.take_async(1, 0.01)  # no room within its deadline
        budget.give(6)
        budget.give(4)
        assert budget.used == 0 and await budget.take_async(10, 5)

    asyncio.run(scenario())
