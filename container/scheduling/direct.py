"""Direct execution: each request runs as it comes on one of the model's instance threads (real OS
threads), waited on without blocking the gevent hub."""

import time

from gevent.threadpool import ThreadPool

from container.models.statistics import Phases, Statistics
from container.scheduling.job import Job, call, on_thread, run_batch


class DirectScheduler:
    def __init__(self, model_name: str, instances: int = 1):
        self.model_name = model_name
        self._threads = ThreadPool(instances)

    def infer(self, job: Job) -> tuple[dict, Phases]:
        phases, (outputs,) = self._threads.apply(on_thread, (run_batch, ([job],), job.submitted))
        job.statistics.record_execution(job.items, phases)
        return outputs, phases

    def run(self, fn, args: tuple, statistics: Statistics) -> tuple[object, Phases]:
        """A handler model's request: `fn(*args)` on an instance thread."""
        phases, result = self._threads.apply(on_thread, (call, (fn, args), time.perf_counter_ns()))
        statistics.record_execution(1, phases)
        return result, phases

    def queue_depth(self) -> int:
        """Requests waiting for an execution thread."""
        return self._threads.task_queue.qsize()

    def sequences_active(self) -> int:
        """Sequences holding state (only the sequence batcher has any)."""
        return 0

    def close(self) -> None:
        self._threads.kill()
