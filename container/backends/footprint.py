"""What a model really costs, measured rather than counted: the memory its load made this process
hold, and the peak its executions reach above that (activations, workspaces), on the host and on
its GPU. Both probes see the whole process, so measurements take turns under one lock; only loads
and a model's first few executions are measured, so serving never waits on it.

A runtime's one-time costs (the modules torch.export's loader imports: about 100 MiB) are prepared once
outside any measurement (`prepared`) and held by the server, not by the first model that needed them."""

import ctypes
import logging
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable

import psutil
import torch

LEARNING_RUNS = 3  # executions of each model that measure its activation peak
_turn = threading.Lock()  # taken by native threads (loads, executions), never the event loop
_process = psutil.Process()
_runtimes: dict[str, int] = {}  # a runtime prepared in this process → the own bytes preparing it took
log = logging.getLogger(__name__)
try:
    _malloc_trim = ctypes.CDLL("libc.so.6").malloc_trim
except (OSError, AttributeError):  # not glibc: freed memory is whatever the allocator keeps
    _malloc_trim = None


def prepared(runtime: str, prepare: Callable[[], None]) -> None:
    """Run `prepare`, a runtime's one-time work, once in this process and outside any model's
    measurement: what it leaves the process holding is the server's (`runtime_bytes`), as the idle
    process's is, not the first model's. A `prepare` that raises is tried again by the next call."""
    if runtime in _runtimes:
        return
    with _turn:
        if runtime in _runtimes:
            return
        started, own = time.monotonic(), _own()
        prepare()
        _runtimes[runtime] = max(_own() - own, 0)
    log.info("prepared runtime", extra={"fields": {"runtime": runtime, "bytes": _runtimes[runtime],
                                                   "seconds": round(time.monotonic() - started, 3)}})


def runtime_bytes() -> int:
    """What the runtimes prepared in this process hold, its own pages: host bytes no model is charged."""
    return sum(_runtimes.values())


@contextmanager
def load_growth(device: str, grown: dict[str, int]):
    """Fills `grown` with what the block left this process holding: its resident host memory, once the
    C heap is trimmed of freed blocks (RSS, from statm: microseconds, where USS walks every page and
    costs milliseconds per load), and, on a GPU, torch's reserved memory there."""
    with _turn:
        host, gpu = _resident(), _reserved(device)
        yield
        grown["cpu"] = max(_resident() - host, 0)
        if device.startswith("cuda"):
            grown[device] = max(_reserved(device) - gpu, 0)


@contextmanager
def execution_peak(device: str, peak: dict[str, int]):
    """Raises `peak` to the most memory the block held above what the process held when it began: the
    host's resident high-water mark (reset for the block) and, on a GPU, torch's peak allocation.

    Less the file and shared pages the block made resident: the first call of a code path in a process
    faults in its machine code (a first TorchScript execution, ~1.1 MiB of libtorch_cpu.so's text, measured),
    which the process keeps for every model after, and which the kernel may drop and read again, as it may
    any file's pages; an activation is anonymous memory."""
    with _turn:
        held = _trimmed()  # the heap trimmed first: blocks it kept from earlier requests would hide the peak
        host, shared = held.rss, held.shared
        resettable = reset_host_peak()
        if device.startswith("cuda"):
            torch.cuda.reset_peak_memory_stats(device)
            gpu = torch.cuda.memory_allocated(device)
        yield
        if resettable:
            faulted_in = max(_process.memory_info().shared - shared, 0)
            peak["cpu"] = max(peak.get("cpu", 0), host_peak(_process.pid) - host - faulted_in)
        if device.startswith("cuda"):
            peak[device] = max(peak.get(device, 0), torch.cuda.max_memory_allocated(device) - gpu)


def charged(counted: dict[str, int], grown: dict[str, int], peak: dict[str, int]) -> dict[str, int]:
    """Per device: the larger of the counted bytes (parameters, buffers, constants) and the load's
    growth, plus the activation peak as headroom."""
    devices = dict.fromkeys([*counted, *grown, *peak])
    return {d: max(counted.get(d, 0), grown.get(d, 0)) + peak.get(d, 0) for d in devices}


def _resident() -> int:
    return _trimmed().rss


def _trimmed():
    """This process's memory (psutil's, from statm) once the C heap has given back its freed blocks."""
    if _malloc_trim is not None:
        _malloc_trim(0)
    return _process.memory_info()


def _own() -> int:
    """This process's own pages (USS, as /metrics measures the server): a walk of its page tables, too
    slow for every load, once per runtime."""
    _resident()  # the heap trimmed
    return _process.memory_full_info().uss


def _reserved(device: str) -> int:
    return torch.cuda.memory_reserved(device) if device.startswith("cuda") else 0


def reset_host_peak() -> bool:
    """Reset this process's resident high-water mark to its current RSS (Linux ≥ 4.0); False where
    that is not possible, and the mark would count from the process's start."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def host_peak(pid: int) -> int:
    """The resident high-water mark of a process (VmHWM) in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0
