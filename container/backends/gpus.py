"""The GPUs as torch numbers them — `cuda:0` is the first device CUDA_VISIBLE_DEVICES leaves visible,
and a MIG slice is its own device with its own memory — which is not NVML's order. Memory comes from
torch (`mem_get_info`, `get_device_properties`), and so do the UUIDs that label the metrics. NVML is
initialised once, at start, to measure one thing torch cannot: how much a CUDA context takes (the used
memory before and after this process creates its own), which each handler model's worker process pays again."""

import logging

import torch

log = logging.getLogger(__name__)


class Gpus:
    def __init__(self):
        self.devices = [f"cuda:{i}" for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []
        self.totals: dict[str, int] = {}
        self.in_use: dict[str, int] = {}  # at start, before any model: this process's CUDA context and other tenants
        self.contexts: dict[str, int] = {}  # the size of a CUDA context on each device (0: NVML could not tell)
        self.uuids = {d: _uuid(torch.cuda.get_device_properties(d).uuid) for d in self.devices}
        nvml = _nvml(self.devices) if self.devices else None
        before = _used(nvml)
        for device in self.devices:
            free, total = torch.cuda.mem_get_info(device)  # creates this process's context on the device
            self.totals[device], self.in_use[device] = total, total - free
        after = _used(nvml)
        for device, uuid in self.uuids.items():
            self.contexts[device] = max(after[uuid] - before[uuid], 0) if uuid in before and uuid in after else 0

    def budget(self, device: str, share: int) -> int:
        """`share` of the device (from SERVE_GPU_MEMORY_LIMIT) less what was in use before any model."""
        return max(share - self.in_use[device], 0)

    def usage(self) -> dict[str, tuple[int, int]]:
        """UUID → (total bytes, used bytes) of each device now, whoever uses it."""
        usage = {}
        for device in self.devices:
            free, total = torch.cuda.mem_get_info(device)
            usage[self.uuids[device]] = (total, total - free)
        return usage

    def reserved(self, device: str) -> int:
        """What torch in this process holds on the device now."""
        return torch.cuda.memory_reserved(device)


def _nvml(devices: list[str]):
    """pynvml, initialised (once, for the process's life), or None after saying why at ERROR: NVML
    failing where torch sees GPUs usually means a driver/library mismatch an operator must hear of."""
    try:
        import pynvml

        pynvml.nvmlInit()
        return pynvml
    except Exception as exc:
        log.error("NVML failed to load: GPU metrics keep torch's UUIDs, and handler models are not charged their "
                  "CUDA context", extra={"fields": {"error": repr(exc), "devices": devices}})
        return None


def _used(nvml) -> dict[str, int]:
    """UUID → bytes in use on each device NVML lists (a MIG slice's UUID is absent: torch's differs)."""
    if nvml is None:
        return {}
    used = {}
    for index in range(nvml.nvmlDeviceGetCount()):
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        used[_uuid(nvml.nvmlDeviceGetUUID(handle))] = nvml.nvmlDeviceGetMemoryInfo(handle).used
    return used


def _uuid(value) -> str:
    """`GPU-…`/`MIG-…` as nvidia-smi prints it, from torch's UUID object or NVML's string/bytes."""
    text = value.decode() if isinstance(value, bytes) else str(value)
    return text if text.startswith(("GPU-", "MIG-")) else f"GPU-{text}"
