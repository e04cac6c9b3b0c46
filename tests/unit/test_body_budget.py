"""The bytes of requests a front-end process holds: in two lines, the small requests' and the others',
each first come first served, one larger than its line's room alone, and one that gave up waiting (its
deadline passed, or its gRPC call ended) lets those behind it in; a small request never waits behind a
large one, and small ones never take a large one's room; an HTTP body waits as a greenlet, a gRPC call
as an asyncio task."""

import asyncio

import gevent
from gevent.event import Event

from container.body_budget import BodyBudget

# 1,600 bytes: the small requests' line 200 (each at most 12 bytes), the others' 1,400
BUDGET = 1600


def holder(budget: BodyBudget, size: int, order: list, done: Event, timeout: float = 5) -> None:
    """Take `size`, note it, hold it until `done`, then give it back."""
    if budget.take(size, timeout):
        order.append(size)
        done.wait()
        budget.give(size)
    else:
        order.append(-size)


def test_bodies_wait_for_room_in_the_order_they_came():
    budget, order, done = BodyBudget(BUDGET), [], Event()
    first = gevent.spawn(holder, budget, 900, order, done)
    gevent.sleep(0)
    waiting = [gevent.spawn(holder, budget, size, order, Event()) for size in (800, 100)]
    gevent.sleep(0)
    assert order == [900] and budget.used == 900  # the 100 would fit, but waits behind the 800 that came first
    done.set()
    first.join(timeout=5)
    gevent.sleep(0)
    assert order == [900, 800, 100] and budget.used == 900
    gevent.killall(waiting)


def test_a_body_larger_than_its_line_goes_alone():
    budget, order, done = BodyBudget(BUDGET), [], Event()
    large = gevent.spawn(holder, budget, 2500, order, done)
    gevent.sleep(0)
    other = gevent.spawn(holder, budget, 100, order, done)
    gevent.sleep(0)
    assert order == [2500]
    done.set()
    gevent.joinall([large, other], timeout=5)
    assert order == [2500, 100] and budget.used == 0


def test_a_body_that_gives_up_lets_those_behind_it_in():
    budget, order, done = BodyBudget(BUDGET), [], Event()
    first = gevent.spawn(holder, budget, 900, order, done)
    gevent.sleep(0)
    impatient = gevent.spawn(holder, budget, 800, order, Event(), timeout=0.01)
    gevent.sleep(0)
    behind = gevent.spawn(holder, budget, 500, order, Event())
    impatient.join(timeout=5)
    gevent.sleep(0)
    assert order == [900, -800, 500] and budget.used == 1400
    done.set()
    first.join(timeout=5)
    gevent.kill(behind)


def test_a_small_request_never_waits_behind_a_large_one():
    budget, order, done = BodyBudget(BUDGET), [], Event()
    holders = [gevent.spawn(holder, budget, size, order, done) for size in (900, 800)]
    gevent.sleep(0)
    assert order == [900]  # the 800 waits for room
    assert budget.take(0, timeout=0) and budget.take(12, timeout=0)  # a health check, a small inference: at once
    budget.give(12)
    done.set()
    gevent.joinall(holders, timeout=5)
    assert order == [900, 800] and budget.used == 0


def test_small_requests_take_turns_in_their_own_line_and_never_the_room_of_a_large_one():
    budget, order, release = BodyBudget(BUDGET), [], Event()
    first = gevent.spawn(holder, budget, 900, order, release)
    gevent.sleep(0)
    large = gevent.spawn(holder, budget, 800, order, Event())
    small = [gevent.spawn(holder, budget, 10, order, Event()) for _ in range(21)]
    gevent.sleep(0)
    assert order == [900] + [10] * 20  # the small line is full: the 21st waits in it
    assert budget.take(0, timeout=0)  # a request without a body (a health check) waits for nothing
    release.set()  # the large line's room is made while the small requests still hold theirs
    first.join(timeout=5)
    gevent.sleep(0)
    assert order == [900] + [10] * 20 + [800] and budget.used == 800 + 200
    gevent.killall([large, *small])


def test_a_grpc_call_waits_as_a_task_and_one_cancelled_while_waiting_leaves_the_line():
    async def scenario() -> None:
        budget = BodyBudget(BUDGET)
        assert await budget.take_async(900, 5)
        cancelled = asyncio.create_task(budget.take_async(800, 5))
        behind = asyncio.create_task(budget.take_async(500, 5))
        await asyncio.sleep(0)  # both wait in line
        cancelled.cancel()  # its call ended: the 500 behind it fits now
        assert await asyncio.wait_for(behind, 5) and budget.used == 1400
        assert not await budget.take_async(100, 0.01)  # no room within its deadline
        assert await budget.take_async(12, 0.01)  # a small one has its own line
        budget.give(900)
        budget.give(500)
        budget.give(12)
        assert budget.used == 0 and await budget.take_async(1400, 5)

    asyncio.run(scenario())
