"""TorchScript models in Triton layout, and the torch housekeeping every backend shares."""

import ctypes
import gc
import time
from pathlib import Path

import numpy as np
import torch

from container.errors import DeviceOutOfMemory, InvalidInput, InvalidModel, ModelError
from container.models.signature import Signature, TensorSpec
from container.models.statistics import Phases

_BF16 = "BF16"


def configure_threads(cores: int) -> None:
    """Leave one core to HTTP; torch would otherwise spin a thread per core of the whole machine."""
    torch.set_num_threads(max(1, cores - 1))
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:  # already set in this process (tests create several apps)
        pass


def gpu_count() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def module_bytes(module) -> dict[str, int]:
    """Parameter and buffer bytes per device, each storage counted once (tied weights share one)."""
    sizes: dict[str, int] = {}
    seen = set()
    for tensor in [*module.parameters(), *module.buffers()]:
        storage = tensor.untyped_storage()
        key = (tensor.device, storage.data_ptr())
        if key in seen:
            continue
        seen.add(key)
        sizes[str(tensor.device)] = sizes.get(str(tensor.device), 0) + storage.nbytes()
    return sizes


def is_out_of_memory(exc: BaseException) -> bool:
    return isinstance(exc, torch.cuda.OutOfMemoryError) or "CUDA out of memory" in str(exc)


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
        module = torch.jit.load(str(path), map_location=device)
    except Exception as exc:
        if is_out_of_memory(exc):
            raise DeviceOutOfMemory(f"{device} ran out of memory loading {path.name}", device) from None
        raise InvalidModel(f"{path.parent.name}/{path.name} is not a TorchScript model: {last_line(exc)}") from None
    return module.eval()


class TorchScriptModel:
    """One version of a Triton-layout model: inputs bound to forward() in config order (or by name)."""

    def __init__(self, name: str, path: Path, signature: Signature, device: str):
        self.name = name
        self.device = device
        self.signature = signature
        self.module = load_torchscript(path, device)
        states = signature.states
        self._specs = {s.name: s for s in (*signature.inputs, *(c.tensor for c in signature.controls), *(s.input for s in states))}
        self._outputs = (*signature.outputs, *(s.output for s in states))
        self._order = _bind_inputs(self.module, signature)

    def memory(self) -> dict[str, int]:
        return module_bytes(self.module)

    def close(self) -> None:
        self.module = None

    def execute(self, inputs: dict[str, np.ndarray], outputs, phases: Phases) -> dict[str, np.ndarray]:
        """Run once; `outputs` names the outputs wanted (None: all); `phases` receives the timings."""
        start = time.perf_counter_ns()
        args = [_to_torch(self._specs[n], inputs[n], self.device) for n in self._order]
        converted = time.perf_counter_ns()
        try:
            with torch.inference_mode():
                result = self.module(*args)
        except Exception as exc:
            if is_out_of_memory(exc):
                raise DeviceOutOfMemory(f"{self.device} ran out of memory running model '{self.name}'", self.device) from exc
            raise ModelError(f"model '{self.name}' failed: {last_line(exc)}") from None
        inferred = time.perf_counter_ns()
        produced = self._name_outputs(result)
        wanted = outputs or [s.name for s in self.signature.outputs]
        phases.input_ns, phases.infer_ns = converted - start, inferred - converted
        phases.output_ns = time.perf_counter_ns() - inferred
        return {n: produced[n] for n in wanted}

    def _name_outputs(self, result) -> dict[str, np.ndarray]:
        specs = self._outputs
        if isinstance(result, dict):
            missing = [s.name for s in specs if s.name not in result]
            if missing:
                raise ModelError(f"model '{self.name}' returned a dict without output(s) {missing}")
            values = [result[s.name] for s in specs]
        elif isinstance(result, tuple) or (isinstance(result, list) and len(specs) > 1):
            values = list(result)
        else:
            values = [result]
        if len(values) != len(specs):
            raise ModelError(f"model '{self.name}' returned {len(values)} outputs; its config declares {len(specs)}")
        return {s.name: _to_numpy(s, v, self.name) for s, v in zip(specs, values, strict=True)}


def _bind_inputs(module, signature: Signature) -> list[str]:
    """forward()'s argument order as input names — the config's inputs, then a sequence model's
    control inputs and state inputs: by name when they match, else positionally."""
    params = [a.name for a in module.forward.schema.arguments][1:]  # drop self
    names = [s.name for s in signature.inputs] + [c.tensor.name for c in signature.controls]
    names += [s.input.name for s in signature.states]
    if sorted(params) == sorted(names):
        return params
    if len(params) != len(names):
        raise InvalidModel(f"the config declares {len(names)} input(s) {names}; forward() takes {len(params)} {params}")
    return names


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
    return tensor.to(device, non_blocking=True)


def _to_numpy(spec: TensorSpec, value, model: str) -> np.ndarray:
    if spec.datatype == "BYTES":
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ModelError(f"model '{model}' output '{spec.name}' is TYPE_STRING: forward must return List[str]")
        array = np.empty(len(value), dtype=object)
        array[:] = [v.encode() for v in value]
        return _shape_strings(array, spec.shape)
    if not isinstance(value, torch.Tensor):
        raise ModelError(f"model '{model}' output '{spec.name}' is {type(value).__name__}, not a tensor")
    value = value.detach().cpu()
    if value.dtype == torch.bfloat16:
        value = value.float()
    return value.numpy()


def _shape_strings(array: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """A flat List[str] regains the configured shape when only the batch dimension is free."""
    inner = shape[1:] if shape[:1] == (-1,) else shape
    if -1 in inner or not inner:
        return array
    return array.reshape((-1, *inner) if shape[:1] == (-1,) else inner)
