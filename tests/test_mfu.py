"""MFU: the accelerator table, the formula against a figure measured on an H200, and the
campaign summary's fields (omitted on CPU, never invented)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from infrarsi.record.doctor import DoctorReport
from infrarsi.record.verification import Verdict
from infrarsi.stages.report.accelerators import detect_device_names, lookup
from infrarsi.stages.report.mfu import campaign_mfu, mfu

REPO_ROOT = Path(__file__).resolve().parents[1]


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


@pytest.mark.parametrize(("reported", "name", "tflops"), [
    ("NVIDIA H100 80GB HBM3", "H100 SXM", 989), ("NVIDIA H100 PCIe", "H100 PCIe", 756),
    ("NVIDIA H100 NVL", "H100 NVL", 835), ("NVIDIA H200", "H200 SXM", 989), ("NVIDIA H200 NVL", "H200 NVL", 835),
    ("NVIDIA A100-SXM4-40GB", "A100", 312), ("NVIDIA A100 80GB PCIe", "A100", 312), ("NVIDIA L40S", "L40S", 362.05),
    ("NVIDIA L4", "L4", 121), ("AMD Instinct MI300X", "MI300X", 1307.4), ("NVIDIA B200", "B200", 2250),
    ("NVIDIA GH200 480GB", "GH200", 989),  # contains "H200": the longer match wins
])
def test_the_table_knows_accelerators_by_their_reported_names(reported, name, tflops):
    entry = lookup(reported)
    assert entry is not None and entry.name == name and entry.peak_bf16_flops == tflops * 1e12


def test_an_unknown_device_has_no_peak():
    assert lookup("NVIDIA GeForce RTX 4090") is None and lookup("Intel(R) Xeon(R) CPU") is None


def test_mfu_reproduces_the_gpt2_small_figures_measured_on_an_h200():
    from workloads.gpt.flavours import flops_per_token, get_flavour

    # STACK_NOTES: 65,536 tokens per step; the untuned baseline 1.94 s/step (2.9% MFU), the
    # compiled bf16 config at micro-batch 16 0.151 s/step (37.8%), both against 989 TFLOP/s.
    flops = flops_per_token(get_flavour("gpt2-small"), 1024)
    h200 = lookup("NVIDIA H200").peak_bf16_flops
    args = dict(flops_per_token=flops, tokens_per_step=65536, num_devices=1, peak_flops_per_device=h200)
    assert mfu(step_time_s=1.94, **args) == pytest.approx(0.029, abs=0.0005)
    assert mfu(step_time_s=0.151, **args) == pytest.approx(0.378, abs=0.005)


def _campaign(resources, hardware_gpus, start):
    spec = {"resources": resources, "contract": {"global_batch_tokens": 65536}}
    doctor = DoctorReport(baseline={}, trial_ids=("t0001", "t0002"), step_time_s=2.0, run_step_times_s=(2.0, 2.0),
                          noise_cv=0.0, within_run_cv=0.0, reference_losses=(), loss_tolerance=0.0,
                          loss_tolerance_source="", calibration=(), peak_memory_bytes=0, phases_s={},
                          tokens_per_step=None)
    promoted = Verdict(config={}, source_trial_id="t0010", pairs=(("t0020", "t0021"), ("t0022", "t0023")),
                       baseline_times_s=(2.0, 2.0), candidate_times_s=(0.19, 0.21, 0.2), speedup=10.0, ci_low=9.0,
                       ci_high=11.0, promoted=True, reason="")
    starts = {t: start for t in ("t0001", "t0002", "t0010", "t0021", "t0023")}
    return campaign_mfu(spec=spec, hardware={"gpus": hardware_gpus}, starts=starts, doctor=doctor, promoted=promoted)


def test_campaign_mfu_for_baseline_and_promoted_on_a_known_gpu():
    out = _campaign({"gpus_per_trial": 1}, ["NVIDIA H200, 143771 MiB"], {"flops_per_token": 1e9})
    assert out["baseline_mfu"] == pytest.approx(1e9 * 65536 / 2.0 / 989e12)
    assert out["promoted_mfu"] == pytest.approx(1e9 * 65536 / 0.2 / 989e12)  # median of the verified runs
    assert out["mfu_basis"] == {"accelerator": "H200 SXM", "device_name": "NVIDIA H200",
                                "peak_flops_per_device": 989e12, "num_devices": 1, "peak_source": "table"}


def test_the_jobs_device_name_and_the_specs_figures_take_precedence():
    start = {"flops_per_token": 1e9, "device_name": "NVIDIA A100-SXM4-80GB"}
    out = _campaign({"gpus_per_trial": 4, "nodes_per_trial": 2}, ["NVIDIA H200, 143771 MiB"], start)
    assert out["mfu_basis"]["accelerator"] == "A100" and out["mfu_basis"]["num_devices"] == 8
    spec_peak = _campaign({"gpus_per_trial": 1, "peak_flops_per_device": 1e15, "flops_per_token": 2e9},
                          ["Some New GPU"], {})
    assert spec_peak["baseline_mfu"] == pytest.approx(2e9 * 65536 / 2.0 / 1e15)
    assert spec_peak["mfu_basis"]["peak_source"] == "spec"


@pytest.mark.parametrize(("resources", "gpus", "start"), [
    ({"gpus_per_trial": 0}, [], {"flops_per_token": 1e9}),  # trials on CPU
    ({"gpus_per_trial": 1}, ["NVIDIA GeForce RTX 4090, 24564 MiB"], {"flops_per_token": 1e9}),  # unknown peak
])
def test_mfu_is_omitted_where_it_cannot_be_measured(resources, gpus, start):
    assert _campaign(resources, gpus, start) == {"baseline_mfu": None, "promoted_mfu": None, "mfu_basis": None}
    no_flops = _campaign({"gpus_per_trial": 1}, ["NVIDIA H200, 143771 MiB"], {})
    assert no_flops["mfu_basis"] is not None and no_flops["baseline_mfu"] is None


def test_a_campaign_on_a_known_gpu_puts_its_mfu_in_the_report_and_on_the_mlflow_parent_run(tmp_path):
    """A simulated campaign of 8 H100s whose spec names the accelerator and the model FLOPs
    (the simulator's trials report no start event), run in process without Ray."""
    from mlflow.tracking import MlflowClient
    from staged_campaign import run_staged

    from infrarsi.stages.report.summary import summarize

    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    cdir = run_staged(tmp_path, name="sim-mfu", proposer="random", store=store, num_trials=4, in_process=True,
                      resources='gpus_per_trial = 8\naccelerator = "NVIDIA H100 80GB HBM3"\nflops_per_token = 6e10')
    summary = summarize(cdir)
    tokens = cdir.read_json(cdir.contract)["spec"]["contract"]["global_batch_tokens"]
    assert summary["baseline_mfu"] == pytest.approx(6e10 * tokens / summary["baseline_step_time_s"] / (8 * 989e12))
    assert summary["promoted_mfu"] is not None  # the random search finds a verified speedup on this job
    mfu_line = next(line for line in cdir.report_md.read_text().splitlines() if "MFU:" in line)
    assert (f"MFU: baseline {summary['baseline_mfu']:.1%}, promoted {summary['promoted_mfu']:.1%} "
            "(against 8 x H100 SXM at 989 TFLOP/s dense bf16, from the table)") in mfu_line
    client = MlflowClient(store)
    [parent] = client.search_runs([e.experiment_id for e in client.search_experiments()],
                                  "tags.`infrarsi.kind` = 'campaign'")
    assert parent.data.metrics["baseline_mfu"] == pytest.approx(summary["baseline_mfu"])
    assert parent.data.metrics["promoted_mfu"] == pytest.approx(summary["promoted_mfu"])


@pytest.mark.skipif("_cuda()", reason="checks the CPU answer")
def test_a_machine_without_gpus_reports_no_device_names():
    assert detect_device_names() == []


@pytest.mark.gpu
@pytest.mark.skipif("not _cuda()", reason="needs a CUDA device")
def test_on_a_gpu_the_job_names_its_device_and_the_table_knows_it(tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    subprocess.run([sys.executable, "workloads/gpt/train.py", "--flavour", "tiny", "--seq-len", "64",
                    "--global-batch-tokens", "1024", "--steps", "2"], cwd=REPO_ROOT, check=True, timeout=300,
                   env={**os.environ, "INFRARSI_METRICS_FILE": str(metrics)})
    start = json.loads(metrics.read_text().splitlines()[0])
    assert start["device"].startswith("cuda") and start["device_name"] in detect_device_names()
    assert lookup(start["device_name"]) is not None, f"add {start['device_name']!r} to infrarsi/stages/report/accelerators.py"
