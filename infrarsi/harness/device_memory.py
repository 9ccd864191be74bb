"""Device memory of one trial, as the device sees it.

A ``DeviceMemoryGauge`` answers two questions while a trial runs: how much memory the
trial's processes hold on its devices (the most any one device holds: each device's
capacity is its own) and how much each device has. ``TreeDeviceGauge`` does the
accounting over any ``ProcessMemorySource``; ``NvmlSource`` is the real source, NVML's
per-process view (``nvidia-ml-py``) of the devices ``CUDA_VISIBLE_DEVICES`` names (all of
them when it is unset). NVML reports the memory a process holds on the device: what its
allocator reserved plus its CUDA context.
"""

from __future__ import annotations

from typing import Collection, Mapping, Protocol

from infrarsi.core.errors import InfrarsiError


class DeviceMemoryUnavailable(InfrarsiError):
    """No device memory gauge here (no NVML library, no driver, no such device)."""


class DeviceMemoryGauge(Protocol):
    def capacity_bytes(self) -> int:
        """The smallest capacity among the trial's devices."""

    def used_bytes(self, pids: Collection[int]) -> int:
        """Memory that processes ``pids`` hold on the device where they hold the most."""

    def close(self) -> None: ...


class ProcessMemorySource(Protocol):
    """Per-process memory of a fixed list of devices, e.g. NVML's."""

    num_devices: int

    def total_bytes(self, device: int) -> int: ...

    def process_bytes(self, device: int) -> Mapping[int, int]:
        """Bytes held on ``device``, by process id."""

    def close(self) -> None: ...


class TreeDeviceGauge:
    """A trial's device memory: per device, the sum over the trial's processes (ranks may
    share a device), then the largest device."""

    def __init__(self, source: ProcessMemorySource) -> None:
        if source.num_devices < 1:
            raise DeviceMemoryUnavailable("the trial has no visible device")
        self.source = source

    def capacity_bytes(self) -> int:
        return min(self.source.total_bytes(d) for d in range(self.source.num_devices))

    def used_bytes(self, pids: Collection[int]) -> int:
        wanted = set(pids)
        per_device = (sum(b for pid, b in self.source.process_bytes(d).items() if pid in wanted)
                      for d in range(self.source.num_devices))
        return max(per_device, default=0)

    def close(self) -> None:
        self.source.close()


def visible_devices(env: Mapping[str, str]) -> list[str] | None:
    """The entries of ``CUDA_VISIBLE_DEVICES`` (indices or UUIDs); None when it is unset.

    Indices are taken as NVML's (PCI bus order), as Ray assigns them; CUDA's own default
    order can differ on a node of mixed GPUs unless ``CUDA_DEVICE_ORDER=PCI_BUS_ID``.
    """
    value = env.get("CUDA_VISIBLE_DEVICES")
    if value is None:
        return None
    return [v.strip() for v in value.split(",") if v.strip()]


class NvmlSource:
    """NVML's view of the devices named by ``devices`` (indices or UUIDs; None: every device)."""

    def __init__(self, devices: list[str] | None) -> None:
        try:
            import pynvml
        except ImportError:
            raise DeviceMemoryUnavailable("nvidia-ml-py is not installed: pip install 'infrarsi[gpu]'") from None
        self._nvml = pynvml
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            raise DeviceMemoryUnavailable(f"NVML did not start ({exc}); is an NVIDIA driver installed?") from None
        try:
            ids = devices if devices is not None else [str(i) for i in range(pynvml.nvmlDeviceGetCount())]
            self._handles = [self._handle(d) for d in ids]
        except (pynvml.NVMLError, ValueError) as exc:
            pynvml.nvmlShutdown()
            raise DeviceMemoryUnavailable(f"CUDA_VISIBLE_DEVICES {devices} does not name NVML devices "
                                          f"({exc})") from None
        self.num_devices = len(self._handles)

    def _handle(self, device: str):
        if device.startswith(("GPU-", "MIG-")):
            return self._nvml.nvmlDeviceGetHandleByUUID(device)
        return self._nvml.nvmlDeviceGetHandleByIndex(int(device))

    def total_bytes(self, device: int) -> int:
        return int(self._nvml.nvmlDeviceGetMemoryInfo(self._handles[device]).total)

    def process_bytes(self, device: int) -> Mapping[int, int]:
        procs = self._nvml.nvmlDeviceGetComputeRunningProcesses(self._handles[device])
        # usedGpuMemory is None where the driver cannot attribute memory (e.g. some vGPU setups).
        return {p.pid: int(p.usedGpuMemory or 0) for p in procs}

    def close(self) -> None:
        self._nvml.nvmlShutdown()


def open_nvml_gauge(env: Mapping[str, str]) -> DeviceMemoryGauge:
    """The gauge for a trial whose environment is ``env``. Raises ``DeviceMemoryUnavailable``."""
    return TreeDeviceGauge(NvmlSource(visible_devices(env)))
