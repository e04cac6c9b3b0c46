"""Direct execution: each request runs as it comes on one of the model's instance threads (real OS
threads), waited on without blocking the gevent hub — or, for a model whose every recent execution
was shorter than a thread hand-off is worth, on the hub itself."""

import time
from collections import deque

from gevent.event import Event

from container.models.statistics import Phases, Statistics
from container.scheduling.base import Scheduler
from container.scheduling.instances import Instances
from container.scheduling.job import Job, call, on_thread, run_batch
from container.scheduling.recovery import Recover, execute

# Executions a model is judged on before it may run inline, and while it does.
INLINE_WINDOW = 16


class DirectScheduler(Scheduler):
    def __init__(self, model_name: str, instances: int = 1, recover: Recover | None = None, inline_below_ns: int = 0):
        """`inline_below_ns`: run on the hub while each of the latest INLINE_WINDOW executions took less
        (0: never). A thread hand-off costs ~50 µs of CPU, more than a tiny model's whole execution, and
        the hub — every other request, /ping — waits no longer than this for one inline execution."""
        super().__init__()
        self.model_name = model_name
        self._instances = instances
        self._recover = recover
        self._threads = Instances(instances)
        self._submitted = 0  # requests handed to the pool and not yet answered
        self._inline_below_ns = inline_below_ns
        self._recent: deque[int] = deque(maxlen=INLINE_WINDOW)  # the latest executions' costs (see infer)
        self._finished = Event()  # set when a request on the threads finishes

    def infer(self, job: Job) -> tuple[dict, Phases]:
        inline = self._inline()
        # The requests on the threads finish first, as an instance runs one request at a time (without
        # this, a moment with none submitted never comes under load); each that finishes may also have
        # found the model too slow for the loop, and then this request goes to a thread after all.
        while inline and self._submitted:
            self._finished.clear()
            self._finished.wait()
            inline = self._inline()
        execute = on_thread if inline else self._apply
        phases, (outputs,) = self._one(lambda jobs: execute(run_batch, (jobs,), job.submitted), job)
        # Inline, the wall time is what the loop waited. On a thread it also holds waits for the GIL the
        # loop keeps, and a model judged by it would look slow and never come back: there, CPU time.
        self._recent.append(phases.input_ns + phases.infer_ns + phases.output_ns if inline else phases.cpu_ns)
        job.statistics.record_execution(job.items, phases)
        return outputs, phases

    def _inline(self) -> bool:
        recent = self._recent
        return len(recent) == INLINE_WINDOW and max(recent) < self._inline_below_ns

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
