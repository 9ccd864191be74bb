"""benchmarks/gpu_check.py on a CPU machine: its help, its refusal, the spec it adapts, and
its Ray-free, MLflow-free campaign path on the tiny GPT (the CUDA run itself is marked gpu)."""

import contextlib
import importlib.util
import io
import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from infrarsi.contract.spec_load import load_spec, parse_spec
from infrarsi.core.trial import Outcome, Role

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu_check.py"


def _load():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def _run(*args, timeout=120):
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "PYTHONPATH": str(ROOT)})


def test_help_describes_the_one_command():
    out = _run("--help")
    assert out.returncode == 0
    assert "--budget" in out.stdout and "--wheels" in out.stdout and "--fetch-wheels" in out.stdout


@pytest.mark.skipif("_cuda()", reason="checks the refusal on a machine without CUDA")
def test_on_a_cpu_machine_it_stops_at_once_and_says_why(tmp_path):
    out = _run("--out", str(tmp_path))
    assert out.returncode == 2
    assert "no CUDA device here" in out.stderr and "run it on a machine with an NVIDIA GPU" in out.stderr
    assert list(tmp_path.iterdir()) == []  # nothing started


def test_the_gpu_spec_loads_and_adapts_to_a_one_gpu_machine(tmp_path):
    spec_path = ROOT / "workloads" / "gpt" / "campaign-gpu.toml"
    spec = load_spec(spec_path)
    assert spec.resources.gpus_per_trial == 8 and not spec.device.emulate_capacity
    assert {"micro_batch", "checkpointing", "precision", "compile", "optimizer", "attention", "nproc", "bucket_mb",
            "sharding"} <= set(spec.knobs)
    gpu_check = _load()
    data = gpu_check.adapt_spec(tomllib.loads(spec_path.read_text()), spec_dir=spec_path.parent, num_gpus=1,
                                capacity_bytes=150_754_820_096, budget=10, verify_pairs=None)
    adapted = parse_spec(data, source="adapted", base_dir=tmp_path)
    assert adapted.knobs["nproc"].values == [1] and adapted.resources.gpus_per_trial == 1
    # DDP's buckets and FSDP's sharding do nothing in one process: not searched on one GPU.
    assert not {"bucket_mb", "sharding"} & (set(adapted.knobs) | set(adapted.baseline))
    assert adapted.constraints == ["micro_batch * nproc <= 64"]  # the one naming them went with them
    assert {"nproc": 2} not in adapted.calibration and {"precision": "bf16"} in adapted.calibration
    assert int(adapted.device.memory_capacity) == 150_754_820_096 and adapted.budget.num_trials == 10
    assert adapted.workload_dir == spec_path.parent
    two = gpu_check.adapt_spec(tomllib.loads(spec_path.read_text()), spec_dir=spec_path.parent, num_gpus=2,
                               capacity_bytes=150_754_820_096, budget=10)
    assert two["knobs"]["nproc"]["values"] == [1, 2] and {"bucket_mb", "sharding"} <= set(two["knobs"])
    # With two processes they are searched, but only where there are two processes.
    feasible = parse_spec(two, source="adapted", base_dir=tmp_path).space.feasible
    assert {(c["bucket_mb"], c["sharding"]) for c in feasible if c["nproc"] == 1} == {(25, "ddp")}
    assert len({(c["bucket_mb"], c["sharding"]) for c in feasible if c["nproc"] == 2}) > 1



