"""The model process's end of the channel: a Unix socket served on the gevent hub. Each call runs in a
greenlet of its own (one kept from an earlier call), so calls from one front-end overlap as HTTP requests
do; answers go back in the order they finish. An operation that returns a generator (or a group
operation's items, groups.GroupItems) streams: each item goes back as it is made. `drain()` refuses new
calls and waits for those under way (SIGTERM). A
front-end's connection is heard by pid as it comes (`on_connect`: its memory is measured) and as it ends
(`on_disconnect`: it exited, or died; what the model process kept for it, its HTTP clients, goes)."""

import inspect
import itertools
import logging
import os
import struct
import time
from typing import Callable

import gevent
from gevent import GreenletExit, socket  # socket: the hub's own, whether or not the process is monkey-patched
from gevent.event import Event
from gevent.server import StreamServer

from container.channel import blob_prefix, wire
from container.channel.blobs import Blobs
from container.channel.groups import GroupItems
from container.channel.stream import FrameReader, Outbox
from container.errors import ServeError, Unavailable
from container.kept import KeptGreenlets

log = logging.getLogger(__name__)
# what a request is told that came as the model process stops: it cannot know whether a restart follows
STOPPING = "the model process is stopping (a restart, or the server's shutdown); retry"
_CREDENTIALS = struct.Struct("3i")  # SO_PEERCRED: pid, uid, gid
KEEP_ANSWERERS = 128  # idle greenlets kept for the next calls; past that many, one that finishes ends


class ChannelServer:
    def __init__(self, path: str, operations: dict[str, Callable], max_frame: int,
                 on_connect: Callable[[int], None] = lambda pid: None,
                 on_disconnect: Callable[[int], None] = lambda pid: None):
        """`operations`: op name → the function a call runs with its arguments; `max_frame`: the largest
        call a front-end may send (a request body's limit, and room for its description)."""
        self.path, self.operations, self.max_frame = path, operations, max_frame
        self.on_connect, self.on_disconnect = on_connect, on_disconnect
        self._blob_prefix, self._connections = blob_prefix(path), itertools.count()
        # Calls under way, counted rather than kept in a gevent Group: a raw greenlet per call costs ~7 µs
        # less on the model process's one core, and drain() needs only to know when none is left.
        self._under_way = 0
        self._outboxes: set[Outbox] = set()  # one per connected front-end
        self._none_under_way = Event()
        self._none_under_way.set()
        self.draining = False
        self._answerers = KeptGreenlets(self._answer, KEEP_ANSWERERS)
        if os.path.lexists(path):
            os.unlink(path)  # a socket the last model process left
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(path)
        os.chmod(path, 0o600)  # the server's own user only: a call may load models
        listener.listen(64)
        self._server = StreamServer(listener, self._serve)

    def start(self) -> None:
        self._server.start()

    def drain(self, timeout: float) -> None:
        """Refuse new calls, wait for those under way, then for their answers to be written: the process
        ends next, and an answer still queued would be lost with it."""
        deadline = time.monotonic() + timeout
        self.draining = True
        self._server.close()
        if self._under_way:  # what a stop waits for, said: one that lingers is then explained
            log.info("stopping: waiting for the calls under way", extra={"fields": {"calls": self._under_way}})
        if not self._none_under_way.wait(timeout):
            log.warning("calls still under way at the end of the graceful timeout are abandoned",
                        extra={"fields": {"calls": self._under_way}})
        for outbox in list(self._outboxes):
            outbox.flush(max(0.0, deadline - time.monotonic()))
        self._answerers.close()

    def _serve(self, sock, _address) -> None:
        pid, _, _ = _CREDENTIALS.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _CREDENTIALS.size))
        frames, outbox, streams = FrameReader(sock, self.max_frame), Outbox(sock), {}
        blobs = Blobs(self._blob_prefix, connection=next(self._connections))
        self.on_connect(pid)
        self._outboxes.add(outbox)
        try:
            while (frame := frames.next()) is not None:
                self._under_way += 1
                self._none_under_way.clear()
                self._answerers.start(outbox, blobs, streams, frame)
        except OSError:
            return
        finally:
            self._outboxes.discard(outbox)
            outbox.close()
            sock.close()
            blobs.remove_untaken()  # a front-end killed with large answers on their way
            self.on_disconnect(pid)

    def _answer(self, outbox: Outbox, blobs: Blobs, streams: dict, frame: bytes) -> None:
        try:
            self._respond(outbox, blobs, streams, frame)
        finally:
            self._under_way -= 1
            if not self._under_way:
                self._none_under_way.set()

    def _respond(self, outbox: Outbox, blobs: Blobs, streams: dict, frame: bytes) -> None:
        call_id = None
        try:
            call_id, op, args = wire.unpack(frame, blobs)
            if op == wire.CANCEL:
                _cancel(streams.get(args[0]), *args[1:2])
                return
            if self.draining:
                raise Unavailable(STOPPING)
            operation = self.operations.get(op)
            if operation is None:
                raise ServeError(f"the model process has no channel operation {op!r}")
            result = operation(*args)
            if inspect.isgenerator(result) or isinstance(result, GroupItems):  # a stream: each item as it comes, then the end
                self._stream(outbox, blobs, streams, call_id, result)
                result = None
            answer = [call_id, wire.ANSWER, result]
        except Exception as exc:
            answer = [call_id, wire.ERROR, wire.error_of(exc)]
        if outbox.closed:  # the front-end hung up: nobody would take what packing writes to shared memory
            return
        try:
            data = wire.pack(answer, blobs)
        except (ServeError, TypeError, ValueError) as exc:
            log.exception("channel answer could not be packed")
            data = wire.pack([call_id, 1, ["ServeError", f"the answer could not cross the channel: {exc}", 500]])
        outbox.send(data)

    @staticmethod
    def _stream(outbox: Outbox, blobs: Blobs, streams: dict, call_id: int, items) -> None:
        """Each item as it comes; a group operation's items made in one turn of the hub (the answers of one
        batch, of a group run on the loop) as one frame (`_Together`). The front-end may cancel the stream
        (its client went away: a gRPC call cancelled, a stream ended): then the greenlet making it is killed
        where it waits, and the requests it was waiting for are cancelled (core.infer_all)."""
        streams[call_id] = stream = _Stream(gevent.getcurrent(), items)
        together = _Together(outbox, call_id) if isinstance(items, GroupItems) else None
        try:
            for item in items:
                if outbox.closed:  # nobody reads on: dropped, the items' generator closes, cancelling what it has pending
                    return
                if together is None:
                    outbox.send(wire.pack([call_id, wire.ITEM, item], blobs))
                else:
                    together.add(wire.packed(item, blobs))
        finally:
            if together is not None:
                together.send()  # before the stream's end, or the error it ends with
            stream.done = True
            del streams[call_id]


