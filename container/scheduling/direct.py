"""Direct execution: each request runs as it comes on one of the model's instance threads (real OS
threads), waited on without blocking the gevent hub — or, for a model whose recent executions were
shorter than a thread hand-off is worth, on the hub itself (inline.py). Requests that arrive together
for a model of worker processes go to its workers in shares, one message a worker (`run_all`)."""

import functools
import itertools
import time
from typing import Iterator

import gevent
from gevent.event import Event
from gevent.queue import Queue

from container.errors import Cancelled, DeviceOutOfMemory, WorkerLost
from container.inference import Cancellable
from container.models.recovery import Recover, execute
from container.models.statistics import Phases, Statistics
from container.scheduling.base import Scheduler, outcome
from container.scheduling.inline import InlineJudge
from container.scheduling.instances import Instances
from container.scheduling.job import Job, call, on_loop, on_thread, run_batch


class DirectScheduler(Scheduler):
    def __init__(self, model_name: str, instances: int = 1, recover: Recover | None = None, inline_below_ns: int = 0):
        """`inline_below_ns`: the longest the hub may wait for one inline execution (InlineJudge)."""
        super().__init__()
        self.model_name = model_name
        self._instances = instances
        self._recover = recover
        self._threads = Instances(instances)
        self._submitted = 0  # requests handed to the pool and not yet answered
        self._gone = 0  # of those, requests of `run_all` cancelled since
        self._judge = InlineJudge(inline_below_ns)
        self._finished = Event()  # set when a request on the threads finishes

    def infer(self, job: Job) -> tuple[dict, Phases]:
        inline = self._judge.fits(job.items)
        # The requests on the threads finish first, as an instance runs one request at a time (without
        # this, a moment with none submitted never comes under load); each that finishes may also have
        # found the model too slow for the loop, and then this request goes to a thread after all.
        while inline and self._submitted:
            self._finished.clear()
            self._finished.wait()
            inline = self._judge.fits(job.items)
        execute = on_loop if inline else functools.partial(self._apply, request=job)
        phases, (outputs,) = self._one(lambda jobs: execute(run_batch, (jobs,), job.submitted), job)
        self._judge.record(job.items, phases, inline)
        job.statistics.record_execution(job.items, phases, inline)
        if isinstance(outputs, Exception):
            raise outputs
        return outputs, phases

    def infer_all(self, jobs: list[Job]) -> Iterator[tuple[int, object]]:
        """Jobs of a python model (but a decoupled one's streams) go to its instances as a handler model's
        requests go to its workers (`run_all`); jobs of a model that runs on the loop run one after another,
        each answered as it finishes: the loop would run them one at a time anyway, and needs no greenlet
        for each."""
        backend = jobs[0].backend
        if hasattr(backend, "execute_each") and all(job.respond is None for job in jobs):
            yield from self.run_all(backend.execute_each, jobs, jobs[0].statistics, [job.items for job in jobs], jobs)
            return
        if len(jobs) == 1 or self._submitted or not self._judge.fits(max(job.items for job in jobs)):
            yield from super().infer_all(jobs)
            return
        for position, job in enumerate(jobs):
            yield position, outcome(self.infer, job)

    def run_all(self, fn, calls: list, statistics: Statistics, items: list[int] | None = None,
                cancellable: list[Cancellable] | None = None) -> Iterator[tuple[int, object]]:
        """Requests that arrived together for a model of worker processes (a handler model's, a python
        model's), in as many shares as the model has instances (a worker each, and one message to it):
        each share is one `fn(its calls, answer)` on an instance thread, which answers each call as it is
        done (`answer(index in the share, result or the exception)`, and False after them for a call the
        worker skipped, which is not counted as an execution). Yields (position, (result, phases)
        or the exception) as each is answered; a call that failed for want of device memory runs again,
        alone, once room is made for it. `items`: each call's batch items, as its execution is counted
        (default: one each); `cancellable`: each call's Job or Ticket: a call cancelled (its client went
        away) stops counting in queue_depth at once, and, cancelled by the time its share begins, is not
        run (Cancelled, and no execution)."""
        answered, retried, left = Queue(), set(), _Left(self)
        for position, request in enumerate(cancellable or ()):
            request.when_cancelled(functools.partial(left.cancelled, position))
        items = items or [1] * len(calls)
        shares = [_Share(positions, answered, statistics, items) for positions in _shares(len(calls), self._instances)]
        self._submitted += len(calls)  # each counts until it is answered (queue_depth)
        pending = len(calls)
        try:
            if len(calls) == 1:
                self._run_share(fn, calls, shares[0], cancellable)  # nothing to answer before it is done: no greenlet
            else:
                for share in shares:
                    gevent.spawn_raw(self._run_share, fn, calls, share, cancellable)
            while pending:
                position, result = answered.get()
                if isinstance(result, DeviceOutOfMemory) and self._recover and position not in retried:
                    retried.add(position)
                    self._recover(result.device, result.requested)
                    self._run_share(fn, calls, _Share([position], answered, statistics, items), cancellable)
                    continue
                pending -= 1
                self._submitted -= 1
                self._finished.set()
                left.answered(position)
                yield position, result
        finally:
            self._submitted -= pending
            left.close()

    def _run_share(self, fn, calls: list, share: "_Share", cancellable: list[Cancellable] | None) -> None:
        """The share's calls through one `fn` on a thread: each answer but the last handed to the loop as
        it comes, the last with the call's own end (one wake-up of the loop for a lone request). Its calls
        cancelled by the time it begins are answered Cancelled, not run; a share of one call cancelled while
        it waits for a thread leaves the queue at once (`Instances.apply`)."""
        last = len(share.positions) - 1

        def answer(index: int, result, ran: bool = True) -> None:
            if index == last:
                share.last = (index, result, time.perf_counter_ns(), ran)
            else:
                self._threads.post(share.answer, index, result, time.perf_counter_ns(), ran)

        def run() -> None:
            share.began = time.perf_counter_ns()
            gone = [cancellable is not None and cancellable[position].cancelled for position in share.positions]
            for index in itertools.compress(range(len(gone)), gone):
                self._threads.post(share.answer, index, Cancelled(), time.perf_counter_ns(), False)
            live = [index for index, out in enumerate(gone) if not out]
            if live:
                fn([calls[share.positions[index]] for index in live], lambda index, *result: answer(live[index], *result))

        lone = cancellable[share.positions[0]] if cancellable and len(share.positions) == 1 else None
        try:
            self._threads.apply(on_thread, (call, (run, ()), share.submitted), lone)
        except Exception as exc:  # the share failed as a whole (or its lone call was withdrawn): each call it had not answered, with it
            share.fail(exc)
        else:
            if share.last is not None:
                share.answer(*share.last)

    def _one(self, attempt, request):
        """One request, recovering from an out-of-memory error as any batch does."""
        [(_, outcome, ok)] = execute(attempt, [request], self._recover)
        if not ok:
            raise outcome
        return outcome

    def _apply(self, function, args: tuple, submitted: int, request: Cancellable):
        self._submitted += 1
        try:
            return self._threads.apply(on_thread, (function, args, submitted), request)
        finally:
            self._submitted -= 1
            self._finished.set()

    def queue_depth(self) -> int:
        """Requests waiting for an execution thread: those submitted beyond one per instance, but those
        cancelled."""
        return max(self._submitted - self._gone - self._instances, 0)

    def close(self) -> None:
        self._threads.close()


