"""TorchScript models in Triton layout, their tensors bound to forward() as Triton's libtorch backend
binds them."""

import itertools
import math
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from container.backends import footprint
from container.backends.torch_runtime import (
    device_error,
    device_scope,
    forward_failed,
    guarded,
    load_torchscript,
    module_bytes,
)
from container.errors import InvalidInput, InvalidModel, ModelError
from container.limits import boolean
from container.models.cache import total_by_device
from container.models.signature import Signature, TensorSpec
from container.models.statistics import Phases
from container.tensors import datatype_of

_BF16 = "BF16"


@dataclass(frozen=True)
class Switches:
    """What a config's `parameters` switch for a TorchScript model, with the keys and defaults of
    Triton's PyTorch backend: INFERENCE_MODE (false: torch.no_grad() instead) and
    DISABLE_OPTIMIZED_EXECUTION (the TorchScript executor's optimizations off, for this model's calls)."""

    inference_mode: bool = True
    optimized: bool = True

    @classmethod
    def from_config(cls, config) -> "Switches":
        return cls(_switch(config, "INFERENCE_MODE", True), not _switch(config, "DISABLE_OPTIMIZED_EXECUTION", False))


def _switch(config, key: str, default: bool) -> bool:
    parameter = config.parameters.get(key)
    if parameter is None:
        return default
    value = boolean(parameter.string_value)
    if value is None:
        raise InvalidModel(f"parameter {key} is {parameter.string_value!r}; it takes true or false")
    return value


class TorchScriptModel:
    """One version of a Triton-layout model, its tensors bound to forward() as Triton's libtorch
    backend binds them (see `_bind_inputs` and `_bind_outputs`)."""

    def __init__(self, name: str, path: Path, signature: Signature, device: str, switches: Switches = Switches()):
        self.name = name
        self._switches = switches
        self._plain = switches == Switches()  # Triton's defaults: the fast call
        self.device = device
        self.signature = signature
        self._grown: dict[str, int] = {}  # what loading it made the process hold
        self._peak: dict[str, int] = {}  # the most its executions held above that
        self._learning = footprint.LEARNING_RUNS
        with footprint.load_growth(device, self._grown):
            self.module = load_torchscript(path, device)
        self._counted = module_bytes(self.module)
        states = signature.states
        self._specs = {s.name: s for s in (*signature.inputs, *signature.made_inputs(), *(c.tensor for c in signature.controls),
                                           *(s.input for s in states))}
        self._order = _bind_inputs(self.module, signature)
        self._outputs = _bind_outputs(signature)
        # fixed for the model's life, so computed once rather than on every execution
        self._output_names = [s.name for s in signature.outputs]
        self._needed = max(index for _, index in self._outputs) + 1 if self._outputs else 0
        self._doing = f"running model '{name}'"
        ragged = signature.batching.ragged if signature.batching else ()
        # an input whose first dimension counts the batch's rows (for the strings a model returns flat)
        self._rows = next((s.name for s in signature.inputs if s.name not in ragged), None) if signature.max_batch_size else None

    def memory(self) -> dict[str, int]:
        return footprint.charged(self._counted, self._grown, self._peak)

    def measured(self) -> dict[str, dict[str, int]]:
        """The measurements behind `memory()`, per device."""
        return {"weights": self._counted, "load": self._grown, "activation_peak": self._peak}

    def close(self) -> None:
        self.module = None

    def execute(self, inputs: dict[str, np.ndarray], outputs, phases: Phases) -> dict[str, np.ndarray]:
        """Run once; `outputs` names the outputs wanted (None: all); `phases` receives the timings. Every
        device allocation, the copy of the inputs included, is inside the out-of-memory guard. The first
        executions also measure the activation peak."""
        if self._learning > 0:
            with footprint.execution_peak(self.device, self._peak):
                self._learning -= 1
                return self._guarded(inputs, outputs, phases)
        return self._guarded(inputs, outputs, phases)

    def _guarded(self, inputs: dict[str, np.ndarray], outputs, phases: Phases) -> dict[str, np.ndarray]:
        with device_scope(self.device):
            return guarded(self.device, self._doing, self._execute, inputs, outputs, phases)

    def _execute(self, inputs: dict[str, np.ndarray], outputs, phases: Phases) -> dict[str, np.ndarray]:
        start = time.perf_counter_ns()
        tensors = {n: to_torch(self._specs[n], self._to_model(self._specs[n], inputs[n]), self.device)
                   for n in self._specs if n in inputs}
        # an optional input the request left out: absent from a dict argument, else None (Optional[Tensor])
        args = [tensors] if self._order is None else [tensors.get(n) for n in self._order]
        converted = time.perf_counter_ns()
        try:
            result = self._forward(args) if self._plain else self._switched(args)
        except Exception as exc:
            if device_error(exc, self.device, "") is not None:
                raise
            raise forward_failed(self.name, exc) from None
        inferred = time.perf_counter_ns()
        batch = len(inputs[self._rows]) if self._rows in inputs else None
        produced = self._name_outputs(result, batch)
        wanted = outputs or self._output_names
        phases.input_ns, phases.infer_ns = converted - start, inferred - converted
        phases.output_ns = time.perf_counter_ns() - inferred
        return {n: array for n, array in produced.items() if n in wanted}  # in the config's order, as Triton's

    def _forward(self, args: list):
        # The guard torch.inference_mode() enters, without its Python wrapper, and forward() without
        # nn.Module's hook dispatch (a loaded TorchScript module has no hooks): ~7 µs of a 20 µs call.
        with torch._C._InferenceMode(True):
            return self.module.forward(*args)

    def _switched(self, args: list):
        """forward() as the config's parameters switch it; the executor's setting is the thread's, and
        the thread may run other models next (the event loop's does), so it is put back."""
        optimized = torch._C._get_graph_executor_optimize()
        torch._C._set_graph_executor_optimize(self._switches.optimized)
        try:
            if self._switches.inference_mode:
                return self._forward(args)
            with torch.no_grad():
                return self.module.forward(*args)
        finally:
            torch._C._set_graph_executor_optimize(optimized)

    def _name_outputs(self, result, batch: int | None) -> dict[str, np.ndarray]:
        """The outputs by name; `batch`: the request's batch size, for the strings a model returns flat."""
        bound = self._outputs
        if isinstance(result, dict):
            missing = [s.name for s, _ in bound if s.name not in result]
            if missing:
                raise ModelError(f"model '{self.name}' returned a dict without output(s) {missing}")
            return {s.name: self._from_model(s, result[s.name], batch) for s, _ in bound}
        if isinstance(result, tuple) or (isinstance(result, list) and len(bound) > 1):
            values = list(result)
        else:
            values = [result]
        if len(values) < self._needed:
            raise ModelError(f"model '{self.name}' returned {len(values)} outputs; its config needs {self._needed}")
        return {s.name: self._from_model(s, values[index], batch) for s, index in bound}

    def _to_model(self, spec: TensorSpec, array: np.ndarray) -> np.ndarray:
        if spec.reshape is None:
            return array
        return reshaped(spec, array, self.signature.max_batch_size > 0, True, self.name)

    def _from_model(self, spec: TensorSpec, value, batch: int | None) -> np.ndarray:
        array = to_numpy(spec, value, self.name, batch)
        if spec.reshape is None:
            return array
        return reshaped(spec, array, self.signature.max_batch_size > 0, False, self.name)


