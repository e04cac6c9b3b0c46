"""Direct execution: each request runs as it comes on one of the model's instance threads (real OS
threads), waited on without blocking the gevent hub — or, for a model whose recent executions were
shorter than a thread hand-off is worth, on the hub itself (inline.py)."""

import time
from typing import Iterator

from gevent.event import Event

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
        execute = on_loop if inline else self._apply
        phases, (outputs,) = self._one(lambda jobs: execute(run_batch, (jobs,), job.submitted), job)
        self._judge.record(job.items, phases, inline)
        job.statistics.record_execution(job.items, phases, inline)
        if isinstance(outputs, Exception):
            raise outputs
        return outputs, phases

    def infer_all(self, jobs: list[Job]) -> Iterator[tuple[int, object]]:
        """Jobs of a model that runs on the loop run one after another, each answered as it finishes: the
        loop would run them one at a time anyway, and needs no greenlet for each."""
        if len(jobs) == 1 or self._submitted or not self._judge.fits(max(job.items for job in jobs)):
            yield from super().infer_all(jobs)
            return
        for position, job in enumerate(jobs):
            yield position, outcome(self.infer, job)

    def run(self, fn, args: tuple, statistics: Statistics) -> tuple[object, Phases]:
        """A handler model's request: `fn(*args)` on an instance thread."""
        submitted = time.perf_counter_ns()
        phases, result = self._one(lambda _: self._apply(call, (fn, args), submitted), None)
        statistics.record_execution(1, phases)
        return result, phases

    def _one(self, attempt, request):
        """One request, recovering from an out-of-memory error as any batch does."""
        [(_, outcome, ok)] = execute(attempt, [request], self._recover)
        if not ok:
            raise outcome
        return outcome

    def _apply(self, function, args: tuple, submitted: int):
        self._submitted += 1
        try:
            return self._threads.apply(on_thread, (function, args, submitted))
        finally:
            self._submitted -= 1
            self._finished.set()

    def queue_depth(self) -> int:
        """Requests waiting for an execution thread: those submitted beyond one per instance."""
        return max(self._submitted - self._instances, 0)

    def close(self) -> None:
        self._threads.close()
