"""Inference statistics per model version, in the units Triton reports: counts and nanoseconds."""

import time
from dataclasses import dataclass, field

from container.errors import Cancelled, Unavailable

FAILURE_REASONS = ("OTHER", "REJECTED", "BACKEND", "CANCELED")  # Triton's `reason` label of its failure counter


@dataclass
class Duration:
    count: int = 0
    ns: int = 0

    def add(self, ns: int) -> None:
        self.count += 1
        self.ns += ns


@dataclass
class Phases:
    """Where one execution spent its time on the execution thread."""

    queue_ns: int = 0
    input_ns: int = 0
    infer_ns: int = 0
    output_ns: int = 0
    cpu_ns: int = 0  # CPU time of the executing thread: unlike the others, not stretched by waits for the GIL


@dataclass
class BatchStatistics:
    compute_input: Duration = field(default_factory=Duration)
    compute_infer: Duration = field(default_factory=Duration)
    compute_output: Duration = field(default_factory=Duration)


@dataclass
class ResponseStatistics:
    """A decoupled model's responses at one place in their requests' streams (the first, the second, …),
    as Triton counts them: each response's time since the one before it (or since its request began)."""

    compute_infer: Duration = field(default_factory=Duration)
    compute_output: Duration = field(default_factory=Duration)  # not told apart: made with the response, in its worker
    success: Duration = field(default_factory=Duration)
    fail: Duration = field(default_factory=Duration)
    empty_response: Duration = field(default_factory=Duration)  # the final flag alone
    cancel: Duration = field(default_factory=Duration)  # responses carrying the model's CANCELLED error


@dataclass
class Statistics:
    success: Duration = field(default_factory=Duration)
    fail: Duration = field(default_factory=Duration)
    queue: Duration = field(default_factory=Duration)
    compute_input: Duration = field(default_factory=Duration)
    compute_infer: Duration = field(default_factory=Duration)
    compute_output: Duration = field(default_factory=Duration)
    cache_hit: Duration = field(default_factory=Duration)  # requests answered from the response cache: its look-up
    cache_miss: Duration = field(default_factory=Duration)  # requests it did not have: its look-up and keeping theirs
    inference_count: int = 0  # batch items inferred
    execution_count: int = 0  # model executions
    loop_execution_count: int = 0  # those run on the event loop, not on an instance thread (scheduling/inline.py)
    last_inference_ms: int = 0  # wall clock, milliseconds since the epoch
    batches: dict[int, BatchStatistics] = field(default_factory=dict)
    responses: dict[int, ResponseStatistics] = field(default_factory=dict)  # a decoupled model's, by place
    failures: dict[str, int] = field(default_factory=lambda: dict.fromkeys(FAILURE_REASONS, 0))  # `fail`, by reason

    def record_success(self, items: int, total_ns: int, phases: Phases) -> None:
        """One request answered: its items, its own time, and the compute time of the execution it rode."""
        self.success.add(total_ns)
        self.queue.add(phases.queue_ns)
        self.compute_input.add(phases.input_ns)
        self.compute_infer.add(phases.infer_ns)
        self.compute_output.add(phases.output_ns)
        self.inference_count += items
        self.last_inference_ms = time.time_ns() // 1_000_000

    def record_cache_hit(self, items: int, total_ns: int, lookup_ns: int) -> None:
        """One request answered from the response cache, the model not run."""
        self.success.add(total_ns)
        self.cache_hit.add(lookup_ns)
        self.inference_count += items
        self.last_inference_ms = time.time_ns() // 1_000_000

    def record_execution(self, batch_size: int, phases: Phases, on_loop: bool = False) -> None:
        """One model execution, however many requests it carried; `on_loop`: it ran on the event loop."""
        self.execution_count += 1
        self.loop_execution_count += on_loop
        by_batch = self.batches.get(batch_size) or self.batches.setdefault(batch_size, BatchStatistics())
        by_batch.compute_input.add(phases.input_ns)
        by_batch.compute_infer.add(phases.infer_ns)
        by_batch.compute_output.add(phases.output_ns)

    def record_response(self, place: int, outcome, ns: int) -> None:
        """A decoupled model's response at `place` in its request's stream, `ns` after the one before it:
        outputs, the error it carries, or None (the final flag alone)."""
        counts = self.responses.get(place) or self.responses.setdefault(place, ResponseStatistics())
        if outcome is None:
            counts.empty_response.add(ns)
            return
        counts.compute_infer.add(ns)
        if isinstance(outcome, Cancelled):  # the model answered its request's cancellation (TritonError.CANCELLED)
            counts.cancel.add(ns)
            return
        (counts.fail if isinstance(outcome, Exception) else counts.success).add(ns)

    def record_failure(self, total_ns: int, exc: BaseException) -> None:
        """A request that reached its model's scheduler and failed with `exc` (one its signature refused
        never did, and is not counted, as Triton counts none)."""
        self.fail.add(total_ns)
        self.failures[failure_reason(exc)] += 1
        self.last_inference_ms = time.time_ns() // 1_000_000


def failure_reason(exc: BaseException) -> str:
    """Triton's reason for a failed request: CANCELED (by its client, or its caller went away), REJECTED
    by the scheduler (a queue timeout) or the server (stopping), else BACKEND: the model,
    or the execution, failed it."""
    if isinstance(exc, Cancelled) or not isinstance(exc, Exception):
        return "CANCELED"
    return "REJECTED" if isinstance(exc, Unavailable) else "BACKEND"