class Replicas:
    """One version loaded on each GPU its instance groups name. `placement` gives each execution
    instance its copy (an index into `copies`), as the groups place instances per GPU; the k-th thread
    to execute is the k-th instance and keeps to its copy."""

    def __init__(self, copies: list[TorchScriptModel], placement: list[int]):
        self.copies = copies
        self._placement = placement
        self._dealt = itertools.count()
        self._local = threading.local()  # an OS thread's, as the instance's copy is

    def execute(self, inputs: dict[str, np.ndarray], outputs, phases: Phases) -> dict[str, np.ndarray]:
        copy = getattr(self._local, "copy", None)
        if copy is None:
            instance = next(self._dealt)
            copy = self._local.copy = self.copies[self._placement[instance % len(self._placement)]]
        return copy.execute(inputs, outputs, phases)

    def memory(self) -> dict[str, int]:
        return total_by_device(copy.memory() for copy in self.copies)

    def measured(self) -> dict[str, dict[str, int]]:
        copies = [copy.measured() for copy in self.copies]
        return {kind: total_by_device(m[kind] for m in copies) for kind in copies[0]}

    def close(self) -> None:
        for copy in self.copies:
            copy.close()


def tensor_index(name: str) -> int | None:
    """The index in Triton's `<name>__<index>` naming convention (`INPUT__0` → 0), or None."""
    _, delimiter, index = name.partition("__")
    return int(index) if delimiter and index.isascii() and index.isdigit() else None


def _bind_inputs(module, signature: Signature) -> list[str] | None:
    """forward()'s arguments as tensor names in order (None: forward takes one Dict[str, Tensor]).

    The config's inputs bind as Triton's libtorch backend binds them: by argument name when every
    name is an argument, else by `<name>__<index>` when every name carries an index, else in config
    order; the inputs the server makes for each batch (`batch_input`) follow them. Sequence control and
    state inputs bind by their index (Triton requires one) or, where they have none, by argument name."""
    arguments = module.forward.schema.arguments[1:]  # drop self
    if len(arguments) == 1 and isinstance(arguments[0].type, torch.DictType):
        return None
    params = [a.name for a in arguments]
    inputs = [s.name for s in (*signature.inputs, *signature.made_inputs())]
    if all(n in params for n in inputs):
        positions = {n: params.index(n) for n in inputs}
    elif all(tensor_index(n) is not None for n in inputs):
        positions = {n: tensor_index(n) for n in inputs}
    else:
        positions = {n: i for i, n in enumerate(inputs)}
    for name in [c.tensor.name for c in signature.controls] + [s.input.name for s in signature.states]:
        index = tensor_index(name)
        if index is None and name not in params:
            raise InvalidModel(f"sequence input '{name}' must follow the <name>__<index> convention or name a "
                               f"forward() argument ({params})")
        positions[name] = index if index is not None else params.index(name)
    if len(positions) != len(params):
        raise InvalidModel(f"the config declares {len(positions)} input(s) {list(positions)}; forward() takes "
                           f"{len(params)} {params}")
    order = sorted(positions, key=positions.get)
    if [positions[n] for n in order] != list(range(len(order))):
        raise InvalidModel(f"input indexes {positions} must number forward()'s {len(params)} arguments from 0, each once")
    for spec in signature.inputs:  # a request may leave an optional input out: the model then gets None
        argument = arguments[positions[spec.name]]
        if spec.optional and not isinstance(argument.type, torch.OptionalType):
            raise InvalidModel(f"input '{spec.name}' is optional, so forward()'s argument '{argument.name}' must be "
                               f"Optional[Tensor] (it is {argument.type})")
    return order


