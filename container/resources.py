"""What this container may use: CPU quota and memory limit from cgroups, open files from rlimits (GPUs:
backends/gpus.py); how the C heap keeps what it frees, and the collector what a process made to start."""

import ctypes
import gc
import os
import resource
import signal
from pathlib import Path

import psutil

_CGROUP = Path("/sys/fs/cgroup")


def cpu_quota() -> int:
    """Cores this process may use: the cgroup CPU quota, else the CPU affinity mask."""
    cores = len(os.sched_getaffinity(0))
    try:
        quota, period = (_CGROUP / "cpu.max").read_text().split()
        if quota != "max":
            cores = min(cores, max(1, int(int(quota) / int(period))))
    except (OSError, ValueError):
        pass
    return cores


def memory_limit() -> int:
    """Bytes of RAM this container may use: the cgroup limit when set, else the machine's RAM."""
    total = psutil.virtual_memory().total
    for name in ("memory.max", "memory/memory.limit_in_bytes"):
        try:
            text = (_CGROUP / name).read_text().strip()
        except OSError:
            continue
        if text.isascii() and text.isdigit():
            return min(total, int(text))
    return total


def memory_available() -> int:
    """Bytes of RAM this container can still take: what the machine has free, within the cgroup's limit."""
    available = psutil.virtual_memory().available
    used = _cgroup_usage()
    return min(available, memory_limit() - used) if used is not None else available


def memory_used() -> int:
    """Bytes of RAM this container uses: the cgroup's count when it has one, else the machine's."""
    used = _cgroup_usage()
    if used is not None:
        return used
    memory = psutil.virtual_memory()
    return memory.total - memory.available


def _cgroup_usage() -> int | None:
    for name in ("memory.current", "memory/memory.usage_in_bytes"):
        try:
            return int((_CGROUP / name).read_text())
        except (OSError, ValueError):
            continue
    return None


# Descriptors kept for what is not a client connection: model files, handler workers' sockets, shared
# memory regions, logs. Each client connection takes one.
_RESERVED_FILES = 256


def anonymous_bytes(pid: int) -> int:
    """The anonymous resident memory of process `pid` (its heap, not the files it maps); 0 once it is gone."""
    try:
        memory = psutil.Process(pid).memory_info()
    except psutil.Error:
        return 0
    return memory.rss - memory.shared


def raise_open_file_limit() -> int:
    """Raise the soft limit on open files to the hard one (allowed without privileges); the new soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):  # a hard limit the kernel's nr_open refuses
            pass
    return soft


def connection_limit(requested: int | None) -> int:
    """Client connections this process can hold with the open files it may have: `requested`, or as many
    as the soft limit allows less a reserve, whichever is fewer."""
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    room = max(1, (soft if soft != resource.RLIM_INFINITY else 1 << 20) - _RESERVED_FILES)
    return min(requested, room) if requested else room


# glibc's malloc maps each block past its mmap threshold afresh, and gives back the heap's free top
# once it passes the trim threshold. Both start low and rise only with the largest block freed so far,
# so a request of a few MiB had the buffers of its path (bytes, arrays, protobuf, shared memory) mapped
# and faulted in again each time: ~2,000 page faults a 4 MB request in each process it crossed, and in
# the gRPC front-end, whose request holds ~8 copies at once, 6,800-8,500 (16 ms of its 24). Fixed where
# glibc's own adjustment ends, the pages stay for the next request.
MMAP_THRESHOLD = 32 << 20  # the most glibc takes on 64-bit
TRIM_THRESHOLD = 64 << 20  # twice that, as glibc's adjustment sets it
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
_MALLOC_ENVIRONMENT = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_", "MALLOC_MMAP_MAX_")


def keep_freed_heap(environ=os.environ) -> bool:
    """Fix glibc's mmap and trim thresholds in this process and, through `environ`, in the processes it
    starts (exec'd front-ends, the fork server and its handler workers); a process forked from this one
    inherits them. Whatever an operator set for glibc's malloc stands. Returns whether it applied (not
    with another C library)."""
    if any(name in environ for name in _MALLOC_ENVIRONMENT) or "glibc.malloc." in environ.get("GLIBC_TUNABLES", ""):
        return False
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):
        return False
    environ["MALLOC_MMAP_THRESHOLD_"], environ["MALLOC_TRIM_THRESHOLD_"] = str(MMAP_THRESHOLD), str(TRIM_THRESHOLD)
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD))


def freeze_start_up() -> None:
    """What a process made before it serves (its imports, mostly) lives as long as it: frozen, the full
    collections that requests in flight bring about every few hundred milliseconds skip it. Over torch the
    model process's took ~90 ms each; an HTTP front-end's took 10 ms (its p99 at 64 connections 15 ms, and 6
    frozen)."""
    gc.collect()
    gc.freeze()


def killed_first(pid: int) -> None:
    """Make `pid` what the kernel's out-of-memory killer takes before any process without this mark: the
    highest oom_score_adj, which any process may give its own children. A front-end killed loses its
    requests under way and comes back; the model process would lose every loaded model."""
    try:
        with open(f"/proc/{pid}/oom_score_adj", "w") as adjust:
            adjust.write("1000")
    except OSError:  # it has exited already, or /proc is not Linux's
        pass


def die_with_parent() -> None:
    """Be killed when the parent (the thread that started this process) ends: PR_SET_PDEATHSIG, which
    an exec keeps."""
    try:
        ctypes.CDLL("libc.so.6").prctl(1, signal.SIGKILL)
    except (OSError, AttributeError):
        pass
