"""A channel connection's two directions on a gevent hub, each costing a system call per batch of frames
rather than per frame: under load, many calls (or answers) are on their way at once, and one read takes
every frame that has arrived, one write sends every frame made since the last."""

import gevent
from gevent.event import Event

from container.channel.wire import LENGTH

_RECEIVE = 256 << 10  # bytes one read asks for


class FrameReader:
    def __init__(self, sock, max_frame: int):
        self.sock, self.max_frame = sock, max_frame
        self._buffer = bytearray()
        self._start = 0  # where the next frame begins in the buffer

    def next(self) -> bytes | None:
        """The next frame's body; None at a clean end between frames."""
        while True:
            available = len(self._buffer) - self._start
            if available >= LENGTH.size:
                (length,) = LENGTH.unpack_from(self._buffer, self._start)
                if length > self.max_frame:
                    raise OSError(f"a {length}-byte channel frame is past {self.max_frame}")
                end = self._start + LENGTH.size + length
                if len(self._buffer) >= end:
                    frame = bytes(self._buffer[self._start + LENGTH.size:end])
                    self._start = end
                    return frame
            if self._start:
                del self._buffer[:self._start]
                self._start = 0
            data = self.sock.recv(_RECEIVE)
            if not data:
                if self._buffer:
                    raise ConnectionResetError("the channel closed inside a frame")
                return None
            self._buffer += data


class Outbox:
    """Frames to write, sent together by one greenlet: the frames made while it writes go in its next
    write. A frame is whole on the wire, whoever made it. The writer is kept for the connection's life,
    parked while nothing is pending: a greenlet spawned per write cost a frame stack mapped and unmapped
    each time (as channel/server.py's answerers did). `close` ends it."""

    def __init__(self, sock):
        self.sock = sock
        self._pending: list[bytes] = []
        self._hub = gevent.get_hub()
        self._writer = None
        self._parked = self._closed = False
        self._written: Event | None = None  # made by `flush`, set once nothing is left to write

    def send(self, frame: bytes) -> None:
        """Queue `frame`; a peer that went away is learned from the reading side."""
        self._pending.append(frame)
        if self._writer is None:
            self._writer = gevent.spawn_raw(self._write)
        elif self._parked:
            self._parked = False
            self._hub.loop.run_callback(self._writer.switch)

    @property
    def closed(self) -> bool:
        return self._closed

    def flush(self, timeout: float) -> bool:
        """Wait until every frame queued so far is written (or found unwritable), at most `timeout` seconds."""
        if self._writer is None or self._parked or self._writer.dead:
            return True
        self._written = self._written or Event()
        self._written.clear()  # set again by the writer's next pass, which takes every frame queued by now
        return self._written.wait(timeout)

    def close(self) -> None:
        """End the writer once it has nothing left to write (the connection is closing)."""
        self._closed = True
        if self._parked:
            self._parked = False
            self._hub.loop.run_callback(self._writer.throw)  # GreenletExit, from the hub it returns to

    def _write(self) -> None:
        while not self._closed:
            try:
                while self._pending:
                    frames, self._pending = self._pending, []
                    data = frames[0] if len(frames) == 1 else b"".join(frames)
                    sent = self.sock.send(data)  # whole, most often: gevent's sendall first asks the socket its
                    if sent < len(data):  # buffer's size, a system call each write
                        self.sock.sendall(memoryview(data)[sent:])
            except OSError:
                self._pending = []
            if self._written is not None:
                self._written.set()
            if not self._closed:
                self._parked = True
                self._hub.switch()  # until `send` has a frame for it, or `close`