@pytest.mark.slow
def test_the_gpu_specs_doctor_calibrates_a_tolerance_per_numerics_class(tmp_path):
    """The GPU spec's loss contract as shipped, on the tiny flavour at seq 64: fp32 held to
    2 x its honest splits' largest score (at least 3e-6), bf16 to its own reference and
    in-class splits, never below fp32's; gpu_check reports and prints both."""
    from infrarsi.stages.doctor import run_doctor
    from infrarsi.stages.init import init_campaign
    from infrarsi.stages.runtime import CampaignRuntime, RuntimeSettings

    spec_path = ROOT / "workloads" / "gpt" / "campaign-gpu.toml"
    gpu_check = _load()
    data = gpu_check.adapt_spec(tomllib.loads(spec_path.read_text()), spec_dir=spec_path.parent, num_gpus=1,
                                capacity_bytes=2**32, budget=1)
    data["command"] = [{"gpt2-small": "tiny"}.get(a, a) for a in data["command"]] + ["--threads", "1"]
    data["contract"].update(seq_len=64, global_batch_tokens=1024, num_steps=4, warmup_steps=1)
    data["resources"].update(gpus_per_trial=0, cpus_per_trial=1)
    data["budget"].update(doctor_max_repeats=3)  # the tolerances are the subject, not the noise estimate
    contract, cdir = init_campaign(gpu_check.write_spec(data, tmp_path / "gpu-tiny.toml"), tmp_path / "out")
    rt = CampaignRuntime(contract, cdir, RuntimeSettings(tracking_uri="none", in_process=True))
    try:
        doctor = run_doctor(rt)
    finally:
        rt.close()
    fp32, bf16 = gpu_check.loss_tolerances(doctor)
    assert (fp32["class"], bf16["class"]) == ("the baseline's numerics", "precision=bf16")
    assert fp32["tolerance"] == max(3e-6, 2 * fp32["honest_score"])
    assert bf16["tolerance"] == max(fp32["tolerance"], 2 * bf16["honest_score"]) and not bf16["failure"]
    splits = {(row["class"], json.dumps(row["config"], sort_keys=True)) for row in doctor.calibration}
    for split in ({"micro_batch": 16}, {"attention": "sdpa"}):  # nproc 2 needs a second GPU
        assert ("the baseline's numerics", json.dumps(split, sort_keys=True)) in splits
        assert ("precision=bf16", json.dumps({"precision": "bf16", **split}, sort_keys=True)) in splits
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        gpu_check.print_loss_tolerances(doctor.loss_tolerance_source, [fp32, bf16])
    assert f"  precision=bf16: {bf16['tolerance']:.3g} (" in printed.getvalue()

TINY_SPEC = """
name = "tiny-inprocess"
workload_dir = "{workload_dir}"
repository = "copy"
command = ["{{python}}", "train.py", "--flavour", "tiny", "--seq-len", "{{seq_len}}",
           "--global-batch-tokens", "{{global_batch_tokens}}", "--steps", "{{num_steps}}", "--seed", "{{seed}}",
           "--checkpointing", "full", "--attention", "naive", "--threads", "1", "--micro-batch", "{{micro_batch}}"]
# Sixteen micro-steps against two: the one search trial must beat the baseline by more than
# the practical margin even when a load spike hits its three timed steps (at 2 against 8,
# when doctor's noise floor was the bar, one in a suite run did not).
baseline = {{ micro_batch = 1 }}

[knobs.micro_batch]
values = [1, 8]
placeholder = true

[contract]
seq_len = 64
global_batch_tokens = 1024
num_steps = 4
warmup_steps = 1
editable = ["model.py", "train.py"]
locked = ["data.py", "metrics.py", "flavours.py"]

[device]
memory_capacity = "2GiB"

[resources]
max_remeasures = 0  # this test is about the path, not the timing (the machine may be loaded)

[budget]
num_trials = 1
doctor_repeats = 3
num_finalists = 1
verify_pairs = 2

[search]
patch_rounds = 0  # the one search trial is micro-batch 8, not a patch measurement
"""


@pytest.mark.slow
def test_its_campaign_runs_without_ray_or_mlflow_on_the_tiny_gpt(tmp_path):
    spec_path = tmp_path / "tiny.toml"
    spec_path.write_text(TINY_SPEC.format(workload_dir=ROOT / "workloads" / "gpt"))
    gpu_check = _load()
    rt, cdir, doctor = gpu_check.run_campaign(spec_path, tmp_path / "out", proposer="random", budget=1)
    findings = gpu_check.findings(cdir, doctor, None)
    trials = rt.ledger.trials()
    assert [t.role for t in trials[:3]] == [Role.DOCTOR] * 3 and all(t.outcome is Outcome.OK for t in trials)
    assert sum(t.role is Role.SEARCH for t in trials) == 1
    assert sum(t.role in (Role.VERIFY, Role.VERIFY_BASELINE) for t in trials) >= 4  # 2 pairs at least
    assert not (cdir.root / "mlflow.db").exists()  # no tracking store was created
    assert findings["baseline_mfu"] is None and findings["mfu_basis"] is None  # CPU: omitted
    assert findings["baseline_step_time_s"] == doctor.step_time_s and findings["ooms"] == []


# A shortened check that still searches and verifies: about 20 trials (8 in doctor, 6 in
# the search, 2 pairs and their references in verification, the OOM probe), expected to
# take about 15 minutes on one H200 (docs/gpu.md). pyproject's 900 s limit would cut it short:
# it has its own, above the subprocess's, so a hung check ends as the subprocess's timeout.
@pytest.mark.gpu
@pytest.mark.timeout(2700)
@pytest.mark.skipif("not _cuda()", reason="needs a CUDA device")
def test_the_gpu_check_runs_end_to_end_on_a_gpu(tmp_path):
    out = _run("--budget", "6", "--finalists", "1", "--verify-pairs", "2", "--out", str(tmp_path), timeout=2400)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "baseline:" in out.stdout and "MFU" in out.stdout and "OOM" in out.stdout
