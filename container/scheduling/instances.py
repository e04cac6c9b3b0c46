"""A model's execution threads: real OS threads, one per instance, fed from one native queue, and
answering through one async watcher of the event loop that hands back every result finished since it
last ran (and every answer a call posted on its way: `post`). gevent's ThreadPool makes a watcher, a
result object and a greenlet hand-off per call; here a call costs a queue put and a waiter, and a burst
of finished batches one wake-up of the loop.

A call still in the queue when its request is cancelled is withdrawn: whichever of a thread and the
cancellation takes the call's one entry first (a list's `pop`, atomic under the GIL) has it."""

import _thread
import functools
from collections import deque
from queue import SimpleQueue

from gevent import get_hub
from gevent.hub import Waiter

from container.errors import Cancelled
from container.inference import Cancellable

_STOP = object()


class Instances:
    """`apply(fn, args)` runs `fn(*args)` on one of `count` threads and returns (or raises) what it
    did, blocking only the calling greenlet. Create it on the event loop's thread."""

    def __init__(self, count: int):
        self._tasks = SimpleQueue()  # blocks a native thread
        self._done: deque = deque()  # (function, args, whether a call ended), to run on the loop
        self._waiting = 0  # calls not yet answered: while there are any, the watcher keeps the loop alive
        self._wake = get_hub().loop.async_()
        self._wake.ref = False
        self._wake.start(self._hand_back)
        self._count = count
        for _ in range(count):
            _thread.start_new_thread(self._work, ())

    def apply(self, fn, args: tuple = (), request: Cancellable | None = None):
        """`request`: the one request the call runs for: cancelled while the call waits for a thread, the
        call is withdrawn (Cancelled raised here at once: its caller lets go of what it holds) and no thread
        runs it."""
        waiter = Waiter()
        if not self._waiting:
            self._wake.ref = True
        self._waiting += 1
        task = [(fn, args, waiter)]
        self._tasks.put(task)
        if request is not None:
            request.when_cancelled(functools.partial(self._withdraw, task))
        return waiter.get()

    def _withdraw(self, task: list) -> None:
        """On the loop (a cancellation): the call, unless a thread has taken it, answered Cancelled."""
        try:
            _, _, waiter = task.pop()
        except IndexError:  # a thread has it
            return
        self._done.append((waiter.throw, (Cancelled(),), True))
        self._wake.send()

    def post(self, function, *args) -> None:
        """From inside a call on a thread: `function(*args)` on the loop, soon (a call that answers
        several requests hands each back as it is done)."""
        self._done.append((function, args, False))
        self._wake.send()

    def close(self) -> None:
        """The threads end once the calls queued before this have run."""
        for _ in range(self._count):
            self._tasks.put(_STOP)

    def _work(self) -> None:
        tasks, done, wake = self._tasks, self._done, self._wake
        while (task := tasks.get()) is not _STOP:
            try:
                fn, args, waiter = task.pop()
            except IndexError:  # withdrawn while it waited
                continue
            try:
                done.append((waiter.switch, (fn(*args),), True))
            except BaseException as exc:  # noqa: BLE001 — raised again in the caller's greenlet
                done.append((waiter.throw, (exc,), True))
            del task, fn, args, waiter  # nothing of the call stays alive on this thread while it waits
            wake.send()

    def _hand_back(self) -> None:
        """On the loop: every finished call's result to its greenlet, and every posted answer. A greenlet
        that stopped waiting (killed) is skipped by its waiter."""
        done = self._done
        while done:
            function, args, finished = done.popleft()
            if finished:
                self._waiting -= 1
                if not self._waiting:
                    self._wake.ref = False
            function(*args)
