"""The dynamic batcher: requests queue by priority; whenever an instance thread is free, and the event
loop has handled what it had received, it takes the next batch — the head request plus every queued
request that can merge with it, up to max_batch_size, cut to the largest preferred_batch_size it makes
exactly — so batches form from the queue under load and a lone request never waits. A lone request
of a model fast enough for the loop (inline.py) runs there, once the loop has handled what it had
received and the request is still alone; so does a batch its model's latest batches say is as fast.
max_queue_delay_microseconds is spent waiting for more requests while the queue is short of a
preferred size and other requests for the model are on their way (counted from their headers,
base.py). With preserve_ordering, responses leave in the order the requests arrived.

Requests that arrive together (a front-end's group) and would batch together queue as one merge: one
entry in the queue, one result handed back, and one answer made for them all; at execution its members
run as the requests they are (run_batch), a member cancelled meanwhile left out. A merge larger than
the room a batch has left, or across the preferred size a batch is cut to, is cut there: its first
members join the batch and are answered with it, and the rest keep its place (job.cut); not with
preserve_ordering, which answers a merge whole. Only where nothing tells merged requests apart: no
queue policy that counts a level's entries or times them out."""

import functools
import time
from typing import Iterator

import gevent
from gevent import Timeout
from gevent.lock import Semaphore
from gevent.queue import Queue

from container import kept
from container.errors import Cancelled, QueueTimeout
from container.models.recovery import Recover, execute
from container.models.statistics import Phases
from container.scheduling.base import Scheduler, preferred_sizes
from container.scheduling.inline import InlineJudge
from container.scheduling.instances import Instances
from container.scheduling.job import Job, Stage, merged, on_loop, run_batch, run_jobs
from container.scheduling.queue import JobQueue

GATHER_LIMIT = 0.002  # seconds a free instance waits at most for the event loop to go idle


