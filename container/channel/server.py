"""The model process's end of the channel: a Unix socket served on the gevent hub. Each call runs in a
greenlet of its own, so calls from one front-end overlap as HTTP requests do; answers go back in the
order they finish. `drain()` refuses new calls and waits for those under way (SIGTERM)."""

import logging
import os
import socket
from typing import Callable

from gevent.lock import Semaphore
from gevent.pool import Group
from gevent.server import StreamServer

from container.channel import blob_prefix, wire
from container.channel.blobs import Blobs
from container.errors import ServeError, Unavailable

log = logging.getLogger(__name__)
_RECEIVE = 256 << 10


class ChannelServer:
    def __init__(self, path: str, operations: dict[str, Callable], max_frame: int):
        """`operations`: op name → the function a call runs with its arguments; `max_frame`: the largest
        call a front-end may send (a request body's limit, and room for its description)."""
        self.path, self.operations, self.max_frame = path, operations, max_frame
        self.blobs = Blobs(blob_prefix(path))
        self.calls = Group()
        self.draining = False
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
        self.draining = True
        self._server.close()
        self.calls.join(timeout)

    def _serve(self, sock, _address) -> None:
        lock = Semaphore()
        try:
            while True:
                frame = _receive(sock, self.max_frame)
                if frame is None:
                    return
                self.calls.spawn(self._answer, sock, lock, frame)
        except OSError:
            return
        finally:
            sock.close()

    def _answer(self, sock, lock: Semaphore, frame: memoryview) -> None:
        call_id = None
        try:
            call_id, op, args = wire.unpack(frame, self.blobs)
            if self.draining:
                raise Unavailable("the server is shutting down")
            operation = self.operations.get(op)
            if operation is None:
                raise ServeError(f"the model process has no channel operation {op!r}")
            answer = [call_id, 0, operation(*args)]
        except ServeError as exc:
            answer = [call_id, 1, wire.error_of(exc)]
        except Exception:
            log.exception("channel call failed", extra={"fields": {"call": call_id}})
            answer = [call_id, 1, ["ServeError", "internal error in the model process; see its log", 500]]
        try:
            data = wire.pack(answer, self.blobs)
        except (ServeError, TypeError, ValueError) as exc:
            log.exception("channel answer could not be packed")
            data = wire.pack([call_id, 1, ["ServeError", f"the answer could not cross the channel: {exc}", 500]])
        with lock:
            try:
                sock.sendall(data)
            except OSError:  # the front-end went away; its caller learns that from its own side
                pass


def _receive(sock, max_frame: int) -> memoryview | None:
    """The next frame's body; None at a clean end between frames."""
    head = _read(sock, wire.LENGTH.size, allow_end=True)
    if head is None:
        return None
    (length,) = wire.LENGTH.unpack(head)
    if length > max_frame:
        raise OSError(f"a {length}-byte channel frame is past {max_frame}")
    return _read(sock, length)


def _read(sock, size: int, allow_end: bool = False) -> memoryview | None:
    buffer = bytearray(size)
    view, got = memoryview(buffer), 0
    while got < size:
        count = sock.recv_into(view[got:], min(size - got, _RECEIVE))
        if not count:
            if allow_end and not got:
                return None
            raise OSError("the channel closed inside a frame")
        got += count
    return view
