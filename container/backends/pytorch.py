"""TorchScript models in Triton layout, and the torch housekeeping every backend shares."""

import contextlib
import ctypes
import gc
import io
import itertools
import math
import re
import threading
import time
from pathlib import Path

import numpy as np
import torch

from container import resources
from container.backends import footprint
from container.errors import DeviceFault, DeviceOutOfMemory, InvalidInput, InvalidModel, ModelError, ServeError
from container.models.cache import total_by_device
from container.models.signature import Signature, TensorSpec
from container.models.statistics import Phases

_BF16 = "BF16"
_OUT_OF_MEMORY = ("CUDA out of memory", "DefaultCPUAllocator: can't allocate memory")
_REQUESTED = re.compile(r"ried to allocate (\d+(?:\.\d+)?) ?(bytes|B|KiB|MiB|GiB|TiB)\b")
_UNITS = {"bytes": 1, "B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}
# CUDA errors after which the context stays broken: every later call fails with the same error.
_STICKY = ("illegal memory access", "device-side assert", "unspecified launch failure", "misaligned address",
           "illegal instruction", "uncorrectable ECC", "hardware stack error", "invalid program counter")


def configure_threads(cores: int) -> None:
    """Leave one core to HTTP; torch would otherwise spin a thread per core of the whole machine. Each
    thread that runs a model applies the count again (`device_scope`)."""
    global _torch_threads
    _torch_threads = max(1, cores - 1)
    torch.set_num_threads(_torch_threads)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:  # already set in this process (tests create several apps)
        pass


def warm_up() -> None:
    """Load and run a tiny TorchScript model once, so the one-time costs of the first load and the first
    executions (lazy initialisation inside torch) belong to the idle process, not to the first model
    measured (backends/footprint.py)."""
    buffer = io.BytesIO()
    torch.jit.save(torch.jit.script(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU()).eval()), buffer)
    buffer.seek(0)
    module = torch.jit.load(buffer)
    with torch.inference_mode():
        for _ in range(footprint.LEARNING_RUNS):
            module(torch.ones(1, 4))


def module_bytes(module) -> dict[str, int]:
    """Parameter, buffer and constant bytes per device, each storage counted once (tied weights share
    one). A frozen TorchScript model (`torch.jit.freeze`) has no parameters: its weights are tensor
    constants of its methods' graphs."""
    sizes: dict[str, int] = {}
    seen = set()
    for tensor in [*module.parameters(), *module.buffers(), *_graph_constants(module)]:
        storage = tensor.untyped_storage()
        key = (tensor.device, storage.data_ptr())
        if key in seen:
            continue
        seen.add(key)
        sizes[str(tensor.device)] = sizes.get(str(tensor.device), 0) + storage.nbytes()
    return sizes


def _graph_constants(module) -> list[torch.Tensor]:
    if not isinstance(module, torch.jit.ScriptModule):
        return []
    graphs = [m._c._get_method(name).graph for m in module.modules() for name in m._c._method_names()]
    return [tensor for graph in graphs for tensor in _tensor_constants(graph.nodes())]


def _tensor_constants(nodes) -> list[torch.Tensor]:
    found = []
    for node in nodes:
        if node.kind() == "prim::Constant" and node.output().type().kind() == "TensorType":
            found.append(node.t("value"))
        for block in node.blocks():  # the bodies of if and loop
            found += _tensor_constants(block.nodes())
    return found


def device_error(exc: BaseException, device: str, doing: str) -> ServeError | None:
    """The server's error for a failure of the device itself (out of memory, a sticky CUDA error), or
    None for any other failure. Built from the message alone, so it keeps none of the failed call's
    frames, and with them its tensors, alive."""
    text = str(exc)
    if isinstance(exc, torch.OutOfMemoryError) or any(marker in text for marker in _OUT_OF_MEMORY):
        return DeviceOutOfMemory(f"{device} ran out of memory {doing}", device, requested_bytes(text))
    if "CUDA error" in text and any(marker in text for marker in _STICKY):
        cause = next(line.strip() for line in text.splitlines() if "CUDA error" in line)
        return DeviceFault(f"{cause} ({doing}); the CUDA context is unusable until its process restarts")
    return None


def guarded(device: str, doing: str, fn, *args):
    """`fn(*args)`, with a device failure raised only after the except block: its traceback would keep the
    failed call's GPU tensors alive through the recovery that follows."""
    try:
        return fn(*args)
    except Exception as exc:
        failure = device_error(exc, device, doing)
        if failure is None:
            raise
    raise failure


def requested_bytes(message: str) -> int:
    """The size of the failed allocation, as torch's allocators report it (0: not said)."""
    match = _REQUESTED.search(message)
    return int(float(match[1]) * _UNITS[match[2]]) if match else 0


def device_scope(device: str):
    """Where code runs for a model on `device`: with the server's torch thread count, under that device,
    so `"cuda"` in model code means it, and on the calling thread's own stream there, so execution
    instances do not serialise on the default stream. A CPU model needs only the thread count."""
    if _per_thread.threads != _torch_threads:
        _own_thread_count()
    if not device.startswith("cuda"):
        return _NO_SCOPE
    streams = _per_thread.streams
    if streams is None:
        streams = _per_thread.streams = {}
    if device not in streams:
        streams[device] = torch.cuda.Stream(device)
    stack = contextlib.ExitStack()
    stack.enter_context(torch.cuda.device(device))
    stack.enter_context(torch.cuda.stream(streams[device]))
    return stack