class DynamicBatcher(Scheduler):
    def __init__(self, model_name: str, config, instances: int = 1, recover: Recover | None = None,
                 inline_below_ns: int = 0):
        batching = config.dynamic_batching
        super().__init__(batching.max_queue_delay_microseconds / 1e6)
        self.model_name = model_name
        self._recover = recover
        self.max_batch_size = config.max_batch_size
        self.preferred = preferred_sizes(batching.preferred_batch_size, self.max_batch_size)
        self.preserve_ordering = batching.preserve_ordering
        self.queue = JobQueue(batching, self._leaves_once_cancelled)
        self._threads = Instances(instances)
        self._judge = InlineJudge(inline_below_ns)  # for lone requests
        self._batch_judge = InlineJudge(inline_below_ns)  # for batches, each judged as one (`_execute`)
        self._free = Semaphore(instances)  # instances not executing a batch
        self._pending: list[int] = []  # with preserve_ordering: orders of unanswered jobs, oldest first
        self._finished: dict[int, tuple] = {}  # with preserve_ordering: order → (job, outcome, ok)
        self._workers = [gevent.spawn(self._dispatch) for _ in range(instances)]

    def infer(self, job: Job) -> tuple[dict, Phases]:
        self.queue.level_of(job)  # a priority outside the levels is refused, queued or not
        if not len(self.queue) and not self.preserve_ordering and self._alone() and self._free.acquire(blocking=False):
            return self._run_now(job)
        timeout = self._enqueue(job)
        self._leaves_once_cancelled(job)
        self._arrived.set()
        return self._wait(job, timeout)

    def infer_all(self, jobs: list[Job]) -> Iterator[tuple[int, object]]:
        """Jobs that arrived together queue together before any of them runs, so that the first batch is
        cut from them all (by priority, then order of arrival), as from requests that came at once; those
        that would batch together at one priority as one merge (`_merged`)."""
        if len(jobs) == 1:
            yield from super().infer_all(jobs)
            return
        answers, unanswered = Queue(), 0
        for positions, job in self._merged(jobs):
            try:
                timeout = self._enqueue(job)
            except Exception as exc:  # a priority outside the levels, or a full queue
                yield from ((position, exc) for position in positions)
                continue
            unanswered += len(positions)
            if timeout is None:  # its answer hands itself over, with no greenlet waiting for it (two switches)
                job.answered_to = functools.partial(_put_answer, answers, positions)
            else:  # it waits out its own timeout
                kept.spawn(_put_waited, answers, positions, self._wait, job, timeout)
            self._leaves_once_cancelled(job)  # only now: one cancelled already is answered at once, where it is heard
        self._arrived.set()
        while unanswered:
            positions, result = answers.get()
            unanswered -= len(positions)
            yield from _members(positions, result)

    def _merged(self, jobs: list[Job]) -> list[tuple[list[int], Job]]:
        """(positions, the job queued for them): those of `jobs` that would batch together and at one
        priority merged, up to max_batch_size items a merge (job.merged); each other one alone."""
        entries, open_merges = [], {}
        merging = not (self.preferred and self.preserve_ordering)  # there a merge could not be cut to a preferred size
        for position, job in enumerate(jobs):
            key = (job.batch_key(), self.queue.level_of(job)) if merging and self.queue.merges(job) else None
            entry = open_merges.get(key) if key is not None else None
            if entry is None or entry[2] + job.items > self.max_batch_size:
                entry = [[], [], 0]
                entries.append(entry)
                if key is not None:
                    open_merges[key] = entry
            entry[0].append(position)
            entry[1].append(job)
            entry[2] += job.items
        return [(positions, members[0] if len(members) == 1 else merged(members)) for positions, members, _ in entries]

    def _enqueue(self, job: Job) -> float | None:
        """Queue `job`; returns its queue timeout in seconds (None: none)."""
        timeout = self.queue.put(job)
        if self.preserve_ordering:
            self._pending.append(job.order)
        return timeout

    def _leaves_once_cancelled(self, job: Job) -> None:
        """Cancelled while it waits in the queue (its client hung up), `job` leaves it at once, so that it holds
        no place in a full one; cancelled already, it leaves now."""
        job.when_cancelled(functools.partial(self._cancelled, job))

    def _cancelled(self, job: Job) -> None:
        if job.stage is Stage.QUEUED:
            self.queue.discard(job)
            self._deliver(job, Cancelled(), ok=False)

    def _wait(self, job: Job, timeout: float | None) -> tuple[dict, Phases]:
        try:
            try:
                return job.result.get(timeout=timeout)
            except Timeout:
                if job.stage is Stage.QUEUED and self.queue.expire(job):
                    raise QueueTimeout("Request timeout expired: the request waited out its queue timeout and was not "
                                       "executed") from None  # Triton's words, then ours
                return job.result.get()
        except BaseException:  # rejected, or the client went away
            if job.stage is Stage.QUEUED:
                self.queue.discard(job)
                self._deliver(job, None, ok=False)
            raise

    def _run_now(self, job: Job) -> tuple[dict, Phases]:
        """A request with an instance free and nothing to wait for runs as a batch of one from its own
        greenlet: through the queue it would cost two more greenlet wake-ups (~100 µs)."""
        job.stage = Stage.RUNNING
        self._running += 1
        try:
            inline = self._judge.fits(job.items) and self._still_alone()
            attempt = (lambda jobs: on_loop(run_batch, (jobs,), job.submitted)) if inline else \
                (lambda jobs: run_jobs(self._threads, jobs))
            [(_, outcome, ok)] = execute(attempt, [job], self._recover)
        finally:
            self._running -= 1
            self._free.release()
            job.stage = Stage.DONE
        if not ok:
            raise outcome
        phases, (outputs,) = outcome
        self._judge.record(job.items, phases, inline)
        job.statistics.record_execution(job.items, phases, inline)
        if isinstance(outputs, Exception):
            raise outputs
        return outputs, phases

    def _still_alone(self) -> bool:
        """Whether the request is the model's only one once the loop has handled what it had received.
        Without a queue delay, nothing else tells a batcher of the requests received while one ran on
        the loop: each would find the queue empty in turn and run alone on the loop too, batches would
        never form, and 8 clients would get direct execution's rate. With a delay, the clients expected
        back tell it (base.py), and a lone client is spared the wait for the loop (~30 µs a request)."""
        if not self.delay:
            with Timeout(GATHER_LIMIT, False):
                gevent.idle()
        return self.requests <= 1 and not len(self.queue) and self._running == 1

    def queue_depth(self) -> int:
        """Requests waiting for an execution thread."""
        return len(self.queue)

    def close(self) -> None:
        gevent.killall(self._workers, block=False)
        self._threads.close()

    def _dispatch(self) -> None:
        while True:
            self.queue.nonempty.wait()
            with self._free:  # an instance is free: the batch grows in the queue until then
                self._gather_received()
                if self.delay:
                    self._wait_for_more(self.queue.__len__, (self.preferred or [self.max_batch_size])[0])
                if len(self.queue):
                    self._run_batch()

    def _gather_received(self) -> None:
        """Before a batch is cut, the event loop handles what it has received already: the requests
        the last batch answered send their answers, and those their clients sent back since reach the
        queue. Cut at once, 64 clients split into two halves that took turns, in batches of 32 rather
        than 41 (measured). Bounded, so that a flood of other traffic cannot hold the model back."""
        if self.requests > len(self.queue) + self._running:
            with Timeout(GATHER_LIMIT, False):
                gevent.idle()

    def _run_batch(self) -> None:
        batch = self._cut(self.queue.take(self.max_batch_size))
        running = sum(job.requests for job in batch)
        self._running += running
        try:
            outcomes = execute(self._execute, batch, self._recover)
        except BaseException as exc:
            for job in batch:
                self._deliver(job, exc, ok=False)
            return
        finally:
            self._running -= running
        for part, outcome, ok in outcomes:
            if ok:
                self._answer(part, *outcome)
            else:
                for job in part:
                    self._deliver(job, outcome, ok=False)

    def _execute(self, batch: list[Job]) -> tuple[Phases, list, bool]:
        """`run_batch` of the batch's requests, a merge's members in its place, on a thread, or on the
        event loop where the model's latest batches say this one costs less than the judge allows
        (inline.py): a thread's hand-off cost ~50 µs of CPU a batch (in one process, a tiny model, groups
        of 4 and 16), more than such a batch's whole execution. Judged on batches alone, and each batch as
        one item: a small model's batch costs about the same at any size, so its cost per item, from
        batches of one or two, made every batch of twenty look too slow for the loop (measured: batches
        stayed on their threads for good, 4-38% of them on the loop). A merge's result is its members' (each
        outputs, or the exception it failed with). Also returns whether it ran on the loop."""
        requests = [member for job in batch for member in job.members or (job,)]
        inline = self._batch_judge.fits(1)
        if inline:
            phases, results = on_loop(run_batch, (requests,), min(job.submitted for job in requests))
        else:
            phases, results = run_jobs(self._threads, requests)
        self._batch_judge.record(1, phases, inline)
        if len(requests) > len(batch):
            each = iter(results)
            results = [[next(each) for _ in job.members] if job.members else next(each) for job in batch]
        return phases, results, inline

    def _answer(self, batch: list[Job], phases: Phases, outputs: list[dict], inline: bool) -> None:
        batch[0].statistics.record_execution(sum(j.items for j in batch), phases, inline)
        now = time.perf_counter_ns()
        compute = phases.input_ns + phases.infer_ns + phases.output_ns
        for job, result in zip(batch, outputs, strict=True):
            own = Phases(now - job.submitted - compute, phases.input_ns, phases.infer_ns, phases.output_ns)
            failed = isinstance(result, Exception)
            self._deliver(job, result if failed else (result, own), ok=not failed)

    def _cut(self, batch: list[Job]) -> list[Job]:
        """Shorten a batch to the largest preferred size it makes exactly, between two requests: where that
        falls inside a merge, the merge is cut there (job.cut). What is cut goes back first."""
        if not self.preferred:
            return batch
        end, total = None, 0  # (job's index, its requests taken) where the batch so far is a preferred size
        for index, job in enumerate(batch):
            for taken, member in enumerate(job.members or (job,), start=1):
                total += member.items
                if total in self.preferred:
                    end = (index, taken)
        if end is None or end == (len(batch) - 1, batch[-1].requests):
            return batch
        index, taken = end
        for job in reversed(batch[index + 1:]):
            self.queue.requeue(job)
        kept = batch[: index + 1]
        if taken < kept[-1].requests:
            kept[-1] = self.queue.split(kept[-1], sum(member.items for member in kept[-1].members[:taken]))
        return kept

    def _deliver(self, job: Job, outcome, ok: bool) -> None:
        if job.stage is Stage.DONE:
            return
        job.stage = Stage.DONE
        job.settled()  # a merge, or a part of one, which the core never sees
        if not self.preserve_ordering:
            _fulfil(job, outcome, ok)
            return
        self._finished[job.order] = (job, outcome, ok)
        while self._pending and self._pending[0] in self._finished:
            _fulfil(*self._finished.pop(self._pending.pop(0)))


