"""A front-end's end of the channel, on its asyncio loop: one connection to the model process, many
calls in flight on it, each answered by id. While the model process is away (it died, gunicorn is
starting a new one), calls fail at once with Unavailable and the client keeps trying to connect. When the
front-end stops, it refuses new calls while those under way finish (`refuse`, `settled`)."""

import asyncio
import itertools
import logging
from typing import Callable

from container.channel import CONNECT_RETRY, blob_prefix, wire
from container.channel.blobs import Blobs
from container.errors import Unavailable

log = logging.getLogger(__name__)
# Settling at a stop: done once nothing has been under way, and nothing refused, for _QUIET seconds, or once
# nothing has been under way for _LINGER (clients that retry at once would never leave a quiet moment).
_QUIET, _LINGER = 0.1, 1.0


class ChannelClient:
    def __init__(self, path: str, max_call: int = wire.MAX_FRAME):
        """`max_call`: the largest call the model process reads (`channel.max_call`)."""
        self.path, self.max_call = path, max_call
        self.blobs = Blobs(blob_prefix(path))
        self._ids = itertools.count()
        self._pending: dict[int, asyncio.Future | Callable] = {}  # by call id: a call's answer, a stream's frames
        self._writer: asyncio.StreamWriter | None = None
        self._connected = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._refusing: str | None = None
        self._last_refused = 0.0

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._keep_connected())

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
        if self._writer is not None:
            self._writer.close()

    @property
    def connected(self) -> bool:
        return self._connected.is_set()

    def refuse(self, why: str) -> None:
        """From now on a call fails at once with Unavailable(`why`); the calls under way go on."""
        self._refusing = why

    async def settled(self, timeout: float) -> bool:
        """Whether, within `timeout`, the calls under way have been answered and the calls that were waiting in
        the front-end's queues refused (gRPC's own stop would cancel those, where a refusal says retry)."""
        loop = asyncio.get_running_loop()
        deadline, idle_since = loop.time() + timeout, None
        while (now := loop.time()) < deadline:
            idle_since = None if self._pending else (idle_since or now)
            if idle_since is not None and (now - max(idle_since, self._last_refused) >= _QUIET or now - idle_since >= _LINGER):
                return True
            await asyncio.sleep(_QUIET / 4)
        return False

    def _refused(self) -> Unavailable:
        self._last_refused = asyncio.get_running_loop().time()
        return Unavailable(self._refusing)

    async def wait_connected(self, timeout: float | None) -> bool:
        """Whether the model process is reached within `timeout` seconds (None: however long it takes)."""
        try:
            await asyncio.wait_for(self._connected.wait(), timeout)
        except TimeoutError:
            return False
        return True

    async def call(self, op: str, *args):
        """The model process's answer to `op(*args)`; its error raised here as the same class."""
        writer = self._open_writer()
        call_id = next(self._ids)
        future = asyncio.get_running_loop().create_future()
        self._pending[call_id] = future
        try:
            writer.write(wire.pack([call_id, op, list(args)], self.blobs, self.max_call))
            await writer.drain()
            failed, result = await future
        except OSError:  # the model process went away while the call was being written
            raise Unavailable("the model process ended during the request; retry") from None
        finally:
            self._pending.pop(call_id, None)
        if failed:
            raise wire.error_from(*result)
        return result

    async def stream(self, op: str, *args):
        """The items `op(*args)` streams, each as the model process sends it; its error raised here."""
        frames: asyncio.Queue = asyncio.Queue()
        call_id = self.start_stream(op, list(args), lambda kind, value: frames.put_nowait((kind, value)))
        ended = False
        try:
            while (frame := await frames.get())[0] in (wire.ITEM, wire.ITEMS):
                if frame[0] == wire.ITEMS:
                    for item in frame[1]:
                        yield item
                else:
                    yield frame[1]
            ended = True
        finally:
            if not ended:  # the caller stopped reading (its client went away): the model process stops too
                self.cancel(call_id)
        if frame[0] == wire.ERROR:
            raise wire.error_from(*frame[1])

    def start_stream(self, op: str, args: list, heard: Callable[[int, object], None]) -> int:
        """The stream of `op(*args)`, each frame handed to `heard(kind, value)` as the connection's reader
        gets it: each item frame (wire.ITEM, wire.ITEMS), then once its end (wire.ANSWER, or wire.ERROR with
        the error's [class, message, status], a lost connection's too); then it is heard no more. A group of
        calls takes its frames so, with no task, queue or generator between (channel/groups.py). Returns the
        stream's id, as `cancel` takes it; raises what sending raises (Unavailable, PayloadTooLarge)."""
        writer = self._open_writer()
        call_id = next(self._ids)
        frame = wire.pack([call_id, op, args], self.blobs, self.max_call)
        self._pending[call_id] = heard
        writer.write(frame)  # not drained: what crosses is bounded by the calls' own budgets (body_budget.py)
        return call_id

    def _open_writer(self) -> asyncio.StreamWriter:
        """The connection to write a call to. One the model process closed (it died) is closing before the
        task reading it has learned so: uvloop's transport then raises RuntimeError at a write."""
        if self._refusing is not None:
            raise self._refused()
        writer = self._writer
        if writer is None or writer.is_closing():
            raise Unavailable("the model process is not running yet, or is being restarted; retry")
        return writer

    def cancel(self, call_id: int, position: int | None = None) -> None:
        """Stop the stream `call_id` in the model process, and hear no more of it; with a `position`, only
        that call of a group operation's stream (groups.GroupItems.cancel)."""
        if position is None:
            self._pending.pop(call_id, None)
        writer = self._writer
        if writer is not None and not writer.is_closing():
            writer.write(wire.pack([next(self._ids), wire.CANCEL, [call_id] if position is None else [call_id, position]]))

    async def _keep_connected(self) -> None:
        while True:
            try:
                reader, writer = await asyncio.open_unix_connection(self.path, limit=1 << 20)
            except OSError:
                await asyncio.sleep(CONNECT_RETRY)
                continue
            self._writer = writer
            self._connected.set()
            log.info("connected to the model process", extra={"fields": {"channel": self.path}})
            try:
                await self._read_answers(reader)
            except (asyncio.IncompleteReadError, ConnectionResetError):  # the model process has closed its end
                self.blobs.remove_untaken()  # what it had not read by then it never will
            except OSError:
                pass
            finally:
                self._writer = None
                self._connected.clear()
                writer.close()
                self._fail_pending()
            log.warning("lost the model process; reconnecting", extra={"fields": {"channel": self.path}})

    async def _read_answers(self, reader: asyncio.StreamReader) -> None:
        while True:
            (length,) = wire.LENGTH.unpack(await reader.readexactly(wire.LENGTH.size))
            call_id, kind, result = wire.unpack(await reader.readexactly(length), self.blobs)
            waiting = self._pending.get(call_id)
            if isinstance(waiting, asyncio.Future):  # a call
                if not waiting.done():
                    waiting.set_result((kind == wire.ERROR, result))
            elif waiting is not None:  # a stream (`start_stream`)
                if kind in (wire.ANSWER, wire.ERROR):
                    del self._pending[call_id]
                waiting(kind, result)

    def _fail_pending(self) -> None:
        lost = ["Unavailable", "the model process ended during the request; retry", 503]
        for call_id, waiting in list(self._pending.items()):
            if isinstance(waiting, asyncio.Future):
                if not waiting.done():
                    waiting.set_result((True, lost))
            else:
                del self._pending[call_id]
                waiting(wire.ERROR, lost)