def _own_thread_count() -> None:
    """OpenMP keeps its thread count per thread, and MKL follows it: on a thread that never set it, a
    matrix product of a few rows runs on every core of the machine; on one pinned core, 15× slower."""
    _per_thread.threads = _torch_threads
    torch.set_num_threads(_torch_threads)


class _PerThread(threading.local):
    threads = 0  # the torch thread count this thread set
    streams: dict | None = None  # device → this thread's stream on it


_NO_SCOPE = contextlib.nullcontext()
_torch_threads = 0  # set by configure_threads; until then, no thread applies a count
_per_thread = _PerThread()


def free_memory(device: str) -> int:
    """Bytes free on `device` now: the GPU's own count, or the host RAM the container can still take."""
    if device.startswith("cuda"):
        return torch.cuda.mem_get_info(device)[0]
    return resources.memory_available()


def release_memory() -> None:
    """Return freed memory for real: collect cycles, drop CUDA's cached blocks, trim glibc's heap."""
    gc.collect()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass


def last_line(exc: BaseException) -> str:
    """TorchScript errors carry the script's traceback; the last line says what went wrong."""
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    return lines[-1] if lines else type(exc).__name__


def load_torchscript(path: Path, device: str):
    try:
        with device_scope(device):
            module = guarded(device, f"loading {path.name}", torch.jit.load, str(path), device)
    except ServeError:
        raise
    except Exception as exc:
        raise InvalidModel(f"{path.parent.name}/{path.name} is not a TorchScript model: {last_line(exc)}") from None
    return module.eval()


class TorchScriptModel:
    """One version of a Triton-layout model, its tensors bound to forward() as Triton's libtorch
    backend binds them (see `_bind_inputs` and `_bind_outputs`)."""

    def __init__(self, name: str, path: Path, signature: Signature, device: str):
        self.name = name
        self.device = device
        self.signature = signature
        self._grown: dict[str, int] = {}  # what loading it made the process hold
        self._peak: dict[str, int] = {}  # the most its executions held above that
        self._learning = footprint.LEARNING_RUNS
        with footprint.load_growth(device, self._grown):
            self.module = load_torchscript(path, device)
        self._counted = module_bytes(self.module)
        states = signature.states
        self._specs = {s.name: s for s in (*signature.inputs, *(c.tensor for c in signature.controls), *(s.input for s in states))}
        self._order = _bind_inputs(self.module, signature)
        self._outputs = _bind_outputs(signature)
        # fixed for the model's life, so computed once rather than on every execution
        self._output_names = [s.name for s in signature.outputs]
        self._needed = max(index for _, index in self._outputs) + 1 if self._outputs else 0
        self._doing = f"running model '{name}'"

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
        tensors = {n: _to_torch(self._specs[n], self._to_model(self._specs[n], inputs[n]), self.device) for n in self._specs}
        args = [tensors] if self._order is None else [tensors[n] for n in self._order]
        converted = time.perf_counter_ns()
        try:
            with torch.inference_mode():
                result = self.module(*args)
        except Exception as exc:
            if device_error(exc, self.device, "") is not None:
                raise
            raise ModelError(f"model '{self.name}' failed: {last_line(exc)}") from None
        inferred = time.perf_counter_ns()
        batch = len(next(iter(inputs.values()))) if self.signature.max_batch_size and inputs else None
        produced = self._name_outputs(result, batch)
        wanted = outputs or self._output_names
        phases.input_ns, phases.infer_ns = converted - start, inferred - converted
        phases.output_ns = time.perf_counter_ns() - inferred
        return {n: produced[n] for n in wanted}

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
        return _reshaped(spec, array, self.signature.max_batch_size > 0, True, self.name)

    def _from_model(self, spec: TensorSpec, value, batch: int | None) -> np.ndarray:
        array = _to_numpy(spec, value, self.name, batch)
        if spec.reshape is None:
            return array
        return _reshaped(spec, array, self.signature.max_batch_size > 0, False, self.name)


class Replicas:
    """One version loaded on each GPU its instance groups name. `placement` gives each execution
    instance its copy (an index into `copies`), as the groups place instances per GPU; the k-th thread
    to execute is the k-th instance and keeps to its copy."""

    def __init__(self, copies: list[TorchScriptModel], placement: list[int]):
        self.copies = copies
        self._placement = placement
        self._dealt = itertools.count()
        self._local = threading.local()

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
    order. Sequence control and state inputs bind by their index (Triton requires one) or, where
    they have none, by argument name."""
    arguments = module.forward.schema.arguments[1:]  # drop self
    if len(arguments) == 1 and isinstance(arguments[0].type, torch.DictType):
        return None
    params = [a.name for a in arguments]
    inputs = [s.name for s in signature.inputs]
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


def _to_torch(spec: TensorSpec, array: np.ndarray, device: str):
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


def _to_numpy(spec: TensorSpec, value, model: str, batch: int | None) -> np.ndarray:
    if spec.datatype == "BYTES":
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ModelError(f"model '{model}' output '{spec.name}' is TYPE_STRING: forward must return List[str]")
        array = np.empty(len(value), dtype=object)
        array[:] = [v.encode() for v in value]
        return _shape_strings(array, spec.shape, batch)
    if not isinstance(value, torch.Tensor):
        raise ModelError(f"model '{model}' output '{spec.name}' is {type(value).__name__}, not a tensor")
    value = value.detach()
    if value.device.type != "cpu":
        value = value.cpu()
    if value.dtype == torch.bfloat16:
        value = value.float()
    array = value.numpy()
    return array


def _reshaped(spec: TensorSpec, array: np.ndarray, batched: bool, to_model: bool, model: str) -> np.ndarray:
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
