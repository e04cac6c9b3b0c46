"""The sequence batcher: requests carrying a `sequence_id` run one after another per sequence, with
the control inputs the config names (START, END, READY, CORRID) made by the server and implicit state
fed back from each execution to the next. `sequence_start` (re)starts a sequence with fresh state,
`sequence_end` releases it, and a sequence idle for max_sequence_idle_microseconds is released too.

Requests of different sequences batch together, one per sequence, up to max_batch_size, as Triton's
strategies do: `oldest` takes them from its max_candidate_sequences oldest sequences and cuts the
batch to a preferred_batch_size; `direct` (the default) gives each sequence a batch slot of its own
for its lifetime — max_batch_size slots (one without batching) per instance; sequences beyond them
wait for a free slot — and each instance sends its batches laid out by slot, a slot without a request
filled with READY false. Either waits up to its
max_queue_delay_microseconds for requests on their way (as the dynamic batcher does)."""

import functools
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

import gevent
import numpy as np
from gevent import GreenletExit
from gevent.event import Event

from container.errors import Cancelled, InvalidRequest, QueueTimeout
from container.inference import Cancellable
from container.models.config import DEFAULT_SEQUENCE_IDLE_US
from container.models.recovery import Recover, execute
from container.models.signature import ControlSpec, Signature
from container.models.statistics import Phases
from container.scheduling.base import Scheduler, preferred_sizes
from container.scheduling.instances import Instances
from container.scheduling.job import Job, run_jobs
from container.tensors import datatype_of, numpy_dtype, zeros


class Turn:
    """One request of a sequence at a time, in the order the requests arrived. gevent's Semaphore wakes
    its waiters in order, but a request arriving between a release and the first waiter's wake-up takes
    it ahead of them: a sequence's END then ran before the request in front of it (a gRPC stream, under
    load)."""

    __slots__ = ("_queue", "_dropped")

    def __init__(self):
        self._queue: deque[Event] = deque()  # the holder's, then each waiter's, in arrival order
        self._dropped: set[Event] = set()  # waiters cancelled with a request before them (`cancel_waiting`)

    def locked(self) -> bool:
        return bool(self._queue)

    def acquire(self, request: Cancellable | None = None) -> None:
        """The turn, once the requests before it have had theirs; Cancelled when `request` is cancelled while
        it waits (then at once), or with a request before it (`cancel_waiting`)."""
        mine = Event()
        self._queue.append(mine)
        if len(self._queue) == 1:
            return
        waiting = True

        def cancelled() -> None:  # its client went away while it waited: it leaves now, not at its turn
            if waiting and mine in self._queue:
                self._leave(mine)
                mine.set()

        if request is not None:
            request.when_cancelled(cancelled)
        try:
            mine.wait()
        except BaseException:  # its greenlet was killed (its gRPC stream ended) while it waited
            if mine in self._queue:
                self._leave(mine)
            raise
        finally:
            waiting = False
        if mine not in self._queue:  # it left (cancelled)
            raise Cancelled()
        if mine in self._dropped:
            self._dropped.discard(mine)
            self.release()
            raise Cancelled()

    def _leave(self, mine: Event) -> None:
        """A waiter leaves: the turn passes over it, and the requests behind it are cancelled with it."""
        handed = self._queue[0] is mine
        behind = list(self._queue)[self._queue.index(mine) + 1:]
        self._queue.remove(mine)
        self._dropped.discard(mine)
        self._dropped.update(behind)
        if handed:
            self._pass_on()

    def cancel_waiting(self) -> None:
        """The requests waiting for the turn now are cancelled when it comes to them: as Triton cancels a
        sequence's pending requests with one that was cancelled (the holder's, here)."""
        self._dropped.update(list(self._queue)[1:])

    def release(self) -> None:
        self._queue.popleft()
        self._pass_on()

    def _pass_on(self) -> None:
        if self._queue:
            self._queue[0].set()


@dataclass(eq=False)
class Sequence:
    state: dict[str, np.ndarray]  # state input name → its next value
    turn: Turn = field(default_factory=Turn)  # one request of the sequence at a time, in arrival order
    last_used: float = field(default_factory=time.monotonic)
    slot: int | None = None  # direct: its row in every batch, once it has one


