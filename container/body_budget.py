"""The bytes of requests one front-end process holds at once (SERVE_MAX_BODIES_SIZE, shared among the
front-end processes, HTTP and gRPC). A request counts once it has arrived whole until its answer is made:
in between it is decoded, sent to the model process, queued and run, a few copies of it at once (not while
its answer is sent: a client that never reads its answer must not hold up everyone else's requests).

Two lines share the budget. Small requests (small inferences: at most a sixteenth of an eighth of the
budget each) have that eighth; the others have the rest. In each, a request that does not fit waits for
those before it to be answered, first come first served, so a stream of smaller requests never starves a
large one; one larger than its line's room goes alone. One without a body (a health check) holds nothing
and never waits, even behind small ones that fill their line. With one line, a health check that came
behind a large request waiting for room waited as long as it did (a probe with a 2 s deadline failed); and
a line of small requests alone is what lets them pass without starving the large ones.

It counts a request once it has arrived, not from its head: counted from its head (its body then waiting
unread, in the sockets), a client that sent heads of large bodies and then their bytes at the slowest rate
allowed (SERVE_MIN_BODY_RATE) held the room of every other client for minutes. A body being read is bounded
by the rules on one request (size, rate), as a gRPC message, which grpcio reads whole before the server
sees it, is by gRPC's.

Without it, 400 connections each sending 5.5 MiB bodies (within SAGEMAKER_MAX_PAYLOAD_IN_MB) took 7.7 GiB
of the machine's memory over HTTP, the model process 2.1 GiB of it (bench/flood.py). One budget serves both
kinds of process: the HTTP ones wait on gevent, the gRPC ones on asyncio."""

import asyncio
import logging
from collections import deque
from typing import Awaitable

from gevent.event import Event

from container.errors import Unavailable

log = logging.getLogger(__name__)
SMALL_SHARE = 8  # an eighth of the budget is the small requests' line ...
SMALL_PART = 16  # ... and a request of at most a sixteenth of that is small


class BodyBudget:
    def __init__(self, capacity: int):
        small = capacity // SMALL_SHARE
        self.small_most = small // SMALL_PART  # the largest small request, in bytes
        self._large, self._small = _Line(capacity - small), _Line(small)

    @property
    def used(self) -> int:
        return self._large.used + self._small.used

    def take(self, size: int, timeout: float) -> bool:
        """Count `size` bytes, waiting (a greenlet) up to `timeout` seconds for them to fit; False if they never did."""
        return self._line(size).take(size, timeout)

    def take_async(self, size: int, timeout: float) -> Awaitable[bool]:
        """`take`, waiting as an asyncio task."""
        return self._line(size).take_async(size, timeout)

    def give(self, size: int) -> None:
        """`size` bytes counted by `take` are no longer held."""
        self._line(size).give(size)

    def _line(self, size: int) -> "_Line":
        return self._small if size <= self.small_most else self._large


class _Line:
    """Requests that take turns for room, first come first served (BodyBudget's methods, in one line)."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.used = 0
        self._waiting: deque = deque()  # (size, event) in the order they came

    def take(self, size: int, timeout: float) -> bool:
        if self._fits_first(size):
            return True
        turn = self._queue(size, Event())
        try:
            admitted = turn[1].wait(timeout)
        except BaseException:  # killed while waiting
            self._leave(turn)
            raise
        if not admitted:
            self._leave(turn)
        return admitted

    async def take_async(self, size: int, timeout: float) -> bool:
        if self._fits_first(size):
            return True
        turn = self._queue(size, asyncio.Event())
        try:
            await asyncio.wait_for(turn[1].wait(), timeout)
        except asyncio.TimeoutError:
            if not turn[1].is_set():  # (let in as the wait ended: it keeps its place)
                self._leave(turn)
                return False
        except BaseException:  # cancelled while waiting: its call ended
            self._leave(turn)
            raise
        return True

    def give(self, size: int) -> None:
        self.used -= size
        self._admit()

    def _fits_first(self, size: int) -> bool:
        """Whether `size` is let in at once: it fits and none waits before it, or it holds nothing (a request
        without a body, a health check, never waits, even behind small ones that fill their line)."""
        if size and (self._waiting or not self._fits(size)):
            return False
        self.used += size
        return True

    def _queue(self, size: int, event) -> tuple:
        turn = (size, event)
        self._waiting.append(turn)
        log.info("request waits for room", extra={"fields": {"bytes": size, "held": self.used, "ahead": len(self._waiting) - 1}})
        return turn

    def _leave(self, turn: tuple) -> None:
        """A request that stopped waiting: out of the line, or, let in meanwhile, its bytes given back."""
        if turn[1].is_set():
            self.give(turn[0])
        else:
            self._waiting.remove(turn)
            self._admit()  # those behind it may fit now

    def _fits(self, size: int) -> bool:
        return self.used + size <= self.capacity or not self.used

    def _admit(self) -> None:
        while self._waiting and self._fits(self._waiting[0][0]):
            size, admitted = self._waiting.popleft()
            self.used += size
            admitted.set()


def no_room(timeout: float) -> Unavailable:
    return Unavailable(f"the server holds as many requests as it may (SERVE_MAX_BODIES_SIZE), and this one found no "
                       f"room within {timeout} s; retry")
