"""The torch housekeeping every backend shares, the TorchScript backend in this process and the handler
models' worker processes alike: thread counts, device scopes, memory measured and released, and the
CUDA errors read for what they mean (out of memory, or a context broken for good)."""

import contextlib
import ctypes
import gc
import io
import re
import threading
from pathlib import Path

import torch

from container import resources
from container.backends import footprint
from container.errors import DeviceFault, DeviceOutOfMemory, InvalidModel, ModelError, ServeError
from container.logs import user_code_failed

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


# An OS thread's own: OpenMP's thread count belongs to the OS thread, not to a greenlet.
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


def forward_failed(model: str, exc: Exception) -> ModelError:
    """The model's forward raised (not a device failure): the whole error, with the TorchScript traceback
    it carries, to the log; its last line to the client."""
    user_code_failed(model, "forward", exc)
    return ModelError(f"model '{model}' failed: {last_line(exc)}")


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
