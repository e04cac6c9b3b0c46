"""A gRPC front-end's calls that its clients abandon, and the groups its calls make (channel/client.py,
channel/groups.py's AsyncGroups): a stream the caller stops reading is stopped in the model process, a
group of calls only once every call in it is cancelled, and calls handed over in successive turns of the
loop go as one group. The model process is a real ChannelServer on a gevent hub of its own thread;
this test is the front-end, on an asyncio loop, as a gRPC front-end is. A front-end that hangs up abandons
every call it has under way: what the model process writes for them must not stay in shared memory."""

import asyncio
import os
import threading
from pathlib import Path

import gevent
import pytest
from gevent import GreenletExit
from gevent.event import Event

from container.channel import blob_prefix
from container.channel.blobs import THRESHOLD, large
from container.channel.client import ChannelClient
from container.channel.groups import TAKEN, AsyncGroups, GroupItems
from container.channel.server import ChannelServer
from container.errors import Unavailable
from tests.builders import wait_for


class ModelProcess:
    """`group(key, calls)` records each group as {"calls": [n, …], "ended": None, "finished" or "killed",
    "cancelled": the positions cancelled alone}; it holds a call [n, "held"] until `release()`; a group
    whose first call is [n, "untaken"] is not taken up until then either. `echo(value)` answers at once;
    `held_large()` answers data that crosses in shared memory, once released, and `held_large_items()` streams it.
    `stop_then_echo(value)` begins the stop, then answers. Once drained, its thread ends, as the process
    would: what it had not written by then is lost. `gone`: the front-ends that hung up."""

    def __init__(self, path: str):
        self.path, self.groups, self.holding, self.gone = path, [], False, []
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        assert self._started.wait(10), "the model process did not start"

    def _run(self) -> None:
        self._hub, self._gate, self._stop = gevent.get_hub(), Event(), Event()
        server = ChannelServer(self.path, {"group": self._group, "echo": lambda value: value, "held_large": self._held_large,
                                            "held_large_items": self._held_large_items, "stop_then_echo": self._stop_then_echo},
                               1 << 20, on_disconnect=self.gone.append)
        server.start()
        self._started.set()
        self._stop.wait()
        server.drain(1)

    def _group(self, front_end: int, key: str, calls: list) -> GroupItems:
        record = {"calls": [call[0] for call in calls], "ended": None, "cancelled": []}
        self.groups.append(record)
        return GroupItems(self._items(record, calls), [_Told(record["cancelled"], position) for position in range(len(calls))])

    def _items(self, record: dict, calls: list):
        try:
            if calls[0][1:] == ["untaken"]:
                self._gate.wait(30)
            yield TAKEN
            for position, (number, *how) in enumerate(calls):
                if how == ["held"]:
                    self._gate.wait(30)
                yield [position, None, number * 2]
            record["ended"] = "finished"
        except GreenletExit:
            record["ended"] = "killed"
            raise

    def _held_large(self):
        self.holding = True
        self._gate.wait(30)
        return large(b"x" * THRESHOLD)

    def _stop_then_echo(self, value):
        self._stop.set()  # the stop begins during this call, as a sticky device error's SIGTERM to its own process does
        return value

    def _held_large_items(self):
        yield TAKEN
        yield self._held_large()

    def release(self) -> None:
        self._hub.loop.run_callback_threadsafe(self._gate.set)

    def stop(self) -> None:
        self._hub.loop.run_callback_threadsafe(self._stop.set)
        self._thread.join(10)


class _Told:
    """A call's cancellation, as the model process's group operations hold one (inference.Ticket)."""

    def __init__(self, cancelled: list, position: int):
        self.cancelled, self.position = cancelled, position

    def cancel(self) -> None:
        self.cancelled.append(self.position)


@pytest.fixture
def model_process(tmp_path):
    process = ModelProcess(str(tmp_path / "models.sock"))
    yield process
    process.release()
    process.stop()


async def connected(path: str) -> ChannelClient:
    channel = ChannelClient(path)
    channel.start()
    assert await channel.wait_connected(10)
    return channel


