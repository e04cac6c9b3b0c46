"""What this container may use: CPU quota and memory limit from cgroups (GPUs: backends/gpus.py)."""

import os
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
