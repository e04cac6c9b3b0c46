"""How the core runs an ensemble (backends/ensemble.py holds its graph): each step is a request to its
model through the core, as a client's would be, started as soon as every tensor it reads exists. Steps
that can run together (a fan-out) each run in a greenlet of their own, so they run at once; the one step
that can run (a chain) runs in the request's own greenlet, since a greenlet and the wait for it cost
~16 µs. A step that reads several (a fan-in) waits for all of them. The first step to fail fails the
request with its own error, which names the ensemble as Triton's does ("in ensemble 'e', …"); the
steps still running are stopped. `max_inflight_requests` bounds each step's requests under way."""

from typing import Callable

import gevent
from gevent.lock import BoundedSemaphore

from container.backends.ensemble import Ensemble, Step
from container.errors import ModelError, ServeError

InferStep = Callable[[Step, dict], dict]  # (step, the model's inputs) → the model's outputs


def run(ensemble: Ensemble, inputs: dict, wanted: list[str] | None, infer_step: InferStep) -> dict:
    values = dict(inputs)  # ensemble tensor → its array, as the steps make them
    left_out = set(ensemble.inputs) - inputs.keys()  # optional inputs: a step gets them as the request did, not at all
    gates = _gates(ensemble)
    pending, running = list(enumerate(ensemble.steps)), {}
    try:
        while pending or running:
            ready = [(i, s) for i, s in pending if set(s.inputs.values()) <= values.keys() | left_out]
            for index, step in ready:
                pending.remove((index, step))
            if len(ready) == 1 and not running:  # the one step that can run (a chain): here, not in a new greenlet
                index, step = ready[0]
                _take(ensemble, step, _gated(gates[index], infer_step, step, _feed(step, values)), values)
                continue
            for index, step in ready:
                running[gevent.spawn(_gated, gates[index], infer_step, step, _feed(step, values))] = step
            if not running:
                raise ModelError(f"ensemble '{ensemble.name}': steps {[s.model for _, s in pending]} never got their inputs")
            finished = gevent.wait(list(running), count=1)[0]
            _take(ensemble, running.pop(finished), finished.value, values)
    finally:
        gevent.killall(list(running))
    return {name: values[name] for name in ensemble.outputs if not wanted or name in wanted}


def _feed(step: Step, values: dict) -> dict:
    """The step's model's inputs, from the ensemble tensors made so far."""
    return {model_input: values[tensor] for model_input, tensor in step.inputs.items() if tensor in values}


def _take(ensemble: Ensemble, step: Step, result: tuple[bool, object], values: dict) -> None:
    """A step's outputs into `values`, or its error raised."""
    ok, outputs = result
    if not ok:
        if isinstance(outputs, ServeError):  # its status stays the step's
            outputs.message = f"in ensemble '{ensemble.name}', {outputs.message}"
        raise outputs
    for model_output, tensor in step.outputs.items():
        if model_output not in outputs:
            raise ModelError(f"ensemble '{ensemble.name}': step '{step.model}' made no output '{model_output}'")
        values[tensor] = outputs[model_output]


def _gated(gate: BoundedSemaphore | None, infer_step: InferStep, step: Step, feed: dict) -> tuple[bool, object]:
    """(True, outputs) or (False, the error): a greenlet that raised would print its traceback."""
    try:
        if gate is None:
            return True, infer_step(step, feed)
        with gate:
            return True, infer_step(step, feed)
    except Exception as exc:
        return False, exc


def _gates(ensemble: Ensemble) -> list[BoundedSemaphore | None]:
    """Each step's bound on requests under way, made on the event loop at the first request."""
    gates = getattr(ensemble, "gates", None)
    if gates is None:
        limit = ensemble.max_inflight
        gates = ensemble.gates = [BoundedSemaphore(limit) if limit else None for _ in ensemble.steps]
    return gates
