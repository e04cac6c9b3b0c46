"""The sequence batcher: requests carrying a `sequence_id` run one after another per sequence, with
the control inputs the config names (START, END, READY, CORRID) made by the server and implicit state
fed back from each execution to the next. `sequence_start` (re)starts a sequence with fresh state,
`sequence_end` releases it, and a sequence idle for max_sequence_idle_microseconds is released too.
Different sequences run in parallel on the model's instance threads."""

import time
from dataclasses import dataclass, field

import gevent
import numpy as np
from gevent.lock import Semaphore
from gevent.threadpool import ThreadPool

from container.errors import InvalidRequest
from container.models.signature import ControlSpec, Signature
from container.models.statistics import Phases
from container.scheduling.job import Job, on_thread, run_batch
from container.tensors import numpy_dtype, zeros

DEFAULT_IDLE_US = 1_000_000  # Triton's default max_sequence_idle_microseconds


@dataclass(eq=False)
class Sequence:
    state: dict[str, np.ndarray]  # state input name → its next value
    turn: Semaphore = field(default_factory=Semaphore)  # one request of the sequence at a time
    last_used: float = field(default_factory=time.monotonic)


class SequenceBatcher:
    def __init__(self, model_name: str, config, signature: Signature, instances: int = 1):
        self.model_name = model_name
        self.signature = signature
        self.idle_limit = (config.sequence_batching.max_sequence_idle_microseconds or DEFAULT_IDLE_US) / 1e6
        self.sequences: dict[object, Sequence] = {}
        self._threads = ThreadPool(instances)
        self._sweeper = gevent.spawn(self._release_idle)

    def infer(self, job: Job) -> tuple[dict, Phases]:
        sequence_id, start, end = self._flags(job)
        if job.items != 1:
            raise InvalidRequest(f"a request to sequence model '{self.model_name}' carries one item, not {job.items}")
        sequence = self.sequences.get(sequence_id)
        if start:
            sequence = self.sequences[sequence_id] = Sequence(self._initial_state())
        elif sequence is None:
            raise InvalidRequest(f"sequence {sequence_id!r} is not running: start it with sequence_start "
                                 f"(an idle sequence is released after {self.idle_limit:g} s)")
        with sequence.turn:
            sequence.last_used = time.monotonic()
            inputs = {**job.inputs, **self._controls(sequence_id, start, end), **sequence.state}
            wanted = (job.outputs or [s.name for s in self.signature.outputs]) + [s.output.name for s in self.signature.states]
            run = Job(job.backend, job.statistics, inputs, wanted, 1, job.parameters, job.submitted)
            phases, (outputs,) = self._threads.apply(on_thread, (run_batch, ([run],), job.submitted))
            sequence.state = {s.input.name: outputs.pop(s.output.name) for s in self.signature.states}
            sequence.last_used = time.monotonic()
        if end and self.sequences.get(sequence_id) is sequence:
            del self.sequences[sequence_id]
        job.statistics.record_execution(1, phases)
        return outputs, phases

    def queue_depth(self) -> int:
        """Requests waiting for an execution thread."""
        return self._threads.task_queue.qsize()

    def sequences_active(self) -> int:
        """Sequences holding state (only the sequence batcher has any)."""
        return len(self.sequences)

    def close(self) -> None:
        self._sweeper.kill(block=False)
        self._threads.kill()
        self.sequences.clear()

    def _flags(self, job: Job) -> tuple[object, bool, bool]:
        parameters = job.parameters
        sequence_id = parameters.get("sequence_id")
        if sequence_id in (None, 0, ""):
            raise InvalidRequest(f"model '{self.model_name}' is a sequence model: send a sequence_id parameter")
        corrid = next((c for c in self.signature.controls if c.kind == "CORRID"), None)
        if corrid is not None and (corrid.tensor.datatype == "BYTES") != isinstance(sequence_id, str):
            kind = "a string" if corrid.tensor.datatype == "BYTES" else "an integer"
            raise InvalidRequest(f"model '{self.model_name}' takes {kind} sequence_id")
        return sequence_id, bool(parameters.get("sequence_start")), bool(parameters.get("sequence_end"))

    def _controls(self, sequence_id, start: bool, end: bool) -> dict[str, np.ndarray]:
        flags = {"START": start, "END": end, "READY": True}
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
                    del self.sequences[sequence_id]
