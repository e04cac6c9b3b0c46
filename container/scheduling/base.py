"""What every scheduler shares: the count of a model's requests on their way, from the moment they
lease the model (core.Lease, before their inputs are decoded) until their answer is encoded, and the
clients answered within the queue delay, who are likely to send again. A batcher waits for both;
counting only queued requests would miss every request still being decoded, and every client whose
next request is still on the wire: a model that costs microseconds answers each request of a burst
before the next one is read, and batches would never form."""

import time
from contextlib import contextmanager
from typing import Callable, Iterator

from gevent.event import Event
from gevent.queue import Queue

from container import kept
from container.inference import Client


class Scheduler:
    def __init__(self, delay: float = 0.0):
        """`delay`: the model's queue delay in seconds (0: none, and no client is expected back)."""
        self.delay = delay
        self.requests = 0  # requests between their lease and their answer (core.Lease counts them)
        self._running = 0  # requests in batches executing now
        self._arrived = Event()  # set when a request is queued or leaves, or an expected client closes
        self._returning: dict[Client, float] = {}  # idle open clients → when answered, the oldest first

    @contextmanager
    def request(self, client: Client | None = None):
        """Count one request on its way for the block (core.Lease counts with the same two calls)."""
        self.request_arrived(client)
        try:
            yield
        finally:
            self.request_left(client)

    def infer_all(self, jobs: list) -> Iterator[tuple[int, object]]:
        """For jobs that arrived together: (position, (outputs, phases) or the exception it failed with) for
        each, as each finishes; each runs as a request of its own would (`infer`). Every scheduler's
        `infer(job)` serves a job alone as `infer_all([job])` would (Core.infer takes it for a request alone)."""
        return as_done(self.infer, jobs)

    def request_arrived(self, client: Client | None = None) -> None:
        self.requests += 1
        if self.delay and client is not None:
            self._returning.pop(client, None)

    def request_left(self, client: Client | None = None) -> None:
        """A request counted in `requests` was answered (or refused): a batcher waiting for it may go on,
        and, within the delay, may wait for its client's next request, once the client has shown that it
        keeps its connection for more (a client that opens one per request leaves the last one open
        until it is collected, and would be waited for in vain)."""
        self.requests -= 1
        if self.delay and client is not None and client.requests > 1:
            self._returning.pop(client, None)  # to the end: the dict stays ordered by time
            self._returning[client] = time.monotonic()
            client.when_closed(self._client_closed)
        self._arrived.set()

    def _client_closed(self, client: Client) -> None:
        if self._returning.pop(client, None) is not None:
            self._arrived.set()

    def _expected_back(self) -> tuple[int, float]:
        """The clients answered within the delay and idle since, and the seconds until the first of
        them is no longer expected."""
        returning, now = self._returning, time.monotonic()
        while returning:
            client, answered = next(iter(returning.items()))
            if answered + self.delay > now:
                return len(returning), answered + self.delay - now
            del returning[client]
        return 0, self.delay

    def _alone(self) -> bool:
        """Whether a request that just arrived may run at once: no delay to spend, or no other request
        for the model on its way and no other client expected back."""
        return not self.delay or (self.requests <= 1 and not self._expected_back()[0])

    def _wait_for_more(self, queued: Callable[[], int], target: int) -> None:
        """Up to the delay, while fewer than `target` requests are queued and others are coming: on
        their way (parsed but not queued, or answered but not yet sent), or expected back. With no
        other request about, a lone request does not wait at all."""
        deadline = time.monotonic() + self.delay
        while (waiting := queued()) < target:
            back, expires = self._expected_back()
            remaining = deadline - time.monotonic()
            if self.requests - waiting - self._running + back <= 0 or remaining <= 0:
                return
            self._arrived.clear()
            self._arrived.wait(min(remaining, expires))

    def sequences_active(self) -> int:
        """Sequences holding state (only the sequence batcher has any)."""
        return 0


def preferred_sizes(sizes, max_batch_size: int) -> list[int]:
    """A batcher's preferred batch sizes, ascending. `[max_batch_size]` alone (what Triton's normalised
    config holds where the config gives none) cuts no batch, which is never larger: left out, so that
    the batcher takes each batch as it is, as with none."""
    preferred = sorted(sizes)
    return [] if preferred == [max_batch_size] else preferred


def as_done(function: Callable, items: list) -> Iterator[tuple[int, object]]:
    """(position, `function(item)` or the Exception it raised) for each of `items`, as each returns: each
    called in a greenlet of its own, so that they wait for what they wait for together."""
    if len(items) == 1:
        yield 0, outcome(function, items[0])
        return
    done = Queue()
    for position, item in enumerate(items):
        kept.spawn(_put_outcome, done, position, function, item)
    for _ in items:
        yield done.get()


def _put_outcome(done: Queue, position: int, function: Callable, item) -> None:
    done.put((position, outcome(function, item)))


def outcome(function: Callable, *args):
    """`function(*args)`, or the Exception it raised."""
    try:
        return function(*args)
    except Exception as exc:
        return exc