class SequenceBatcher(Scheduler):
    def __init__(self, model_name: str, config, signature: Signature, instances: int = 1, recover: Recover | None = None,
                 wait_limit: float = 60.0, holding: Callable[[int], None] = lambda count: None):
        """`wait_limit`: seconds a request may wait for its sequence to get a slot (SAGEMAKER_MODEL_SERVER_TIMEOUT);
        `holding`: told how many sequences hold state each time that changes (a model holding any is not idle)."""
        batching = config.sequence_batching
        oldest = batching.oldest if batching.HasField("oldest") else None
        super().__init__((oldest or batching.direct).max_queue_delay_microseconds / 1e6)
        self.wait_limit = wait_limit
        self._holding = holding
        self.model_name = model_name
        self._recover = recover
        self.signature = signature
        self.idle_limit = (batching.max_sequence_idle_microseconds or DEFAULT_SEQUENCE_IDLE_US) / 1e6
        self.direct = oldest is None
        self.max_batch_size = max(config.max_batch_size, 1)
        self.preferred = preferred_sizes(oldest.preferred_batch_size, self.max_batch_size) if oldest else []
        self.candidates = (oldest.max_candidate_sequences if oldest else 0) or None  # None: every sequence
        self.sequences: dict[object, Sequence] = {}  # in the order they started: the oldest first
        self._ready: list[tuple[Job, Sequence]] = []  # the next request of each sequence that has one
        self._behind = 0  # requests waiting for their sequence's previous request to run
        self._threads = Instances(instances)
        self._slots = self.max_batch_size * instances
        self._workers = [gevent.spawn(self._dispatch, instance) for instance in range(instances)]
        self._sweeper = gevent.spawn(self._release_idle)

    def infer(self, job: Job) -> tuple[dict, Phases]:
        sequence_id, start, end = self._flags(job)
        if job.items != 1:
            raise InvalidRequest(f"inference request to model '{self.model_name}' must specify batch-size 1 due to "
                                 f"requirements of sequence batcher (this one has {job.items})")  # Triton's words, then why
        sequence = self.sequences.get(sequence_id)
        if sequence is None and start:  # a restart keeps the sequence (its slot, its order) and resets its state
            sequence = self.sequences[sequence_id] = Sequence(self._initial_state())
            self._holding(len(self.sequences))
        elif sequence is None:
            raise self._not_running(sequence_id)
        self._behind += 1  # its sequence's previous request has not run: it cannot join the next batch
        try:
            sequence.turn.acquire(job)
        finally:
            self._behind -= 1
        try:
            if self.sequences.get(sequence_id) is not sequence:  # it ended while this request waited
                raise self._not_running(sequence_id)
            if start:
                sequence.state = self._initial_state()
            sequence.last_used = time.monotonic()
            inputs = {**job.inputs, **self._controls(sequence_id, start, end), **sequence.state}
            wanted = (job.outputs or [s.name for s in self.signature.outputs]) + [s.output.name for s in self.signature.states]
            run = Job(job.backend, job.statistics, inputs, wanted, 1, job.parameters, job.submitted,
                      respond=job.respond, request_id=job.request_id, batching=job.batching)
            self._ready.append((run, sequence))
            job.when_cancelled(run.cancel)
            run.when_cancelled(functools.partial(self._withdraw, run, sequence))
            self._arrived.set()
            try:
                outputs, phases = self._wait(run, sequence)
            except BaseException as exc:
                if (run, sequence) in self._ready:  # its client went away before it ran
                    self._ready.remove((run, sequence))
                if isinstance(exc, (GreenletExit, Cancelled)):  # cancelled: so are the requests behind it
                    sequence.turn.cancel_waiting()
                raise
            finally:
                run.settled()
            sequence.state = {s.input.name: outputs.pop(s.output.name) for s in self.signature.states}
            sequence.last_used = time.monotonic()
        finally:
            sequence.turn.release()
        if end and self.sequences.get(sequence_id) is sequence:
            self._release(sequence_id)
        return outputs, phases

    def _withdraw(self, run: Job, sequence: Sequence) -> None:
        """A request cancelled before a batch took it leaves at once: a sequence without a slot may wait long."""
        if (run, sequence) in self._ready:
            self._ready.remove((run, sequence))
            run.result.set_exception(Cancelled())

    def _wait(self, run: Job, sequence: Sequence) -> tuple[dict, Phases]:
        """The request's outputs; a request still waiting for a slot after the wait limit gives up (503),
        so a full backlog cannot hold its clients, and its sequence's turn, for ever."""
        try:
            return run.result.get(timeout=self.wait_limit)
        except gevent.Timeout:
            if (run, sequence) not in self._ready:  # taken into a batch meanwhile: its state must come back
                return run.result.get()
        raise QueueTimeout(f"sequence model '{self.model_name}' had no free sequence slot within {self.wait_limit:g} s "
                           f"(SAGEMAKER_MODEL_SERVER_TIMEOUT); retry, or end idle sequences")

    def queue_depth(self) -> int:
        """Requests waiting for an execution thread."""
        return len(self._ready)

    def sequences_active(self) -> int:
        """Sequences holding state (only the sequence batcher has any)."""
        return len(self.sequences)

    def close(self) -> None:
        gevent.killall([self._sweeper, *self._workers], block=False)
        self._threads.close()
        self.sequences.clear()

    def _dispatch(self, instance: int) -> None:
        while True:
            while not self._eligible(instance):
                self._arrived.clear()
                self._arrived.wait()
            if self.delay:
                self._wait_for_more(lambda: len(self._ready) + self._behind, (self.preferred or [self.max_batch_size])[0])
            batch, requests = self._take(instance)
            if not batch:
                continue
            self._running += requests
            try:
                # a batch is laid out by sequence slot: it recovers whole, and is never split
                [(_, outcome, ok)] = execute(lambda jobs: run_jobs(self._threads, jobs), batch, self._recover, divisible=False)
                if not ok:
                    raise outcome
            except BaseException as exc:
                for job in batch:
                    job.result.set_exception(exc)
                continue
            finally:
                self._running -= requests
            phases, outputs = outcome
            batch[0].statistics.record_execution(requests, phases)
            for job, result in zip(batch, outputs, strict=True):
                if isinstance(result, Exception):  # a python model failed this request alone
                    job.result.set_exception(result)
                else:
                    job.result.set((result, phases))

    def _eligible(self, instance: int) -> list[tuple[Job, "Sequence"]]:
        """The ready requests an instance may take: with `direct`, those of sequences holding one of its
        slots; with `oldest`, those of the max_candidate_sequences oldest sequences. The others wait in
        a backlog until a sequence ends."""
        if self.direct:
            self._assign_slots()
            first = instance * self.max_batch_size
            return [(j, s) for j, s in self._ready if s.slot is not None and first <= s.slot < first + self.max_batch_size]
        if self.candidates is None:
            return self._ready
        candidates = set(map(id, list(self.sequences.values())[: self.candidates]))
        return [(j, s) for j, s in self._ready if id(s) in candidates]

    def _assign_slots(self) -> None:
        """Sequences without a slot take the lowest free ones, oldest first."""
        waiting = [s for s in self.sequences.values() if s.slot is None]
        if not waiting:
            return
        taken = {s.slot for s in self.sequences.values() if s.slot is not None}
        free = (slot for slot in range(self._slots) if slot not in taken)  # lazily: max_batch_size may be 2³¹−1
        for sequence, slot in zip(waiting, free, strict=False):  # more waiting than free: the rest wait on
            sequence.slot = slot

    def _take(self, instance: int) -> tuple[list[Job], int]:
        """The next batch and how many requests it holds: the oldest ready request and the ready
        requests of other (candidate) sequences that can merge with it, up to max_batch_size, cut to a
        preferred size (oldest) or laid out by slot (direct)."""
        ready = self._eligible(instance)
        if not ready:
            return [], 0
        key = ready[0][0].batch_key()
        chosen = [(j, s) for j, s in ready if j.batch_key() == key][: self.max_batch_size]
        fits = [size for size in self.preferred if size <= len(chosen)]
        if fits:
            chosen = chosen[: fits[-1]]
        for entry in chosen:
            self._ready.remove(entry)
        if not self.direct:
            return [j for j, _ in chosen], len(chosen)
        rows = {s.slot % self.max_batch_size: j for j, s in chosen}
        return [rows.get(slot) or self._padding(chosen[0][0]) for slot in range(max(rows) + 1)], len(chosen)

    def _padding(self, template: Job) -> Job:
        """A row for a slot without a request: zeros, READY (and every other control) false."""
        inputs = {name: zeros(datatype_of(array), array.shape) for name, array in template.inputs.items()}
        corrid = next((c for c in self.signature.controls if c.kind == "CORRID"), None)
        inputs |= self._controls("" if corrid and corrid.tensor.datatype == "BYTES" else 0, False, False, ready=False)
        return Job(template.backend, template.statistics, inputs, template.outputs, 1, batching=template.batching)

    def _not_running(self, sequence_id) -> InvalidRequest:
        return InvalidRequest(f"inference request for sequence {sequence_id} to model '{self.model_name}' must specify "
                              f"the START flag on the first request of the sequence (sequence_start; an idle "
                              f"sequence is released after {self.idle_limit:g} s, and an unload ends every "
                              f"sequence)")  # Triton's words, then ours

    def _flags(self, job: Job) -> tuple[object, bool, bool]:
        parameters = job.parameters
        sequence_id = parameters.get("sequence_id")
        if sequence_id in (None, 0, ""):
            raise InvalidRequest(f"inference request to model '{self.model_name}' must specify a non-zero or non-empty "
                                 f"correlation ID (the sequence_id parameter)")  # Triton's words, then ours
        corrid = next((c for c in self.signature.controls if c.kind == "CORRID"), None)
        if corrid is not None and (corrid.tensor.datatype == "BYTES") != isinstance(sequence_id, str):
            kind = "a string" if corrid.tensor.datatype == "BYTES" else "an integer"
            raise InvalidRequest(f"model '{self.model_name}' takes {kind} sequence_id")
        if corrid is not None and isinstance(sequence_id, int):
            bounds = np.iinfo(numpy_dtype(corrid.tensor.datatype))
            if not bounds.min <= sequence_id <= bounds.max:
                raise InvalidRequest(f"sequence_id {sequence_id} does not fit model '{self.model_name}''s CORRID "
                                     f"{corrid.tensor.datatype} ({bounds.min} to {bounds.max})")
        return sequence_id, bool(parameters.get("sequence_start")), bool(parameters.get("sequence_end"))

    def _controls(self, sequence_id, start: bool, end: bool, ready: bool = True) -> dict[str, np.ndarray]:
        flags = {"START": start, "END": end, "READY": ready}
        return {c.tensor.name: self._control_value(c, sequence_id, flags) for c in self.signature.controls}

    def _control_value(self, control: ControlSpec, sequence_id, flags: dict) -> np.ndarray:
        shape = (1, 1) if self.signature.max_batch_size else (1,)
        if control.kind == "CORRID":
            value = sequence_id.encode() if isinstance(sequence_id, str) else sequence_id
        else:
            value = control.false_true[flags[control.kind]]
        array = np.empty(shape, numpy_dtype(control.tensor.datatype))
        array.fill(value)
        return array

    def _initial_state(self) -> dict[str, np.ndarray]:
        """The initial_state's value, or zeros (empty strings) shaped as the state with 1 for -1."""
        return {s.input.name: s.initial if s.initial is not None else zeros(s.input.datatype, tuple(1 if d == -1 else d for d in s.input.shape))
                for s in self.signature.states}

    def _release_idle(self) -> None:
        while True:
            gevent.sleep(max(self.idle_limit / 4, 0.01))
            now = time.monotonic()
            for sequence_id, sequence in list(self.sequences.items()):
                if not sequence.turn.locked() and now - sequence.last_used > self.idle_limit:
                    self._release(sequence_id)

    def _release(self, sequence_id) -> None:
        del self.sequences[sequence_id]
        self._holding(len(self.sequences))
        self._arrived.set()  # a sequence in the backlog may become a candidate
