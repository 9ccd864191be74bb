"""Device memory on a trial with GPUs: measured per process of the trial's tree on its
devices, against the device's capacity, with host RSS kept apart.

On CPU the NVML path runs behind its interface: ``TreeDeviceGauge`` over a stand-in source
that reads, for real processes of the job's tree (and one foreign process), what each
"holds" on each device, in NVML's per-process shape. A ``gpu`` test uses real NVML.
"""

import functools
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from infrarsi.core.trial import Outcome, Role
from infrarsi.harness.device_memory import DeviceMemoryUnavailable, NvmlSource, TreeDeviceGauge, open_nvml_gauge
from infrarsi.harness.launcher import TrialRequest, run_process_trial

DEVICE_JOB = str(Path(__file__).parent / "jobs" / "device_job.py")
MB, GIB = 2**20, 2**30


class DirectorySource:
    """NVML's per-process view, read from files <root>/<device>/<pid> the processes write."""

    def __init__(self, root: Path, total_bytes: int, num_devices: int = 2) -> None:
        self.root, self.total, self.num_devices = root, total_bytes, num_devices

    def total_bytes(self, device: int) -> int:
        return self.total

    def process_bytes(self, device: int) -> dict[int, int]:
        folder = self.root / str(device)
        out = {}
        for f in folder.glob("[0-9]*") if folder.is_dir() else []:
            if f.suffix != ".tmp" and psutil.pid_exists(int(f.name)):  # NVML lists live processes only
                out[int(f.name)] = int(f.read_text())
        return out

    def close(self) -> None:
        pass


def _gauge(root: Path, total: int, env) -> TreeDeviceGauge:
    return TreeDeviceGauge(DirectorySource(root, total))


def _trial(tmp_path, *args, capacity=2**40, total=GIB, emulate=True, gpus=1):
    root = tmp_path / "devices"
    root.mkdir(exist_ok=True)
    # A process outside the trial holding 10 GiB on device 0: never the trial's memory.
    (root / "0").mkdir(exist_ok=True)
    (root / "0" / str(os.getpid())).write_text(str(10 * GIB))
    return run_process_trial(TrialRequest(
        trial_id="t1", config={}, role=Role.SEARCH, argv=(sys.executable, DEVICE_JOB, "--root", str(root), *args),
        env={}, cwd=str(tmp_path), trial_dir=str(tmp_path / "t1"), memory_capacity_bytes=capacity,
        emulate_capacity=emulate, timeout_s=60, warmup_steps=1, num_steps=6, gpus_per_trial=gpus,
        device_gauge=functools.partial(_gauge, root, total)))


def test_the_gauge_sums_a_trials_processes_per_device_and_takes_the_fullest(tmp_path):
    source = DirectorySource(tmp_path, GIB)
    for device, pid, mb in [(0, 1, 100), (0, 2, 100), (1, 3, 150), (0, 4, 999)]:
        (tmp_path / str(device)).mkdir(exist_ok=True)
        (tmp_path / str(device) / str(pid)).write_text(str(mb * MB))
    gauge = TreeDeviceGauge(source)
    assert gauge.capacity_bytes() == GIB
    # pids 1..4 are real on Linux (init and kernel threads) but the test only names them
    assert gauge.used_bytes([1, 2, 3]) == 200 * MB  # device 0: two ranks share it
    assert gauge.used_bytes([3]) == 150 * MB and gauge.used_bytes([]) == 0


def test_a_gpu_trial_records_its_device_peak_apart_from_host_rss(tmp_path):
    r = _trial(tmp_path, "--hold", "1:150", "--children", "0:100,0:100")
    assert r.outcome is Outcome.OK, r.reason
    assert r.peak_memory_bytes == 200 * MB  # device 0 holds the two children; the foreign 10 GiB is not ours
    assert r.extra["memory_gauge"] == "device" and r.extra["device_peak_bytes"] == 200 * MB
    assert 0 < r.host_peak_rss_bytes < 200 * MB  # the processes' real resident sets, a separate field
    assert r.memory_capacity_bytes == GIB  # the device's, not the spec's 1 TiB