def _bind_outputs(signature: Signature) -> list[tuple[TensorSpec, int]]:
    """Each output with its place in what forward() returns: by `<name>__<index>` when every output
    carries an index, else in config order; state outputs by their index, else after the outputs."""
    outputs = signature.outputs
    indexed = all(tensor_index(s.name) is not None for s in outputs)
    bound = [(s, tensor_index(s.name) if indexed else i) for i, s in enumerate(outputs)]
    for i, state in enumerate(signature.states):
        index = tensor_index(state.output.name)
        bound.append((state.output, index if index is not None else len(outputs) + i))
    return bound


def to_torch(spec: TensorSpec, array: np.ndarray, device: str):
    if spec.datatype == "BYTES":
        try:
            return [v.decode() for v in array.reshape(-1).tolist()]
        except UnicodeDecodeError:
            raise InvalidInput(f"input '{spec.name}' holds bytes that are not UTF-8 text") from None
    if not array.flags.writeable:  # torch refuses to alias read-only memory
        array = array.copy()
    tensor = torch.from_numpy(array)
    if spec.datatype == _BF16:
        tensor = tensor.to(torch.bfloat16)
    return tensor if device == "cpu" else tensor.to(device, non_blocking=True)


def to_numpy(spec: TensorSpec, value, model: str, batch: int | None) -> np.ndarray:
    if spec.datatype == "BYTES":
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ModelError(f"model '{model}' output '{spec.name}' is TYPE_STRING: forward must return List[str]")
        array = np.empty(len(value), dtype=object)
        array[:] = [v.encode() for v in value]
        return _shape_strings(array, spec.shape, batch)
    if type(value) is not torch.Tensor and not isinstance(value, torch.Tensor):  # the metaclass's check is slow
        raise ModelError(f"model '{model}' output '{spec.name}' is {type(value).__name__}, not a tensor")
    if value.requires_grad:  # a parameter returned as it is; what inference mode computes never requires grad
        value = value.detach()
    if not value.is_cpu:
        value = value.cpu()
    if value.dtype == torch.bfloat16:
        provided, array = _BF16, value.float().numpy()
    else:
        array = value.numpy()
        provided = datatype_of(array)
    if provided != spec.datatype:  # Triton's libtorch backend refuses it too, in these words
        raise ModelError(f"configuration expects datatype TYPE_{spec.datatype} for output '{spec.name}', "
                         f"model provides TYPE_{provided}")
    return array


def reshaped(spec: TensorSpec, array: np.ndarray, batched: bool, to_model: bool, model: str) -> np.ndarray:
    """A tensor with a config `reshape`, from the client's dims to the model's shape or back; the
    batch dimension stays as it is."""
    dims = spec.reshape if to_model else (spec.shape[1:] if batched else spec.shape)
    if not to_model and dims.count(-1) > 1:  # the model's shape is all there is to go by
        return array
    try:
        return array.reshape(((array.shape[0],) if batched else ()) + dims)
    except (ValueError, IndexError):
        if to_model:
            raise InvalidInput(f"input '{spec.name}' of shape {list(array.shape)} cannot take the model's shape "
                               f"{list(spec.reshape)} (config reshape)") from None
        raise ModelError(f"model '{model}' output '{spec.name}' of shape {list(array.shape)} does not fit the "
                         f"configured dims {list(dims)}") from None


def _shape_strings(array: np.ndarray, shape: tuple[int, ...], batch: int | None) -> np.ndarray:
    """A flat List[str] regains the configured shape: its fixed dims, or, with one free dim, the
    request's batch dimension ahead of what the strings fill (a batched model's `[-1]` output keeps its
    `[batch, n]`, as Triton answers)."""
    batched = shape[:1] == (-1,)
    inner = shape[1:] if batched else shape
    if not inner:
        return array
    if -1 not in inner:
        return array.reshape((-1, *inner) if batched else inner)
    fixed = math.prod(d for d in inner if d != -1)
    if batched and batch and inner.count(-1) == 1 and len(array) % (batch * fixed) == 0:
        return array.reshape((batch, *inner))
    return array
