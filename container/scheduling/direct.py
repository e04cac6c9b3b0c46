"""Direct execution: each request runs as it comes on one of the model's instance threads (real OS
threads), waited on without blocking the gevent hub — or, for a model whose recent executions were
shorter than a thread hand-off is worth, on the hub itself (inline.py). Requests that arrive together
for a model of worker processes go to its workers a few at a time, each few to the first worker free
(`run_all`)."""

import functools
import time
from collections import deque
from typing import Iterator

from gevent.event import Event
from gevent.queue import Queue

from container import kept
from container.errors import Cancelled, DeviceOutOfMemory, WorkerLost
from container.inference import Cancellable
from container.models.recovery import Recover, execute
from container.models.statistics import Phases, Statistics
from container.scheduling.base import Scheduler, outcome
from container.scheduling.inline import InlineJudge
from container.scheduling.instances import Instances
from container.scheduling.job import Job, call, on_loop, on_thread, run_batch

# What a worker is handed at once of requests that arrived together: about this much of its work (from how
# long its requests have taken of late), and never more than its even share. Less leaves it waiting for the
# server's turns, which the event loop's work delays (measured, two front-ends, 64 connections, a handler and
# a python model that do nothing: one request a message served 2,600 requests/s where shares of the group
# served 8,300, for 3.3× the CPU; 1 ms, the python model 5,000-5,300 against 5,800-6,800; 5 ms, level within
# this VM's noise); more keeps a request waiting behind a slow one at its worker while another is free.
CHUNK_NS = 5_000_000


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
        self.turn_ns = 0  # how long a worker's request has taken of late (`run_all`); 0: not known yet

    def infer(self, job: Job) -> tuple[dict, Phases]:
        if _takes_turns(job):  # alone, as a group of one, to its workers
            [(_, result)] = self.run_all(job.backend.execute_each, [job], job.statistics, [job.items], [job])
            if isinstance(result, Exception):
                raise result
            return result
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
        if all(map(_takes_turns, jobs)):
            yield from self.run_all(jobs[0].backend.execute_each, jobs, jobs[0].statistics, [job.items for job in jobs], jobs)
            return
        if len(jobs) == 1 or self._submitted or not self._judge.fits(max(job.items for job in jobs)):
            yield from super().infer_all(jobs)
            return
        for position, job in enumerate(jobs):
            yield position, outcome(self.infer, job)

    def run_all(self, fn, calls: list, statistics: Statistics, items: list[int] | None = None,
                cancellable: list[Cancellable] | None = None) -> Iterator[tuple[int, object]]:
        """Requests that arrived together for a model of worker processes (a handler model's, a python
        model's), taken by as many of its instance threads as there are requests (a worker each, at most):
        each thread runs one `fn(turns)` (`_Turns`), which takes a few of the group's requests at a time
        (`turns.take()`: about CHUNK_NS of its worker's work) and the next only once they are done, so that a
        request seldom waits behind a slow one while another worker is free (as a TorchServe worker, or a
        Triton instance, takes the next request once it is done), and answers each as it is done
        (`turns.answer(position, result or the exception)`, and False after them for a call the worker
        skipped, which is not counted as an execution). Yields (position, (result, phases) or the exception)
        as each is answered; a call that failed for want of device memory runs again, alone, once room is
        made for it. `items`: each call's batch items, as its execution is counted (default: one each);
        `cancellable`: each call's Job or Ticket: a call cancelled (its client went away) stops counting in
        queue_depth at once, and, cancelled by the time a thread takes it, is not run (Cancelled, and no
        execution)."""
        answered, retried, left = Queue(), set(), _Left(self)
        for position, request in enumerate(cancellable or ()):
            request.when_cancelled(functools.partial(left.cancelled, position))
        group = _Group(self, calls, range(len(calls)), answered, statistics, items or [1] * len(calls), cancellable,
                       takers=min(len(calls), self._instances))
        self._submitted += len(calls)  # each counts until it is answered (queue_depth)
        pending = len(calls)
        try:
            if len(calls) == 1:
                self._take_turns(fn, group)  # nothing to answer before it is done: no greenlet
            else:
                for _ in range(group.takers):
                    kept.spawn(self._take_turns, fn, group)
            while pending:
                position, result = answered.get()
                if isinstance(result, DeviceOutOfMemory) and self._recover and position not in retried:
                    retried.add(position)
                    self._recover(result.device, result.requested)
                    self._take_turns(fn, group.again(position))
                    continue
                pending -= 1
                self._submitted -= 1
                self._finished.set()
                left.answered(position)
                yield position, result
        finally:
            self._submitted -= pending
            left.close()

    def _take_turns(self, fn, group: "_Group") -> None:
        """One of the group's takers' `fn`: each answer handed to the loop as it comes, but a lone call's,
        which comes with the call's own end (one wake-up of the loop). A lone call cancelled while it waits
        for a thread leaves the queue at once (`Instances.apply`). When `fn` fails as a whole (its worker would
        not start), the calls it took fail with it, and those left with the last of the takers to end."""
        turns = _Turns(group, self._threads)
        try:
            self._threads.apply(on_thread, (call, (fn, (turns,)), group.submitted), group.lone)
        except Exception as exc:  # noqa: BLE001 — each call it took and did not answer is told
            turns.fail(exc)
            if group.ended():
                group.fail_waiting(exc)
        else:
            group.ended()
            turns.hand_back()

    def record_turn(self, ns: int) -> None:
        """A worker's request took `ns` (`turn_ns`: a running mean, each new one an eighth of it)."""
        self.turn_ns = ns if not self.turn_ns else (7 * self.turn_ns + ns) // 8

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


