"""A front-end's end of the channel on a gevent hub (the HTTP front-ends; client.py is the asyncio one
the gRPC front-end uses): one connection to the model process, many calls in flight on it, each
answered by id. While the model process is away, calls fail at once with Unavailable, and the client
keeps trying to connect; `on_connect` runs after each connection is made."""

import contextlib
import itertools
import logging
from typing import Callable

import gevent
import gevent.queue
from gevent import socket
from gevent.event import AsyncResult

from container.channel import CONNECT_RETRY, blob_prefix, wire
from container.channel.blobs import Blobs
from container.channel.stream import FrameReader, Outbox
from container.errors import Unavailable

log = logging.getLogger(__name__)
_LOST = (True, ["Unavailable", "the model process ended during the request; retry", 503])


class HubChannelClient:
    def __init__(self, path: str, on_connect: Callable[[], None] = lambda: None, max_call: int = wire.MAX_FRAME):
        """`max_call`: the largest call the model process reads (`channel.max_call`)."""
        self.path, self.on_connect, self.max_call = path, on_connect, max_call
        self.blobs = Blobs(blob_prefix(path))
        self._ids = itertools.count()
        self._pending: dict[int, AsyncResult] = {}
        self._outbox: Outbox | None = None

    def start(self) -> None:
        gevent.spawn(self._keep_connected)

    @property
    def connected(self) -> bool:
        return self._outbox is not None

    def call(self, op: str, *args, timeout: float | None = None):
        """The model process's answer to `op(*args)`, its error raised here as the same class; past
        `timeout` seconds without an answer, Unavailable."""
        outbox = self._outbox
        if outbox is None:
            raise Unavailable("the model process is not running yet, or is being restarted; retry")
        call_id = next(self._ids)
        self._pending[call_id] = answer = AsyncResult()
        try:
            outbox.send(wire.pack([call_id, op, list(args)], self.blobs, self.max_call))
            failed, result = answer.get(timeout=timeout)  # a lost model process fails it (`_keep_connected`)
        except gevent.Timeout:
            raise Unavailable(f"the model process did not answer within {timeout} s") from None
        finally:
            self._pending.pop(call_id, None)
        if failed:
            raise wire.error_from(*result)
        return result

    def stream(self, op: str, *args):
        """The items `op(*args)` streams, each as the model process sends it; its error raised here."""
        outbox = self._outbox
        if outbox is None:
            raise Unavailable("the model process is not running yet, or is being restarted; retry")
        call_id = next(self._ids)
        self._pending[call_id] = items = gevent.queue.Queue()
        ended = False
        try:
            outbox.send(wire.pack([call_id, op, list(args)], self.blobs, self.max_call))
            while (frame := items.get())[0] in (wire.ITEM, wire.ITEMS):
                if frame[0] == wire.ITEMS:
                    yield from frame[1]
                else:
                    yield frame[1]
            ended = True
        finally:
            self._pending.pop(call_id, None)
            if not ended and self._outbox is outbox:  # the caller stopped reading (its client left): so does the model process
                outbox.send(wire.pack([next(self._ids), wire.CANCEL, [call_id]]))
        if frame[0] == wire.ERROR:
            raise wire.error_from(*frame[1])

    def _keep_connected(self) -> None:
        while True:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.connect(self.path)
            except OSError:
                sock.close()
                gevent.sleep(CONNECT_RETRY)
                continue
            self._outbox = outbox = Outbox(sock)
            log.info("connected to the model process", extra={"fields": {"channel": self.path}})
            gevent.spawn(self.on_connect)
            try:
                with contextlib.suppress(ConnectionResetError):  # it ended inside a frame, or with calls unread
                    self._read_answers(sock)  # until the model process closes its end
                self.blobs.remove_untaken()  # what it had not read by then it never will
            except (OSError, ValueError):
                pass
            finally:
                self._outbox = None
                outbox.close()
                sock.close()
                for waiting in self._pending.values():
                    if isinstance(waiting, gevent.queue.Queue):  # a stream
                        waiting.put((wire.ERROR, _LOST[1]))
                    else:
                        waiting.set(_LOST)
            log.warning("lost the model process; reconnecting", extra={"fields": {"channel": self.path}})

    def _read_answers(self, sock) -> None:
        frames = FrameReader(sock, wire.MAX_FRAME)
        while (frame := frames.next()) is not None:
            call_id, kind, result = wire.unpack(frame, self.blobs)
            waiting = self._pending.get(call_id)
            if isinstance(waiting, gevent.queue.Queue):
                waiting.put((kind, result))
            elif waiting is not None and not waiting.ready():
                waiting.set((kind == wire.ERROR, result))
