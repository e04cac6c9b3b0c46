"""Greenlets kept for the next piece of work, each parked once its work is done (up to `keep` of them)
rather than ended. CPython 3.11 gives every new greenlet a frame stack of its own, 16 KiB mapped at its
first call and unmapped when it ends: a greenlet per call cost the model process a mmap, a munmap and
their page faults on every call (the channel's answerers), a front-end as much on every group it sends
(channel/groups.py), and the model process once more for each request of a group that waited apart
(`spawn`): 18% of its time with a batching model."""

from typing import Callable

import gevent

KEEP_SHARED = 256  # the hub's greenlets kept for `spawn`: about the most requests a group brings at once


class KeptGreenlets:
    def __init__(self, work: Callable, keep: int):
        """`work(*args)`: what each greenlet runs for each `start(*args)`."""
        self._work_on, self._keep = work, keep
        self._idle: list = []  # parked greenlets
        self._hub = gevent.get_hub()

    def start(self, *args) -> None:
        """`work(*args)` in a greenlet of its own, which starts once the hub runs its callbacks."""
        if self._idle:
            self._hub.loop.run_callback(self._idle.pop().switch, args)
        else:
            gevent.spawn_raw(self._work, args)

    def close(self) -> None:
        """End the parked ones (a parked greenlet is never collected)."""
        idle, self._idle, self._keep = self._idle, [], 0
        for parked in idle:
            self._hub.loop.run_callback(parked.throw)  # GreenletExit, from the hub, which it returns to

    def _work(self, args: tuple) -> None:
        while True:
            self._work_on(*args)
            if len(self._idle) >= self._keep:
                return
            self._idle.append(gevent.getcurrent())
            args = self._hub.switch()  # parked until `start` hands it the next work


_shared: dict = {}  # hub → its KeptGreenlets for `spawn` (the model process has one hub; a thread's own would differ)


def spawn(function: Callable, *args) -> None:
    """`function(*args)` in one of the hub's shared kept greenlets: for what waits once for each request
    or group (scheduling/base.py's as_done: the requests of a group for a model too slow for the event loop,
    or with a queue timeout to wait out; the takers of a group of handler requests, scheduling/direct.py),
    where a greenlet that ends would map and unmap a frame stack each time. Never for a greenlet that
    anything may kill or wait on later: by then it may be running other work."""
    hub = gevent.get_hub()
    kept = _shared.get(hub)
    if kept is None:
        kept = _shared[hub] = KeptGreenlets(_call, KEEP_SHARED)
    kept.start(function, args)


def _call(function: Callable, args: tuple) -> None:
    function(*args)