def _takes_turns(job: Job) -> bool:
    """A python model's job, but a decoupled one's stream: its workers take it as a share of a group (`run_all`)."""
    return job.respond is None and hasattr(job.backend, "execute_each")


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


class _Group:
    """The requests of one `run_all`: those no thread has taken yet, which its `takers` threads take a few
    at a time, and where each answer goes. A request's queue time lasts until its worker begins it: when
    it is taken, or when the one before it in its message is done."""

    def __init__(self, scheduler: DirectScheduler, calls: list, positions, answered: Queue, statistics: Statistics,
                 items: list[int], cancellable: list[Cancellable] | None, takers: int = 1):
        self.calls, self._scheduler, self._answered, self._statistics = calls, scheduler, answered, statistics
        self._items, self._cancellable = items, cancellable
        self._waiting = deque(positions)
        self.takers, self._ended = takers, 0  # threads taking from it, and those done with it
        self.submitted = time.perf_counter_ns()
        self.alone = len(self._waiting) == 1
        # the one call's request: withdrawn from the threads' queue when it is cancelled there
        self.lone = cancellable[self._waiting[0]] if cancellable and self.alone else None

    def again(self, position: int) -> "_Group":
        """The group's `position` alone, to run once more."""
        return _Group(self._scheduler, self.calls, (position,), self._answered, self._statistics, self._items, self._cancellable)

    def take(self) -> list[int]:
        """On a thread: the next positions no thread has taken (each `popleft` is atomic under the GIL: no
        two threads take one), about CHUNK_NS of work and no more than an even share of those left (one
        while the model's requests have not been timed); none once none is left."""
        turn_ns = self._scheduler.turn_ns
        count = min(-(-len(self._waiting) // self.takers), max(CHUNK_NS // turn_ns, 1)) if turn_ns else 1
        taken = []
        while len(taken) < count:
            try:
                taken.append(self._waiting.popleft())
            except IndexError:
                break
        return taken

    def give_back(self, positions: list[int]) -> None:
        """On a thread: positions taken and not begun (their worker died), first for the next to take."""
        self._waiting.extendleft(reversed(positions))

    def cancelled(self, position: int) -> bool:
        return self._cancellable is not None and self._cancellable[position].cancelled

    def answer(self, position: int, result, began: int, now: int, ran: bool = True) -> None:
        """On the loop: the call at `position`, begun at `began`, was answered at `now`; `ran`: by the model
        (not a call cancelled before it began)."""
        phases = Phases(queue_ns=began - self.submitted, infer_ns=now - began)
        if ran and not isinstance(result, WorkerLost):  # the model ran, whether or not it raised: an execution, as Triton counts
            self._statistics.record_execution(self._items[position], phases)
            self._scheduler.record_turn(phases.infer_ns)
        self._answered.put((position, result if isinstance(result, Exception) else (result, phases)))

    def ended(self) -> bool:
        """On the loop: one of its takers is done with it; True for the last."""
        self._ended += 1
        return self._ended == self.takers

    def fail(self, positions, exc: Exception) -> None:
        for position in positions:
            self._answered.put((position, exc))

    def fail_waiting(self, exc: Exception) -> None:
        while positions := self.take():
            self.fail(positions, exc)


class _Turns:
    """One thread's turns at a group: what its `fn` takes (`take`), answers (`answer`) and gives back
    (`give_back`). A lone call's answer waits for the thread's call to end (`hand_back`)."""

    def __init__(self, group: _Group, threads: Instances):
        self._group, self._threads = group, threads
        self._taken: dict[int, int] = {}  # position → when it was taken, until it is answered
        self._last = 0  # when its last answer came: the next request in a message begins then
        self._held = None

    def take(self) -> list[tuple[int, object]]:
        """On the thread: (position, call) of the group's next requests (`_Group.take`), none once none is
        left. A request cancelled by then is answered Cancelled, not run."""
        while positions := self._group.take():
            now = time.perf_counter_ns()
            taken = []
            for position in positions:
                if self._group.cancelled(position):
                    self._threads.post(self._group.answer, position, Cancelled(), now, now, False)
                else:
                    self._taken[position] = now
                    taken.append((position, self._group.calls[position]))
            if taken:
                return taken
        return []

    def give_back(self, positions: list[int]) -> None:
        for position in positions:
            del self._taken[position]
        self._group.give_back(positions)

    def answer(self, position: int, result, ran: bool = True) -> None:
        """On the thread: the call at `position` is done (`ran`: by the model)."""
        now = time.perf_counter_ns()
        answer = (position, result, max(self._taken.pop(position), self._last), now, ran)
        self._last = now
        if self._group.alone:
            self._held = answer
        else:
            self._threads.post(self._group.answer, *answer)

    def hand_back(self) -> None:
        if self._held is not None:
            self._group.answer(*self._held)

    def fail(self, exc: Exception) -> None:
        """On the loop: the calls it took and did not answer, with `exc` (and a held answer, as it came)."""
        self.hand_back()
        self._group.fail(self._taken, exc)
        self._taken.clear()
