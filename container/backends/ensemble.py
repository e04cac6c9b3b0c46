"""An ensemble (`platform: "ensemble"`): a graph of steps, each a request to another model, its inputs
mapped from the ensemble's inputs or from earlier steps' outputs. This holds the graph, checked at
load: every tensor a step reads is made by exactly one producer, every output is made, and no step
waits on itself. The core runs it (container/ensembles.py); the ensemble itself holds no memory."""

from dataclasses import dataclass

from container.errors import InvalidModel
from container.models.signature import Signature, TensorSpec


@dataclass(frozen=True)
class Step:
    model: str
    version: int | None  # None: the model's latest
    inputs: dict[str, str]  # the model's input → the ensemble tensor it reads
    outputs: dict[str, str]  # the model's output → the ensemble tensor it makes


class Ensemble:
    own_process = False

    def __init__(self, name: str, config):
        self.name = name
        self.steps = tuple(Step(s.model_name, s.model_version if s.model_version > 0 else None,
                                dict(s.input_map), dict(s.output_map)) for s in config.ensemble_scheduling.step)
        self.max_inflight = config.ensemble_scheduling.max_inflight_requests  # per step; 0: no limit
        self.inputs = [t.name for t in config.input]
        self.outputs = [t.name for t in config.output]
        self._check()

    @property
    def models(self) -> list[str]:
        """The composing models, in step order, each once."""
        return list(dict.fromkeys(step.model for step in self.steps))

    def memory(self) -> dict[str, int]:
        return {}

    def measured(self) -> dict[str, dict[str, int]]:
        return {}

    def close(self) -> None:
        pass

    def _check(self) -> None:
        if not self.steps:
            raise InvalidModel(f"ensemble '{self.name}' has no ensemble_scheduling steps")
        made = {name: "an ensemble input" for name in self.inputs}
        for step in self.steps:
            if not step.model:
                raise InvalidModel(f"ensemble '{self.name}': a step has no model_name")
            for tensor in step.outputs.values():
                if tensor in made:
                    raise InvalidModel(f"ensemble '{self.name}': tensor '{tensor}' is made twice (by {made[tensor]} "
                                       f"and by step '{step.model}')")
                made[tensor] = f"step '{step.model}'"
        for step in self.steps:
            unknown = [t for t in step.inputs.values() if t not in made]
            if unknown:
                raise InvalidModel(f"ensemble '{self.name}': step '{step.model}' reads {unknown}, which no input "
                                   f"or step makes")
        missing = [t for t in self.outputs if t not in made]
        if missing:
            raise InvalidModel(f"ensemble '{self.name}': output(s) {missing} are made by no step")
        self._check_acyclic()

    def check_tensors(self, own: Signature, steps: dict[str, Signature]) -> None:
        """Each ensemble tensor has one datatype and one shape (a -1 matches any size, the batch's included)
        wherever it is made or read: the ensemble's own inputs and outputs and its steps' models' (`steps`:
        model name → its signature); and no step that batches takes smaller batches than the ensemble.
        Loaded otherwise, every request would fail at the step where they part. Triton checks the same at
        load, though it lets pass a tensor whose sizes agree once the batch dimension is left out (a model
        without batching feeding one with it), which no request can then run."""
        for step in self.steps:
            batch = steps[step.model].max_batch_size
            if 0 < batch < own.max_batch_size:
                raise InvalidModel(f"ensemble '{self.name}' allows batches of {own.max_batch_size}, but its step model "
                                   f"'{step.model}' only of {batch}")
        seen: dict[str, tuple[TensorSpec, str]] = {}

        def meet(tensor: str, spec: TensorSpec, where: str) -> None:
            first, there = seen.setdefault(tensor, (spec, where))
            if first.datatype != spec.datatype or not _same_shape(first.shape, spec.shape):
                raise InvalidModel(f"ensemble '{self.name}': tensor '{tensor}' is {first.datatype}{list(first.shape)} as "
                                   f"{there} but {spec.datatype}{list(spec.shape)} as {where}")

        for spec in own.inputs:
            meet(spec.name, spec, "the ensemble's input")
        for step in self.steps:
            signature = steps[step.model]
            for kind, mapping, specs in (("input", step.inputs, signature.inputs), ("output", step.outputs, signature.outputs)):
                named = {spec.name: spec for spec in specs}
                for name, tensor in mapping.items():
                    meet(tensor, named[name], f"{kind} '{name}' of step '{step.model}'")
        for spec in own.outputs:
            meet(spec.name, spec, "the ensemble's output")

    def _check_acyclic(self) -> None:
        available, pending = set(self.inputs), list(self.steps)
        while pending:
            ready = [s for s in pending if set(s.inputs.values()) <= available]
            if not ready:
                raise InvalidModel(f"ensemble '{self.name}': steps {[s.model for s in pending]} wait on each other "
                                   f"(a cycle)")
            for step in ready:
                available |= set(step.outputs.values())
                pending.remove(step)


def _same_shape(one: tuple[int, ...], other: tuple[int, ...]) -> bool:
    return len(one) == len(other) and all(a == b or -1 in (a, b) for a, b in zip(one, other, strict=True))
