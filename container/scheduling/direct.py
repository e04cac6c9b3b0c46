"""Direct execution: each request runs as it comes on one of the model's instance threads (real OS
threads), waited on without blocking the gevent hub."""

import time

from gevent.threadpool import ThreadPool

from container.models.statistics import Phases, Statistics
from container.scheduling.base import Scheduler
from container.scheduling.job import Job, call, on_thread, run_batch
from container.scheduling.recovery import Recover, execute


class DirectScheduler(Scheduler):
    def __init__(self, model_name: str, instances: int = 1, recover: Recover | None = None):
        super().__init__()
        self.model_name = model_name
        self._instances = instances
        self._recover = recover
        self._threads = ThreadPool(instances)
        self._submitted = 0  # requests handed to the pool and not yet answered

    def infer(self, job: Job) -> tuple[dict, Phases]:
        phases, (outputs,) = self._one(lambda jobs: self._apply(run_batch, (jobs,), job.submitted), job)
        job.statistics.record_execution(job.items, phases)
        return outputs, phases

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

    def queue_depth(self) -> int:
        """Requests waiting for an execution thread. Counted here: gevent's pool parks callers on a
        semaphore once every thread is busy, so its task queue stays empty."""
        return max(self._submitted - self._instances, 0)

    def close(self) -> None:
        self._threads.kill()