async def two_held_calls(process: ModelProcess) -> tuple[ChannelClient, list[asyncio.Task]]:
    """A connection, and two calls over it that went as one group, held in the model process."""
    channel = await connected(process.path)
    groups = AsyncGroups(channel, "group")
    calls = [asyncio.create_task(groups.call(("a",), [n, "held"], 8)) for n in (1, 2)]
    await asyncio.sleep(0)  # both join the group of this turn
    await round_trips_until(channel, lambda: process.groups)
    return channel, calls


def ended(process: ModelProcess, index: int = 0) -> str | None:
    return wait_for(lambda: len(process.groups) > index and process.groups[index]["ended"], 10, "the group never ended")


def test_a_stream_its_caller_stops_reading_is_stopped_in_the_model_process(model_process):
    async def abandon():
        channel = await connected(model_process.path)
        stream = channel.stream("group", 0, "a", [[1, "held"]])
        assert await stream.__anext__() == TAKEN
        await stream.aclose()  # as a cancelled task's `async for` closes it
        await channel.close()

    asyncio.run(abandon())
    assert ended(model_process) == "killed"


def test_a_stream_read_to_its_end_is_not_stopped(model_process):
    async def read_all():
        channel = await connected(model_process.path)
        items = [item async for item in channel.stream("group", 0, "a", [[1], [2]])]
        await channel.close()
        return items

    assert asyncio.run(read_all()) == [TAKEN, [0, None, 2], [1, None, 4]]
    assert ended(model_process) == "finished"


def test_calls_that_grpcio_hands_over_in_successive_turns_go_as_one_group(model_process):
    async def three_turns():
        channel = await connected(model_process.path)
        groups = AsyncGroups(channel, "group")
        calls = []
        for n in (1, 2, 3):  # the first call opens a group in one turn; the others come in the next two
            calls.append(asyncio.create_task(groups.call(("a",), [n], 8)))
            await asyncio.sleep(0)
        answers = await asyncio.wait_for(asyncio.gather(*calls), 10)
        await channel.close()
        return answers

    assert asyncio.run(three_turns()) == [[2], [4], [6]]
    assert [group["calls"] for group in model_process.groups] == [[1, 2, 3]]


def test_a_group_is_cancelled_once_every_call_in_it_is(model_process):
    async def cancel_one_then_the_other():
        channel, calls = await two_held_calls(model_process)
        calls[0].cancel()
        for _ in range(2):  # round trips after the cancellation it would have sent, if it had
            await channel.call("echo", None)
        assert model_process.groups[0]["ended"] is None
        calls[1].cancel()
        await asyncio.gather(*calls, return_exceptions=True)
        killed = ended(model_process)
        await channel.close()
        return killed

    assert asyncio.run(cancel_one_then_the_other()) == "killed"
    assert model_process.groups[0]["calls"] == [1, 2]


def test_a_group_whose_callers_all_left_before_it_went_is_never_sent(model_process):
    """It waited behind a group the model process had not taken up."""
    async def leave_early():
        channel = await connected(model_process.path)
        groups = AsyncGroups(channel, "group")
        first = asyncio.create_task(groups.call(("a",), [1, "untaken"], 8))
        while not model_process.groups:
            await channel.call("echo", None)
        waiting = asyncio.create_task(groups.call(("a",), [2], 8))
        await asyncio.sleep(0)  # it joins a group that waits for the first to be taken up
        waiting.cancel()
        model_process.release()
        answer = await first
        await channel.call("echo", None)
        await channel.close()
        return answer

    assert asyncio.run(leave_early()) == [2]
    assert [group["calls"] for group in model_process.groups] == [[1]]


def test_a_call_whose_caller_left_before_its_group_went_is_left_out_of_it(model_process):
    """Two calls wait behind a group the model process has not taken up; one is cancelled: the group goes
    with the other alone, which is answered."""
    async def one_leaves():
        channel = await connected(model_process.path)
        groups = AsyncGroups(channel, "group")
        first = asyncio.create_task(groups.call(("a",), [1, "untaken"], 8))
        while not model_process.groups:
            await channel.call("echo", None)
        waiting = [asyncio.create_task(groups.call(("a",), [n], 8)) for n in (2, 3)]
        await asyncio.sleep(0)  # both join the group that waits for the first to be taken up
        waiting[0].cancel()
        model_process.release()
        answers = [await first, await waiting[1]]
        await channel.close()
        return answers

    assert asyncio.run(one_leaves()) == [[2], [6]]
    assert [group["calls"] for group in model_process.groups] == [[1], [3]]