class _Together:
    """A stream's items made in one turn of the hub, sent as one frame once the turn ends (the greenlet
    making them waits for the next, or the stream ends): each frame costs the front-end a read, an
    unpacking and a wake-up of its stream's reader."""

    __slots__ = ("outbox", "call_id", "_items")

    def __init__(self, outbox: Outbox, call_id: int):
        self.outbox, self.call_id, self._items = outbox, call_id, []

    def add(self, item: bytes) -> None:
        if not self._items:
            gevent.get_hub().loop.run_callback(self.send)
        self._items.append(item)

    def send(self) -> None:
        if self._items and not self.outbox.closed:  # closed: what the items put in shared memory went with it
            self.outbox.send(wire.pack_items(self.call_id, self._items))
        self._items = []


class _Stream:
    __slots__ = ("greenlet", "items", "done")

    def __init__(self, greenlet, items):
        self.greenlet, self.items, self.done = greenlet, items, False


def _cancel(stream: _Stream | None, position: int | None = None) -> None:
    """Kill the greenlet making `stream` from the hub, once this turn's callbacks have run, unless the
    stream has ended by then (its greenlet may be parked for other work, or making another stream). With
    a `position`: only that call of a group operation's stream is cancelled (groups.GroupItems), as its
    other calls are still wanted."""
    if stream is None:
        return
    if position is None:
        gevent.get_hub().loop.run_callback(_kill, stream)
    elif hasattr(stream.items, "cancel"):
        stream.items.cancel(position)


def _kill(stream: _Stream) -> None:
    if not stream.done:
        stream.greenlet.throw(GreenletExit)
