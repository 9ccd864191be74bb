"""A fingerprint of the machine trials run on, for cache keys and the experience bank."""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import subprocess
from functools import lru_cache


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _gpus() -> list[str]:
    # nvidia-smi instead of torch.cuda: importing torch in the driver costs seconds.
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10, check=True).stdout
    except (subprocess.SubprocessError, OSError):
        return []
    return [line.strip() for line in out.splitlines() if line.strip()]


@lru_cache(maxsize=1)
def fingerprint() -> dict:
    mem_bytes = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return {"machine": platform.machine(), "cpu": _cpu_model(), "num_cpus": os.cpu_count(),
            "memory_gib": round(mem_bytes / 2**30), "gpus": _gpus()}


def fingerprint_hash(fp: dict | None = None) -> str:
    blob = json.dumps(fp or fingerprint(), sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def describe(fp: dict | None = None) -> str:
    fp = fp or fingerprint()
    gpus = ", ".join(fp["gpus"]) or "no GPU"
    return f"{fp['num_cpus']}x {fp['cpu']} ({fp['memory_gib']} GiB), {gpus}"


@lru_cache(maxsize=1)
def software() -> dict:
    """What a measurement of a job depends on besides the hardware: the Python, torch (its
    build says its CUDA: 2.13.0+cu128, 2.13.0+cpu) and the GPU driver, read without importing
    torch. Doctor's cache key holds it, so a baseline measured under other software is not reused."""
    from importlib import metadata

    try:
        torch = metadata.version("torch")
    except metadata.PackageNotFoundError:
        torch = None
    driver = []
    if shutil.which("nvidia-smi") is not None:
        try:
            driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                    capture_output=True, text=True, timeout=10, check=True).stdout.split()
        except (subprocess.SubprocessError, OSError):
            driver = []
    return {"python": platform.python_version(), "torch": torch, "driver": sorted(set(driver))}