def test_one_call_of_a_group_under_way_is_cancelled_alone(model_process):
    """Two calls went as one group; the first is cancelled while both are held: the model process hears
    that call's position alone, the group goes on, and the second is answered."""
    async def cancel_one():
        channel, calls = await two_held_calls(model_process)
        calls[0].cancel()
        await round_trips_until(channel, lambda: model_process.groups[0]["cancelled"])
        model_process.release()
        answer = await calls[1]
        await channel.close()
        return answer

    assert asyncio.run(cancel_one()) == [4]
    assert ended(model_process) == "finished"
    assert model_process.groups[0]["cancelled"] == [0] and model_process.groups[0]["calls"] == [1, 2]


def test_a_group_under_way_when_the_connection_is_lost_tells_each_of_its_calls_to_retry(model_process):
    async def lose_it():
        channel, calls = await two_held_calls(model_process)
        await channel.close()
        return await asyncio.wait_for(asyncio.gather(*calls, return_exceptions=True), 10)

    told = asyncio.run(lose_it())
    assert [(type(exc), exc.status, str(exc)) for exc in told] == \
        [(Unavailable, 503, "the model process ended during the request; retry")] * 2


async def round_trips_until(channel: ChannelClient, predicate, most: int = 1000) -> None:
    """Calls to the model process, one after another, until `predicate()` (at most `most` of them)."""
    for _ in range(most):
        if predicate():
            return
        await channel.call("echo", None)
    raise AssertionError("the model process never got there")


def test_at_a_stop_a_call_under_way_is_answered_and_new_ones_are_told_to_retry(model_process):
    """The gRPC front-end at SIGTERM: it refuses new calls (gRPC's own stop would cancel those waiting in
    its queues, and the client would not know to retry), and has settled only once the call under way is
    answered."""
    async def stop_while_one_is_held():
        channel = await connected(model_process.path)
        held = asyncio.ensure_future(_items(channel.stream("group", 0, "a", [[1, "held"]])))
        await asyncio.wait_for(_reached(model_process), 10)
        channel.refuse("the server is shutting down")
        with pytest.raises(Unavailable, match="the server is shutting down"):
            await channel.call("echo", 1)
        with pytest.raises(Unavailable, match="the server is shutting down"):
            await _items(channel.stream("group", 0, "b", [[2]]))
        assert not await channel.settled(0.3)  # the held call cannot have been answered
        model_process.release()
        assert await asyncio.wait_for(held, 10) == [TAKEN, [0, None, 2]]
        assert await channel.settled(10)
        await channel.close()

    asyncio.run(stop_while_one_is_held())
    assert [group["calls"] for group in model_process.groups] == [[1]]  # the refused ones never crossed


def test_a_call_during_which_the_stop_begins_is_answered_before_the_process_may_end(model_process):
    """A sticky device error stops its own process during the call that met it: the drain found no call
    under way, with the answer still queued for the connection's writer, and the process ended without
    it (the client was told the model process ended, not the error)."""
    async def call_that_stops():
        channel = await connected(model_process.path)
        assert await asyncio.wait_for(channel.call("stop_then_echo", 7), 10) == 7
        await channel.close()

    asyncio.run(call_that_stops())


async def _reached(process: ModelProcess) -> None:
    while not process.groups:
        await asyncio.sleep(0.01)


async def _items(stream) -> list:
    return [item async for item in stream]


@pytest.mark.parametrize("op", ["held_large", "held_large_items"])
def test_a_large_answer_made_after_its_front_end_hung_up_is_not_left_in_shared_memory(model_process, op):
    """A front-end killed while the model process makes a large answer for it (once in a 240 s chaos run): the
    answer was written to /dev/shm after the connection's untaken data had been removed, and stayed there
    until the model process exited."""
    async def hang_up():
        channel = await connected(model_process.path)
        asyncio.create_task(channel.call(op) if op == "held_large" else anext(channel.stream(op)))
        while not model_process.holding:
            await channel.call("echo", None)
        await channel.close()

    asyncio.run(hang_up())
    wait_for(lambda: model_process.gone, 10, "the model process did not hear the front-end hang up")
    model_process.release()
    model_process.stop()  # once the held call has answered
    assert not list(Path("/dev/shm").glob(f"{blob_prefix(model_process.path)}-{os.getpid()}-*"))