def _members(positions: list[int], result) -> Iterator[tuple[int, object]]:
    """(position, result) for the request or requests a queued job stood for: a merge's (its members'
    results, phases) as each member's (outputs, phases) or exception."""
    if len(positions) == 1 or isinstance(result, BaseException):
        yield from ((position, result) for position in positions)
        return
    results, phases = result
    for position, own in zip(positions, results, strict=True):
        yield position, own if isinstance(own, Exception) else (own, phases)


def _put_answer(answers: Queue, positions: list[int], job: Job, outcome) -> None:
    """A queued job's answer, for the positions it stands for: a part of a merge cut to fill a batch
    (job.cut) for its own members' only."""
    answers.put((positions[job.offset: job.offset + job.requests], outcome))


def _put_waited(answers: Queue, positions: list[int], wait, job: Job, timeout: float) -> None:
    try:
        answers.put((positions, wait(job, timeout)))
    except Exception as exc:
        answers.put((positions, exc))


def _fulfil(job: Job, outcome, ok: bool) -> None:
    if job.answered_to is not None:
        job.answered_to(job, outcome)
        return
    if job.result.ready() or outcome is None:  # a job whose client gave up has nobody to answer
        return
    if ok:
        job.result.set(outcome)
    else:
        job.result.set_exception(outcome)