def test_crossing_a_lower_emulated_capacity_kills_the_tree_as_an_oom(tmp_path):
    r = _trial(tmp_path, "--hold", "0:100", "--children", "1:50", "--grow-mb", "100", capacity=300 * MB)
    assert r.outcome is Outcome.OOM and r.censored
    assert r.memory_capacity_bytes == 300 * MB and r.peak_memory_bytes > 300 * MB
    live = [int(f.name) for d in (tmp_path / "devices").iterdir() for f in d.iterdir()
            if int(f.name) != os.getpid() and psutil.pid_exists(int(f.name))]
    deadline = time.time() + 5
    while any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in live):
        assert time.time() < deadline, "a process of the killed trial survived"
        time.sleep(0.05)


def test_an_allocator_out_of_memory_message_is_an_oom_at_the_devices_capacity(tmp_path):
    r = _trial(tmp_path, "--oom-message", total=GIB)
    assert r.outcome is Outcome.OOM and r.peak_memory_bytes == GIB == r.memory_capacity_bytes


def test_without_nvml_a_gpu_trial_says_its_device_memory_was_not_measured(tmp_path):
    try:
        open_nvml_gauge({}).close()
        pytest.skip("NVML works here; the fallback is for machines without it")
    except DeviceMemoryUnavailable:
        pass
    req = TrialRequest(
        trial_id="t1", config={}, role=Role.SEARCH, argv=(sys.executable, DEVICE_JOB, "--root", str(tmp_path)),
        env={}, cwd=str(tmp_path), trial_dir=str(tmp_path / "t1"), memory_capacity_bytes=GIB, emulate_capacity=True,
        timeout_s=60, warmup_steps=1, num_steps=6, gpus_per_trial=1)
    r = run_process_trial(req)
    assert r.outcome is Outcome.OK, r.reason
    assert r.extra["memory_gauge"] == "host_rss" and "device memory not measured" in r.extra["memory_note"]


def _cuda_available() -> bool:
    return shutil.which("nvidia-smi") is not None and subprocess.run(
        ["nvidia-smi", "-L"], capture_output=True).returncode == 0


@pytest.mark.gpu
@pytest.mark.skipif(not _cuda_available(), reason="needs an NVIDIA GPU")
def test_real_nvml_measures_a_cuda_jobs_device_memory(tmp_path):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA here")
    job = tmp_path / "cuda_job.py"
    job.write_text(
        "import json, os, time, torch\n"
        "x = torch.empty(512 * 2**20, dtype=torch.uint8, device='cuda')\n"
        "out = open(os.environ['INFRARSI_METRICS_FILE'], 'a')\n"
        "for s in range(6):\n"
        "    time.sleep(0.1)\n"
        "    out.write(json.dumps({'event': 'step', 'step': s, 'loss': 1.0, 'tokens': 64}) + '\\n'); out.flush()\n")
    source = NvmlSource(None)
    total = source.total_bytes(0)
    source.close()
    r = run_process_trial(TrialRequest(
        trial_id="gpu", config={}, role=Role.SEARCH, argv=(sys.executable, str(job)), env={}, cwd=str(tmp_path),
        trial_dir=str(tmp_path / "gpu"), memory_capacity_bytes=2**50, emulate_capacity=True, timeout_s=120,
        warmup_steps=1, num_steps=6, gpus_per_trial=1))
    assert r.outcome is Outcome.OK, r.reason
    assert r.extra["memory_gauge"] == "device"
    assert 512 * MB <= r.peak_memory_bytes < 4 * GIB  # the tensor plus the CUDA context
    assert r.memory_capacity_bytes == total
    assert r.host_peak_rss_bytes != r.peak_memory_bytes
