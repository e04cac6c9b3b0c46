"""Calls that arrive together cross the channel together (channel/groups.py): a front-end's calls for
one key made in one turn of its hub go as one call of the group operation, each caller answered as its
own item comes back, over a real Unix socket to a real ChannelServer on this test's hub."""

import os

import gevent
import pytest
from gevent import socket
from gevent.event import Event

from container.channel import wire
from container.channel.groups import MOST_BYTES, MOST_CALLS, TAKEN, GroupItems, Groups
from container.channel.hub_client import HubChannelClient
from container.channel.server import ChannelServer
from container.channel.stream import FrameReader
from container.errors import Cancelled, InvalidInput, PayloadTooLarge, ServeError, Unavailable
from container.inference import Client
from tests.builders import poll

LIMIT = 64 << 10  # the largest call this test's model process reads


@pytest.fixture
def channel(tmp_path):
    """A model process whose `group(front_end, key, calls)` records each group it gets, answers each call [n] with
    n * 2 (a negative n is refused), holds a call [n, "gated"] until `gate` is set, fails the whole
    call at [n, "fail"], answers [n, "garbled"] with what no front-end can read and [n, "dropped"] not at
    all (a bug); a group whose first call is [n, "untaken"] is not taken up (TAKEN) until `gate` is set."""
    groups, gate = [], Event()

    def group(front_end: int, key: str, calls: list) -> GroupItems:
        assert front_end == os.getpid()  # whose connections the calls' numbers are: the front-end's, sent once a group
        groups.append((key, [call[0] for call in calls]))
        return GroupItems(answers(calls), None)

    def answers(calls: list):
        if calls[0][1:] == ["untaken"]:
            gate.wait(10)
        yield TAKEN
        held = []
        for position, (number, *how) in enumerate(calls):
            if how == ["gated"]:
                held.append((position, number))
            elif how == ["fail"]:
                raise Unavailable("the model process is stopping")
            elif how == ["garbled"]:
                yield "garbled"
            elif how == ["dropped"]:
                continue
            elif number < 0:
                yield [position, ["InvalidInput", f"{number} is negative", 400]]
            else:
                yield [position, None, number * 2]
        if held:
            gate.wait(10)
        for position, number in held:
            yield [position, None, number * 2]

    server = ChannelServer(str(tmp_path / "models.sock"), {"group": group}, LIMIT)
    server.start()
    client = HubChannelClient(server.path, max_call=LIMIT)
    client.start()
    poll(lambda: client.connected, 10, "the client did not connect")
    yield Groups(client, "group"), groups, gate
    server.drain(1)


def call_together(groups: Groups, calls: list, key=("a",), size: int = 8) -> list[gevent.Greenlet]:
    """`calls`, each from a greenlet of its own, all made in one turn of the hub."""
    return [gevent.spawn(groups.call, key, call, size) for call in calls]


def test_calls_made_in_one_turn_cross_as_one_call_and_each_gets_its_own_answer(channel):
    groups, seen, _ = channel
    callers = call_together(groups, [[n] for n in range(5)])
    gevent.joinall(callers, timeout=10, raise_error=True)
    assert [caller.value for caller in callers] == [[n * 2] for n in range(5)]
    assert seen == [("a", [0, 1, 2, 3, 4])]


def test_calls_for_another_key_or_a_later_turn_go_in_calls_of_their_own(channel):
    groups, seen, _ = channel
    gevent.joinall(call_together(groups, [[1], [2]]) + call_together(groups, [[3]], key=("b",)), timeout=10,
                   raise_error=True)
    assert groups.call(("a",), [4], 8) == [8]
    assert sorted(seen) == [("a", [1, 2]), ("a", [4]), ("b", [3])]


def test_a_refused_call_fails_alone(channel):
    groups, _, _ = channel
    callers = call_together(groups, [[1], [-1], [2]])
    gevent.joinall(callers, timeout=10)
    assert callers[0].value == [2] and callers[2].value == [4]
    assert isinstance(callers[1].exception, InvalidInput) and str(callers[1].exception) == "-1 is negative"


def test_each_call_is_answered_as_its_item_comes_not_when_its_group_is_done(channel):
    groups, seen, gate = channel
    slow, fast = call_together(groups, [[1, "gated"], [2]])
    poll(lambda: fast.ready(), 10, "the fast call waited for the slow one")
    assert fast.value == [4] and not slow.ready() and seen == [("a", [1, 2])]
    gate.set()
    assert slow.get(timeout=10) == [2]


def test_calls_wait_to_go_together_while_the_group_before_them_is_not_taken_up(channel):
    """The calls of later turns join one group, sent once the model process takes up the one before it;
    a large call goes at once, and a full group does not wait."""
    groups, seen, gate = channel
    first = gevent.spawn(groups.call, ("a",), [1, "untaken"], 8)
    poll(lambda: seen, 10, "the first group was not sent")
    later = [gevent.spawn(groups.call, ("a",), [2], 8)]
    gevent.idle()  # the next call in a later turn
    later.append(gevent.spawn(groups.call, ("a",), [3], 8))
    large = gevent.spawn(groups.call, ("a",), [4], MOST_BYTES)
    assert large.get(timeout=10) == [8]
    filling = call_together(groups, [[n] for n in range(10, 8 + MOST_CALLS)])  # the waiting group is full
    assert [caller.get(timeout=10) for caller in later + filling] == [[n * 2] for n in (2, 3, *range(10, 8 + MOST_CALLS))]
    assert seen == [("a", [1]), ("a", [4]), ("a", [2, 3, *range(10, 8 + MOST_CALLS)])] and not first.ready()
    gate.set()
    assert first.get(timeout=10) == [2]


