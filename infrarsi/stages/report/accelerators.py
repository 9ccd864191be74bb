"""Accelerators by the name their driver reports, with their dense bf16 peak.

MFU divides the model FLOP/s a trial achieved by what its devices could do at most, so
the peak is the datasheet's *dense* bf16 tensor-core figure (the headline figures assume
2:4 sparsity and are twice these). Names are matched as NVML (``nvmlDeviceGetName``),
``nvidia-smi --query-gpu=name``, ``torch.cuda.get_device_name`` or ``rocm-smi`` print
them, e.g. "NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-40GB", "AMD Instinct MI300X".
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass

__all__ = ["ACCELERATORS", "Accelerator", "detect_device_names", "lookup"]

TERA = 1e12


@dataclass(frozen=True, kw_only=True)
class Accelerator:
    name: str
    pattern: str  # regular expression matched (case-insensitive) against the reported name
    peak_bf16_flops: float  # dense, per device, FLOP/s


# Where several patterns match a name, the one that matches most of it wins (lookup).
ACCELERATORS: tuple[Accelerator, ...] = (
    # NVIDIA H100 datasheet: SXM 989 TFLOPS, PCIe 756, NVL 835 bf16 dense (1,979 / 1,513 /
    # 1,671 with sparsity).
    Accelerator(name="H100 PCIe", pattern=r"H100.*PCIe", peak_bf16_flops=756 * TERA),
    Accelerator(name="H100 NVL", pattern=r"H100.*NVL", peak_bf16_flops=835 * TERA),
    Accelerator(name="H100 SXM", pattern=r"H100", peak_bf16_flops=989 * TERA),
    # NVIDIA H200 datasheet: SXM 989 TFLOPS, NVL 835 bf16 dense (1,979 / 1,671 sparse).
    Accelerator(name="H200 NVL", pattern=r"H200.*NVL", peak_bf16_flops=835 * TERA),
    Accelerator(name="H200 SXM", pattern=r"H200", peak_bf16_flops=989 * TERA),
    # NVIDIA GH200 (Grace Hopper) datasheet: the H100/H200 SXM tensor cores, 989 TFLOPS.
    Accelerator(name="GH200", pattern=r"GH200", peak_bf16_flops=989 * TERA),
    # NVIDIA HGX B200 datasheet: 4.5 PFLOPS bf16 with sparsity per GPU, 2.25 dense.
    Accelerator(name="B200", pattern=r"B200", peak_bf16_flops=2250 * TERA),
    # NVIDIA A100 datasheet: 312 TFLOPS bf16 dense (624 sparse), 40 GB and 80 GB, SXM4 and PCIe.
    Accelerator(name="A100", pattern=r"A100", peak_bf16_flops=312 * TERA),
    # NVIDIA L40S datasheet: 362.05 TFLOPS bf16 dense (733 sparse).
    Accelerator(name="L40S", pattern=r"L40S", peak_bf16_flops=362.05 * TERA),
    # NVIDIA L4 datasheet: 121 TFLOPS bf16 dense (242 sparse).
    Accelerator(name="L4", pattern=r"\bL4\b", peak_bf16_flops=121 * TERA),
    # AMD Instinct MI300X datasheet: 1,307.4 TFLOPS bf16 dense (2,614.9 sparse).
    Accelerator(name="MI300X", pattern=r"MI300X", peak_bf16_flops=1307.4 * TERA),
    # AMD Instinct MI325X datasheet: the same compute as MI300X, 1,307.4 TFLOPS bf16 dense.
    Accelerator(name="MI325X", pattern=r"MI325X", peak_bf16_flops=1307.4 * TERA),
    # AMD Instinct MI250X datasheet: 383 TFLOPS bf16 (no sparsity on CDNA2).
    Accelerator(name="MI250X", pattern=r"MI250X", peak_bf16_flops=383 * TERA),
)


def lookup(device_name: str) -> Accelerator | None:
    """The table's entry for a reported device name, or None for an unknown one. Where
    several patterns match, the most specific wins, the one matching the most characters
    of the name: "NVIDIA GH200 480GB" is a GH200, not the H200 its name contains."""
    matches = [(len(m.group()), a) for a in ACCELERATORS if (m := re.search(a.pattern, device_name, re.IGNORECASE))]
    return max(matches, key=lambda match: match[0])[1] if matches else None


def detect_device_names() -> list[str]:
    """Names of this machine's GPUs: NVML first, then nvidia-smi; [] where there is none."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return [_text(pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(i)))
                    for i in range(pynvml.nvmlDeviceGetCount())]
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # noqa: BLE001 - no library, no driver, no device: try the next source
        pass
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10, check=True).stdout
    except (subprocess.SubprocessError, OSError):
        return []
    return [line.strip() for line in out.splitlines() if line.strip()]


def _text(name: str | bytes) -> str:
    return name.decode() if isinstance(name, bytes) else name
