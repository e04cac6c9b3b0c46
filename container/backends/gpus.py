"""The GPUs as torch numbers them — `cuda:0` is the first device CUDA_VISIBLE_DEVICES leaves visible,
and a MIG slice is its own device with its own memory — which is not NVML's order. Memory comes from
torch (`mem_get_info`, `get_device_properties`); NVML, initialised once, only supplies the UUIDs that
label the metrics, as Triton labels them."""

import logging

import torch

log = logging.getLogger(__name__)


class Gpus:
    def __init__(self):
        self.devices = [f"cuda:{i}" for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []
        self.totals: dict[str, int] = {}
        self.in_use: dict[str, int] = {}  # at start, before any model: this process's CUDA context and other tenants
        self.uuids: dict[str, str] = {}
        for device in self.devices:
            free, total = torch.cuda.mem_get_info(device)  # creates this process's context on the device
            self.totals[device], self.in_use[device] = total, total - free
            self.uuids[device] = _uuid(torch.cuda.get_device_properties(device).uuid)
        if self.devices:
            self._check_nvml()

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

    def _check_nvml(self) -> None:
        """NVML names the devices in the metrics; torch already knows their UUIDs, so a broken NVML costs
        only its cross-check, but it usually means a driver/library mismatch an operator must hear of."""
        try:
            import pynvml

            pynvml.nvmlInit()
            known = {_uuid(pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(i)))
                     for i in range(pynvml.nvmlDeviceGetCount())}
        except Exception as exc:
            log.error("NVML failed to load: GPU metrics keep torch's UUIDs, and nvidia-smi may disagree with torch",
                      extra={"fields": {"error": repr(exc), "devices": self.devices}})
            return
        missing = [d for d in self.devices if self.uuids[d] not in known]
        if missing:  # a MIG slice: NVML lists the parent card's UUID, torch the slice's
            log.info("GPU UUIDs from torch that NVML does not list (MIG slices)", extra={"fields": {"devices": missing}})


def _uuid(value) -> str:
    """`GPU-…`/`MIG-…` as nvidia-smi prints it, from torch's UUID object or NVML's string/bytes."""
    text = value.decode() if isinstance(value, bytes) else str(value)
    return text if text.startswith(("GPU-", "MIG-")) else f"GPU-{text}"
