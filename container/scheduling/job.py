"""One inference request as the schedulers see it, and how a batch of them executes."""

import enum
import functools
import itertools
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
from gevent.event import AsyncResult

from container.errors import Cancelled
from container.inference import Cancellable
from container.models.batch_io import BatchIO
from container.models.statistics import Phases, Statistics

_order = itertools.count()


class Stage(enum.Enum):
    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"


@dataclass(eq=False)
class Job(Cancellable):
    backend: object  # the model version that runs it
    statistics: Statistics  # that version's statistics
    inputs: dict[str, np.ndarray]
    outputs: list[str] | None  # None: every output
    items: int  # batch items: the leading dimension when the model batches, else 1
    parameters: dict = field(default_factory=dict)
    submitted: int = field(default_factory=time.perf_counter_ns)
    order: int = field(default_factory=lambda: next(_order))
    stage: Stage = Stage.QUEUED
    delayed: bool = False  # its queue timeout passed with timeout_action DELAY: served after the others
    result: AsyncResult = field(default_factory=AsyncResult)  # (outputs, phases) or the exception
    respond: object = None  # a decoupled model's responses: InferRequest.respond, callable from any thread
    request_id: str = ""  # the client's id for the request, as a python model's request shows it
    batching: BatchIO | None = None  # the model's ragged inputs, batch inputs and batch outputs
    cancelled: bool = False  # its client went away (`cancel`)
    members: list["Job"] | None = None  # a merge's requests (`merged`), which execute in its place
    answered_to: Callable[["Job", object], None] | None = None  # where its answer goes if not to `result` (dynamic.py's groups)
    offset: int = 0  # a part of a merge cut to fill a batch (`cut`): its first member's place in the merge
    _on_cancel: list | None = None
    _key: tuple | None = None  # batch_key's, once made: a queued job is compared at every batch cut

    @property
    def requests(self) -> int:
        """Requests it stands for in its queue: a merge's members, else one."""
        return len(self.members) if self.members else 1

    def batch_key(self) -> tuple:
        """Jobs merge only with jobs for the same version whose inputs agree on all but the batch size (a
        ragged input's shape aside)."""
        if self._key is None:
            if self.batching is not None:
                self._key = id(self.backend), tuple(self.batching.key(n, a) for n, a in sorted(self.inputs.items()))
            else:
                self._key = id(self.backend), tuple([(n, a.dtype, a.shape[1:]) for n, a in sorted(self.inputs.items())])
        return self._key


def merged(members: list[Job]) -> Job:
    """The one job a batcher queues for `members` (jobs of one batch key and priority that came together),
    which execute in its place: cancelled, and so out of its queue, once each of them is."""
    first = members[0]
    joined = Job(first.backend, first.statistics, first.inputs, None, sum(job.items for job in members),
                 first.parameters, submitted=min(job.submitted for job in members), batching=first.batching,
                 members=members, _key=first.batch_key())
    left = functools.partial(_member_left, joined)
    for job in members:
        job.when_cancelled(left)
    return joined


def _member_left(joined: Job) -> None:
    if not joined.cancelled and all(job.cancelled for job in joined.members):
        joined.cancel()


def cut(job: Job, room: int) -> tuple[Job, Job] | None:
    """A queued merge larger than a batch's `room` items as two parts: its first members that fit, to
    join the batch, and the rest, to keep its place in the queue (None: its first member alone does not
    fit). Without cuts, merges of 5 made batches of 5 where 8 were queued (a burst of 32 clients at max
    batch size 8: measured). Each part is answered where the merge would have been, for its own members
    (`answered_to`, `offset`); a part of one member is that member."""
    fit = 0
    for member in job.members:
        room -= member.items
        if room < 0:
            break
        fit += 1
    if not fit:
        return None
    parts = [members[0] if len(members) == 1 else merged(members) for members in (job.members[:fit], job.members[fit:])]
    for part, offset in zip(parts, (job.offset, job.offset + fit), strict=True):
        part.answered_to, part.offset = job.answered_to, offset
    job.settled()  # its parts stand for it from now on
    return parts[0], parts[1]