def test_a_call_whose_client_closed_while_its_group_waited_is_not_sent(channel):
    """Two calls wait in a group behind one not yet taken up; the first one's client hangs up meanwhile: the
    group goes without it, and its caller hears Cancelled (499), the other its answer."""
    groups, seen, gate = channel
    first = gevent.spawn(groups.call, ("a",), [1, "untaken"], 8)
    poll(lambda: seen, 10, "the first group was not sent")
    leaving, staying = Client(), Client()
    waiting = [gevent.spawn(groups.call, ("a",), [n], 8, client) for n, client in ((2, leaving), (3, staying))]
    gevent.idle()
    leaving.close()
    gate.set()
    with pytest.raises(Cancelled) as told:
        waiting[0].get(timeout=10)
    assert told.value.status == 499
    assert waiting[1].get(timeout=10) == [6] and first.get(timeout=10) == [2]
    assert seen == [("a", [1]), ("a", [3])]


def test_a_group_holds_at_most_its_bound_of_calls_and_a_large_call_goes_alone(channel):
    groups, seen, _ = channel
    gevent.joinall(call_together(groups, [[n] for n in range(MOST_CALLS + 1)]), timeout=10, raise_error=True)
    assert [len(numbers) for _, numbers in seen] == [MOST_CALLS, 1]
    del seen[:]
    small, large, other = (gevent.spawn(groups.call, ("a",), [n], size) for n, size in ((1, 8), (2, MOST_BYTES), (3, 8)))
    gevent.joinall([small, large, other], timeout=10, raise_error=True)
    assert sorted(numbers for _, numbers in seen) == [[1, 3], [2]]


def test_a_group_past_what_the_model_process_reads_is_sent_again_call_by_call(channel):
    groups, seen, _ = channel
    padding = "x" * (LIMIT // 3)
    callers = call_together(groups, [[n, padding] for n in range(3)])
    gevent.joinall(callers, timeout=10, raise_error=True)
    assert [caller.value for caller in callers] == [[0], [2], [4]]
    assert sorted(numbers for _, numbers in seen) == [[0], [1], [2]]
    with pytest.raises(PayloadTooLarge):
        groups.call(("a",), [1, "x" * LIMIT], 8)


def test_when_the_whole_call_fails_every_caller_not_yet_answered_hears_why(channel):
    groups, _, _ = channel
    answered, failing, after = call_together(groups, [[1], [2, "fail"], [3]])
    gevent.joinall([answered, failing, after], timeout=10)
    assert answered.value == [2]
    assert all(isinstance(c.exception, Unavailable) and str(c.exception) == "the model process is stopping"
               for c in (failing, after))


def test_a_call_the_model_process_left_unanswered_is_told_so_and_the_others_keep_their_answers(channel):
    groups, _, _ = channel
    answered, dropped = call_together(groups, [[1], [2, "dropped"]])
    gevent.joinall([answered, dropped], timeout=10)
    assert answered.value == [2]
    assert isinstance(dropped.exception, ServeError) and dropped.exception.status == 500 and \
        str(dropped.exception) == "the model process left a call of 'group' unanswered"


def test_an_answer_the_front_end_cannot_read_fails_its_group_with_a_500_and_nobody_waits_for_ever(channel):
    groups, _, _ = channel
    answered, garbled, after = call_together(groups, [[1], [2, "garbled"], [3]])
    gevent.joinall([answered, garbled, after], timeout=10)
    assert answered.value == [2]
    assert all(isinstance(c.exception, ServeError) and c.exception.status == 500 and
               str(c.exception) == "internal error in the server; see its log" for c in (garbled, after))


@pytest.fixture
def model_process(tmp_path):
    """A model process whose group operation yields what `made` holds, in turns: each entry a list of items
    made together, or an Event the operation waits on before the next entry; and a connection to it."""
    made = []

    def group(front_end: int, key: str, calls: list) -> GroupItems:
        return GroupItems(_turns(made), None)

    server = ChannelServer(str(tmp_path / "models.sock"), {"group": group}, LIMIT)
    server.start()
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    connection.settimeout(10)
    connection.connect(server.path)
    yield made, connection, FrameReader(connection, wire.MAX_FRAME)
    connection.close()
    server.drain(1)


def _turns(made: list):
    for entry in made:
        if isinstance(entry, Event):
            entry.wait(10)
        else:
            yield from entry


def test_the_answers_made_in_one_turn_cross_in_one_frame_and_a_later_one_waits_for_none_of_them(model_process):
    made, connection, frames = model_process
    later = Event()
    made += [[TAKEN, [0, None, 0], [1, None, 2]], later, [[2, None, 4]]]
    connection.sendall(wire.pack([7, "group", [os.getpid(), "a", [[0], [1], [2]]]]))
    assert wire.unpack(frames.next()) == [7, wire.ITEMS, [TAKEN, [0, None, 0], [1, None, 2]]]
    later.set()  # only now is the third answer made: the first two did not wait for it
    assert wire.unpack(frames.next()) == [7, wire.ITEMS, [[2, None, 4]]]
    assert wire.unpack(frames.next()) == [7, wire.ANSWER, None]


def test_an_answer_that_cannot_cross_ends_its_group_after_the_answers_made_before_it(model_process):
    made, connection, frames = model_process
    made += [[TAKEN, [0, None, 0], [1, None, object()], [2, None, 4]]]
    connection.sendall(wire.pack([7, "group", [os.getpid(), "a", [[0], [1], [2]]]]))
    assert wire.unpack(frames.next()) == [7, wire.ITEMS, [TAKEN, [0, None, 0]]]
    assert wire.unpack(frames.next()) == [7, wire.ERROR, ["ServeError", "internal error in the server; see its log", 500]]
