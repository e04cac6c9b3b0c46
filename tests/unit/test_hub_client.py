"""The channel between an HTTP front-end (channel/hub_client.py) and the model process (channel/server.py),
both on this test's gevent hub over a real Unix socket: calls are answered by id while others are under
way, errors come back as their class, a call past its deadline or before the model process is reached
is Unavailable, and the server hears which process left (a model process's death is the integration
tests', with real signals)."""

import os
from pathlib import Path

import gevent
import pytest
from gevent import socket
from gevent.event import Event

from container.api.http_channel import FrontEndClients
from container.channel import blob_prefix, wire
from container.channel.blobs import THRESHOLD, large
from container.channel.hub_client import HubChannelClient
from container.channel.server import KEEP_ANSWERERS, ChannelServer
from container.channel.stream import FrameReader, Outbox
from container.errors import InvalidRequest, Unavailable
from tests.builders import poll


@pytest.fixture
def channel(tmp_path):
    release, gone, answerers = Event(), [], []
    operations = {
        "echo": lambda value: value,
        "held": lambda: release.wait(10) and "released",
        "answerer": lambda: answerers.append(gevent.getcurrent()) or release.wait(10),
        "refuse": lambda: (_ for _ in ()).throw(InvalidRequest("input 'x' must have shape [4]")),
    }
    server = ChannelServer(str(tmp_path / "models.sock"), operations, 1 << 20, on_disconnect=gone.append)
    server.start()
    client = HubChannelClient(server.path)
    client.start()
    poll(lambda: client.connected, 10, "the client did not connect")
    yield server, client, release, gone, answerers
    server.drain(1)


def test_calls_are_answered_by_id_while_another_waits(channel):
    _, client, release, _, _ = channel
    held = gevent.spawn(client.call, "held")
    assert [client.call("echo", n) for n in range(3)] == [0, 1, 2]
    release.set()
    assert held.get(timeout=10) == "released"


def test_calls_are_answered_by_greenlets_kept_from_earlier_calls_up_to_a_bound(channel):
    """A greenlet that answered a call answers later ones, so a call costs no new greenlet: as many
    are kept as KEEP_ANSWERERS, and the calls beyond those that were under way at once get new ones.
    Draining ends those kept."""
    server, client, release, _, answerers = channel

    def at_once(count: int) -> set:
        """The greenlets that answered `count` calls held under way together."""
        release.clear()
        del answerers[:]
        calls = [gevent.spawn(client.call, "answerer") for _ in range(count)]
        poll(lambda: len(answerers) == count, 10, "the calls did not all arrive")
        release.set()
        gevent.joinall(calls, timeout=10, raise_error=True)
        return set(answerers)

    first = at_once(1)
    assert at_once(1) == first
    busy = at_once(KEEP_ANSWERERS + 10)
    assert len(busy) == KEEP_ANSWERERS + 10 and first < busy
    assert len(at_once(KEEP_ANSWERERS + 10) & busy) == KEEP_ANSWERERS
    server.drain(1)
    poll(lambda: all(answerer.dead for answerer in answerers), 10, "kept greenlets outlived the drain")


def test_a_connection_writes_with_one_greenlet_kept_until_it_closes():
    """Frames sent one after another, each after the last has arrived, are written by the same greenlet,
    parked between them rather than spawned for each; closing the outbox ends it."""
    ours, theirs = socket.socketpair()
    outbox, reader = Outbox(ours), FrameReader(theirs, 1 << 20)
    writers = set()
    for number in range(20):
        outbox.send(wire.pack([number, wire.ANSWER, number]))
        assert wire.unpack(reader.next()) == [number, wire.ANSWER, number]
        writers.add(outbox._writer)
    (writer,) = writers
    outbox.close()
    poll(lambda: writer.dead, 10, "the writer outlived its connection")
    ours.close()
    theirs.close()


def test_frames_larger_than_the_sockets_buffer_arrive_whole_and_in_order():
    """A write the kernel takes in part (past its socket buffer) is finished before the next frames go."""
    ours, theirs = socket.socketpair()
    outbox, reader = Outbox(ours), FrameReader(theirs, 64 << 20)
    messages = [[0, wire.ANSWER, b"a" * (8 << 20)], [1, wire.ANSWER, b"b"], [2, wire.ANSWER, b"c" * (3 << 20)]]
    try:
        for message in messages:
            outbox.send(wire.pack(message))
        assert [wire.unpack(reader.next()) for _ in messages] == messages
    finally:
        outbox.close()
        ours.close()
        theirs.close()


def test_an_error_comes_back_as_its_class_with_its_words(channel):
    _, client, _, _, _ = channel
    with pytest.raises(InvalidRequest, match=r"must have shape \[4\]") as caught:
        client.call("refuse")
    assert caught.value.status == 400


def test_a_call_past_its_deadline_is_unavailable_and_the_channel_serves_on(channel):
    _, client, release, _, _ = channel
    with pytest.raises(Unavailable, match="did not answer within 0.05 s"):
        client.call("held", timeout=0.05)
    release.set()
    assert client.call("echo", "after") == "after"


def test_the_server_hears_which_process_left(channel):
    server, _, _, gone, _ = channel
    peer = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    peer.connect(server.path)
    peer.close()
    poll(lambda: gone == [os.getpid()], 10, "the server did not hear the peer leave")


def test_a_call_before_the_model_process_is_reached_is_unavailable(tmp_path):
    client = HubChannelClient(str(tmp_path / "nobody.sock"))
    client.start()
    with pytest.raises(Unavailable, match="not running yet"):
        client.call("echo", 1)


def test_a_large_call_the_model_process_never_read_is_not_left_in_shared_memory(tmp_path):
    """The model process died with a call's frame unread: nothing will ever take the data the front-end wrote
    beside it, and it stayed in /dev/shm (the master clears it when a model process exits: this was written
    after, or as, the model process died)."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(tmp_path / "models.sock"))
    listener.listen(1)
    listener.settimeout(10)
    client = HubChannelClient(str(tmp_path / "models.sock"))
    client.start()
    peer, _ = listener.accept()
    calling = gevent.spawn(client.call, "echo", large(b"x" * THRESHOLD))
    assert peer.recv(1)  # the frame is on its way, its data in shared memory; then the model process dies
    peer.close()
    with pytest.raises(Unavailable, match="ended during the request"):
        calling.get(timeout=10)
    assert not list(Path("/dev/shm").glob(f"{blob_prefix(str(tmp_path / 'models.sock'))}-{os.getpid()}-*"))
    listener.close()


def test_each_front_end_connection_is_one_client_until_closed():
    clients = FrontEndClients()
    first = clients.get(101, 1, 1)
    assert clients.get(101, 1, 2) is first and first.requests == 2
    assert clients.get(102, 1, 1) is not first  # the same number on another front-end is another connection
    closed = []
    first.when_closed(closed.append)
    clients.close(101, 1)
    assert closed == [first] and clients.get(101, 1, 1) is not first
    other = clients.get(102, 1, 1)
    other.when_closed(closed.append)
    clients.close_all(102)
    assert closed == [first, other]
