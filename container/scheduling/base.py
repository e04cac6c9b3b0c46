"""What every scheduler shares: the count of a model's requests on their way, from the moment they
lease the model (core.Lease, before their inputs are decoded) until their answer is encoded. The
dynamic batcher waits for them; counting only queued requests would miss every request still being
decoded, and batches would never form."""

import time
from contextlib import contextmanager
from typing import Callable

from gevent.event import Event


class Scheduler:
    def __init__(self):
        self.requests = 0  # requests between their lease and their answer (core.Lease counts them)
        self._running = 0  # requests in batches executing now
        self._arrived = Event()  # set when a request is queued or leaves

    @contextmanager
    def request(self):
        """Count one request on its way for the block (core.Lease counts with the same two calls)."""
        self.request_arrived()
        try:
            yield
        finally:
            self.request_left()

    def request_arrived(self) -> None:
        self.requests += 1

    def request_left(self) -> None:
        """A request counted in `requests` was answered (or refused): a batcher waiting for it may go on."""
        self.requests -= 1
        self._arrived.set()

    def _wait_for_more(self, queued: Callable[[], int], target: int, delay: float) -> None:
        """Up to `delay` seconds, while fewer than `target` requests are queued and others for the
        model are on their way (parsed but not queued, or answered but not yet sent: their clients
        come back). With no other request about, a lone request does not wait at all."""
        deadline = time.monotonic() + delay
        while (queued() < target and self.requests > queued() + self._running
               and (remaining := deadline - time.monotonic()) > 0):
            self._arrived.clear()
            self._arrived.wait(remaining)

    def sequences_active(self) -> int:
        """Sequences holding state (only the sequence batcher has any)."""
        return 0
