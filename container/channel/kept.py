"""Greenlets kept for the next piece of work, each parked once its work is done (up to `keep` of them)
rather than ended. CPython 3.11 gives every new greenlet a frame stack of its own, 16 KiB mapped at its
first call and unmapped when it ends: a greenlet per call cost the model process a mmap, a munmap and
their page faults on every call (the channel's answerers), and a front-end as much on every group it
sends (channel/groups.py)."""

from typing import Callable

import gevent


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