class _Left:
    """The calls of one `run_all` cancelled before they were answered, which its scheduler's queue_depth
    no longer counts."""

    def __init__(self, scheduler: DirectScheduler):
        self._scheduler, self._positions, self._answered, self._open = scheduler, set(), set(), True

    def cancelled(self, position: int) -> None:
        if self._open and position not in self._answered and position not in self._positions:
            self._positions.add(position)
            self._scheduler._gone += 1

    def answered(self, position: int) -> None:
        self._answered.add(position)
        if position in self._positions:
            self._positions.discard(position)
            self._scheduler._gone -= 1

    def close(self) -> None:
        self._open = False
        self._scheduler._gone -= len(self._positions)
        self._positions.clear()


class _Share:
    """Calls of a group that one instance thread runs together, each answered as it is done: a call's
    queue time lasts until the share begins or the call before it in the share is done."""

    def __init__(self, positions: list[int], answered: Queue, statistics: Statistics, items: list[int]):
        self.positions, self._answered, self._statistics, self._items = positions, answered, statistics, items
        self.submitted = self.began = time.perf_counter_ns()  # `began`: set by the thread as it begins
        self.last = None  # (index, result, when) of its last call, answered once the thread is done
        self._open = set(positions)

    def answer(self, index: int, result, now: int, ran: bool = True) -> None:
        """On the loop: the share's `index`th call was answered at `now`; `ran`: by the model (not a call
        cancelled before it began)."""
        position = self.positions[index]
        self._open.discard(position)
        phases = Phases(queue_ns=self.began - self.submitted, infer_ns=now - self.began)
        if ran:
            self.began = now
        if ran and not isinstance(result, WorkerLost):  # the model ran, whether or not it raised: an execution, as Triton counts
            self._statistics.record_execution(self._items[position], phases)
        self._answered.put((position, result if isinstance(result, Exception) else (result, phases)))

    def fail(self, exc: Exception) -> None:
        for position in sorted(self._open):
            self._answered.put((position, exc))
        self._open.clear()


def _shares(count: int, instances: int) -> list[list[int]]:
    """`count` positions in at most `instances` runs of consecutive ones, as even as can be."""
    shares = min(count, instances)
    bounds = [count * i // shares for i in range(shares + 1)]
    return [list(range(bounds[i], bounds[i + 1])) for i in range(shares)]