def run_batch(jobs: list[Job]) -> tuple[Phases, list[dict[str, np.ndarray] | Exception]]:
    """On an execution thread: concatenate the jobs' inputs, execute once, hand each job its slice. A
    backend that takes request lists gets the jobs' requests as they are, and may fail some alone:
    their results are the exceptions. A model with ragged inputs, batch inputs or batch outputs has
    its batch made and cut by batch_io.py. Jobs cancelled by now are not run: their result is Cancelled."""
    if any(job.cancelled for job in jobs):
        return _without_cancelled(jobs)
    phases = Phases()
    backend, batching = jobs[0].backend, jobs[0].batching
    if getattr(backend, "takes_request_lists", False):  # a python model: a response (or error) per request
        return phases, backend.execute_requests(jobs)
    if len(jobs) == 1 and batching is None:
        return phases, [backend.execute(jobs[0].inputs, jobs[0].outputs, phases)]
    started = time.perf_counter_ns()
    requests = [job.inputs for job in jobs]
    if batching is None:
        inputs = {name: np.concatenate([r[name] for r in requests]) for name in requests[0]}
    else:
        inputs = batching.merge(requests)
    concatenated = time.perf_counter_ns()
    wanted = None if any(job.outputs is None for job in jobs) else list(dict.fromkeys(n for job in jobs for n in job.outputs))
    outputs = backend.execute(inputs, wanted, phases)
    phases.input_ns += concatenated - started
    bounds = list(itertools.accumulate((job.items for job in jobs), initial=0))  # numpy's cumsum: 2 µs more
    shares = [{name: array[bounds[i]: bounds[i + 1]] for name, array in outputs.items() if not job.outputs or name in job.outputs}
              for i, job in enumerate(jobs)]
    return phases, shares if batching is None else batching.scatter(outputs, requests, shares)


def _without_cancelled(jobs: list[Job]) -> tuple[Phases, list]:
    """`run_batch` of the jobs not cancelled; none left: Cancelled raised (no execution happened)."""
    gone = [job.cancelled for job in jobs]  # read once: a job may be cancelled meanwhile
    live = [job for job, cancelled in zip(jobs, gone, strict=True) if not cancelled]
    if not live:
        raise Cancelled()
    phases, results = run_batch(live)
    answered = iter(results)
    return phases, [Cancelled() if cancelled else next(answered) for cancelled in gone]


def on_loop(execute, args: tuple, submitted: int):
    """Runs on the event loop (inline.py): `execute(*args)` → (phases, result), with the queue time (from
    submission to here) filled in; an execution that does not split its phases counts as inference."""
    started = time.perf_counter_ns()
    phases, result = execute(*args)
    phases.queue_ns = started - submitted
    if not phases.infer_ns:
        phases.infer_ns = time.perf_counter_ns() - started
    return phases, result


def on_thread(execute, args: tuple, submitted: int):
    """`on_loop` on an execution thread, with the thread's CPU time filled in too, which the inline judge
    reads (a system call each time: 0.6 µs, which an execution on the loop does without)."""
    cpu = time.thread_time_ns()
    phases, result = on_loop(execute, args, submitted)
    phases.cpu_ns = phases.cpu_ns or time.thread_time_ns() - cpu
    return phases, result


def run_jobs(threads, jobs: list[Job]) -> tuple[Phases, list[dict[str, np.ndarray]]]:
    """`run_batch(jobs)` on one of `threads`, waited on from the event loop."""
    return threads.apply(on_thread, (run_batch, (jobs,), min(job.submitted for job in jobs)))


def call(fn, args: tuple) -> tuple[Phases, object]:
    """A plain call (a handler model's request) in the shape `on_thread` expects."""
    return Phases(), fn(*args)
