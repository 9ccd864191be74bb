"""GPU check: a short campaign on the GPT-2-small shape on this machine's GPU(s), one command.

    python benchmarks/gpu_check.py                       # on a machine with CUDA
    python benchmarks/gpu_check.py --fetch-wheels .gpu_wheels   # here, before carrying

It adapts workloads/gpt/campaign-gpu.toml to the machine (GPUs present, the device's
memory capacity; on one GPU the DDP bucket and sharding knobs are dropped), runs doctor, a
search of --budget trials (default 10) and verification against the untuned baseline, and
prints: baseline and promoted MFU, the verified speedup and its interval, the device
memory peak of both against the capacity, the loss tolerance doctor calibrated for each
numerics class (fp32, bf16), and every CUDA out-of-memory with its censored peak. If the
search ran into no OOM, one probe trial that cannot fit on any current GPU (the
GPT-2-medium shape at micro-batch 128 without recompute, fp32, naive attention) shows one.
Results land in --out (campaign folder, ``gpu_check.json``).

It needs only what a bare GPU box usually has (python, torch with CUDA, numpy, psutil)
plus pydantic, scipy, GitPython, tomlkit and pathspec. It runs without Ray (trials one at a time
from this process, ``infrarsi.harness.inprocess_pool``), without MLflow (the ledger is the record)
and without Prefect (the stages are called directly); it stages no branch. Where the
machine lacks these packages and reaches no registry, fetch their wheels here
(``--fetch-wheels DIR``, about 37 MiB for CPython 3.12 on x86-64 Linux), bring DIR along
and pass ``--wheels DIR`` there: the wheels are unpacked into DIR/site and put on the path.
On a machine without CUDA it stops at once with exit code 2.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GPU_SPEC = ROOT / "workloads" / "gpt" / "campaign-gpu.toml"
WHEELS = ("pydantic", "pydantic-core", "annotated-types", "typing-inspection", "typing-extensions", "scipy",
          "GitPython", "gitdb", "smmap", "tomlkit", "pathspec")
NEEDED_MODULES = ("numpy", "psutil", "pydantic", "scipy", "git", "tomlkit", "pathspec")
NO_CUDA_EXIT_CODE = 2
MISSING_PACKAGES_EXIT_CODE = 3
MFU_GOAL = 0.35  # issue 12: promoted MFU on an H200
# Knobs that act only between processes (DDP's gradient buckets, FSDP's sharding): on one
# GPU they change nothing, so the search would spend trials on them for noise.
MULTI_PROCESS_KNOBS = ("bucket_mb", "sharding")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--budget", type=int, default=10, help="search trials (default 10)")
    parser.add_argument("--verify-pairs", type=int, default=None, help="A/B pairs per finalist (spec: 3)")
    parser.add_argument("--finalists", type=int, default=None, help="configs verified against the baseline (spec: 2)")
    parser.add_argument("--proposer", default="engine", help="engine, tpe, gp, random or greedy")
    parser.add_argument("--spec", type=Path, default=GPU_SPEC, help="the GPU campaign spec to adapt")
    parser.add_argument("--out", type=Path, default=ROOT / "campaigns" / "gpu-check", help="campaign folder root")
    parser.add_argument("--wheels", type=Path, help="folder of wheels (from --fetch-wheels) to put on the path")
    parser.add_argument("--fetch-wheels", type=Path, metavar="DIR",
                        help="download the wheels a bare CPython 3.12 GPU box lacks into DIR, then exit")
    parser.add_argument("--no-oom-probe", action="store_true", help="skip the OOM probe trial")
    return parser.parse_args(argv)


def _pinned(name: str) -> str:
    """``name`` at the version installed here (the one the tests ran with), if any:
    pydantic pins its pydantic-core exactly, so the two must come as a pair."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return f"{name}=={version(name)}"
    except PackageNotFoundError:
        return name


def fetch_wheels(dest: Path) -> int:
    """Download the wheels (CPython 3.12, manylinux x86-64) with pip; numpy comes from the box."""
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--only-binary=:all:", "--no-deps", "--python-version", "3.12",
           "--implementation", "cp", "--platform", "manylinux2014_x86_64", "--platform", "manylinux_2_17_x86_64",
           "--platform", "manylinux_2_28_x86_64", "-d", str(dest), *map(_pinned, WHEELS)]
    code = subprocess.run(cmd).returncode
    size = sum(p.stat().st_size for p in dest.glob("*.whl"))
    print(f"gpu_check: {len(list(dest.glob('*.whl')))} wheels, {size / 2**20:.1f} MiB in {dest}")
    return code


def use_wheels(wheels: Path) -> None:
    """Unpack every wheel in ``wheels`` into wheels/site (a wheel is a zip of site-packages)
    and put it first on this process's path and its children's PYTHONPATH."""
    site = wheels / "site"
    for wheel in sorted(wheels.glob("*.whl")):
        marker = site / f".{wheel.name}.unpacked"
        if not marker.exists():
            with zipfile.ZipFile(wheel) as archive:
                archive.extractall(site)
            marker.touch()
    sys.path.insert(0, str(site))
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))


def preflight() -> tuple[int, str] | None:
    """(exit code, why) when this machine cannot run the check, else None."""
    try:
        import torch
    except ImportError:
        return NO_CUDA_EXIT_CODE, "torch is not installed; install the torch build for this machine's CUDA"
    if not torch.cuda.is_available():
        return NO_CUDA_EXIT_CODE, (f"no CUDA device here (torch {torch.__version__}, torch.cuda.is_available() is False); "
                "gpu_check measures GPU training: run it on a machine with an NVIDIA GPU")
    missing = []
    for module in NEEDED_MODULES:
        try:
            __import__(module)
        except ImportError as exc:  # GitPython raises ImportError too when the git binary is missing
            missing.append(f"{module} ({exc})")
    if shutil.which("git") is None:
        missing.append("the git program (init snapshots the workload into a git repository)")
    if missing:
        return MISSING_PACKAGES_EXIT_CODE, ("missing: " + "; ".join(missing) + ". Bring them as wheels: run `python benchmarks/gpu_check.py "
                "--fetch-wheels .gpu_wheels` on a machine with a registry, copy .gpu_wheels here and pass "
                "--wheels .gpu_wheels (the git module also needs the git program)")
    return None


def adapt_spec(data: dict, *, spec_dir: Path, num_gpus: int, capacity_bytes: int, budget: int,
               verify_pairs: int | None = None, finalists: int | None = None) -> dict:
    """The GPU spec for this machine: its GPUs and memory capacity, process counts that fit
    (on one GPU, without the knobs that act only between processes)."""
    data = json.loads(json.dumps(data))  # a deep copy of plain TOML data
    nproc = [n for n in data["knobs"]["nproc"]["values"] if n <= num_gpus]
    data["knobs"]["nproc"]["values"] = nproc
    if nproc == [1]:
        for name in MULTI_PROCESS_KNOBS:
            data["knobs"].pop(name, None)
            data["baseline"].pop(name, None)
        # A constraint that names a dropped knob has nothing left to constrain.
        data["constraints"] = [c for c in data.get("constraints", [])
                               if not any(re.search(rf"\b{name}\b", c) for name in MULTI_PROCESS_KNOBS)]
    data["calibration"] = [v for v in data.get("calibration", []) if v.get("nproc", 1) in nproc]
    data["workload_dir"] = str((spec_dir / data.get("workload_dir", ".")).resolve())
    data["device"]["memory_capacity"] = int(capacity_bytes)
    data["resources"]["gpus_per_trial"] = num_gpus
    data["resources"]["cpus_per_trial"] = min(float(data["resources"].get("cpus_per_trial", 1)), os.cpu_count() or 1)
    data["budget"]["num_trials"] = budget
    if verify_pairs:
        data["budget"]["verify_pairs"] = verify_pairs
    if finalists:
        data["budget"]["num_finalists"] = finalists
    return data


def write_spec(data: dict, path: Path) -> Path:
    import tomlkit

    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(tomlkit.dumps(data))
    return path


def run_campaign(spec_path: Path, out_root: Path, *, proposer: str, budget: int):
    """init, doctor, search, verification, minimization and the summary, Ray-free and MLflow-free."""
    from infrarsi.bank.campaign import campaign_experience
    from infrarsi.stages.doctor import run_doctor
    from infrarsi.stages.init import init_campaign
    from infrarsi.stages.run.evidence import plan_verification
    from infrarsi.stages.run.minimize import run_minimize
    from infrarsi.stages.run.search import run_search
    from infrarsi.stages.run.verify import run_verification
    from infrarsi.stages.runtime import CampaignRuntime, RuntimeSettings

    contract, cdir = init_campaign(spec_path, out_root)
    rt = CampaignRuntime(contract, cdir, RuntimeSettings(tracking_uri="none", in_process=True))
    try:
        doctor = run_doctor(rt)
        search = run_search(rt, doctor, proposer_name=proposer, num_trials=budget,
                            experience=campaign_experience(rt.settings.bank, rt))
        verification = run_verification(rt, doctor, plan_verification(rt, doctor, search.history, search.priors))
        run_minimize(rt, doctor, verification)
    finally:
        rt.close()
    return rt, cdir, doctor


def oom_probe(rt, capacity_bytes: int):
    """One trial that cannot fit on any current GPU, through the same launcher."""
    from infrarsi.core.trial import Role
    from infrarsi.harness.launcher import TrialRequest, run_process_trial

    argv = (sys.executable, "train.py", "--flavour", "gpt2-medium", "--seq-len", "1024", "--global-batch-tokens",
            str(128 * 1024), "--steps", "2", "--micro-batch", "128", "--checkpointing", "none", "--precision", "fp32",
            "--attention", "naive")
    req = TrialRequest(trial_id="oom-probe", config={"probe": "gpt2-medium micro-batch 128"}, role=Role.SEARCH,
                       argv=argv, env={}, cwd=str(rt.contract.workdir), trial_dir=str(rt.cdir.root / "oom-probe"),
                       memory_capacity_bytes=capacity_bytes, emulate_capacity=False, timeout_s=300, warmup_steps=1,
                       num_steps=2)
    return run_process_trial(req)


def _peak(trials, ids) -> int | None:
    peaks = [t.peak_memory_bytes for t in trials if t.trial_id in ids and t.peak_memory_bytes]
    return max(peaks) if peaks else None


def loss_tolerances(doctor) -> list[dict]:
    """The tolerance doctor calibrated for each numerics class, the baseline's first."""
    from infrarsi.contract.numerics import describe

    classes = doctor.loss_contract.classes
    return [{"class": describe(c.settings), "tolerance": c.tolerance, "honest_score": c.honest_score,
             "failure": c.failure} for c in classes]


def findings(cdir, doctor, probe) -> dict:
    """What the check prints, from the campaign folder."""
    from infrarsi.core.ledger import Ledger
    from infrarsi.core.trial import Outcome
    from infrarsi.record.campaign import promoted as promoted_verdict
    from infrarsi.record.campaign import read_contract
    from infrarsi.stages.report.summary import summarize

    summary = summarize(cdir)
    trials = Ledger(cdir.ledger).trials()
    promoted = promoted_verdict(cdir)
    capacity = int(read_contract(cdir).spec.device.memory_capacity)
    ooms = [t for t in trials if t.outcome is Outcome.OOM] + ([probe] if probe is not None else [])
    return {
        "campaign_dir": str(cdir.root),
        "baseline_step_time_s": summary["baseline_step_time_s"], "baseline_mfu": summary["baseline_mfu"],
        "promoted_config": summary["promoted_config"], "promoted_mfu": summary["promoted_mfu"],
        "promoted_step_time_s": statistics.median(promoted.candidate_times_s) if promoted else None,
        "verified_speedup": summary["verified_speedup"], "speedup_ci": summary["speedup_ci"],
        "mfu_basis": summary["mfu_basis"], "capacity_bytes": capacity,
        "baseline_peak_bytes": doctor.peak_memory_bytes,
        "promoted_peak_bytes": _peak(trials, {c for _, c in promoted.pairs}) if promoted else None,
        "loss_tolerances": loss_tolerances(doctor), "loss_tolerance_source": doctor.loss_tolerance_source,
        "calibration": [dict(row) for row in doctor.calibration],
        "trials_by_outcome": summary["trials_by_outcome"],
        "ooms": [{"trial_id": t.trial_id, "config": dict(t.config), "censored_peak_bytes": t.peak_memory_bytes,
                  "reason": t.reason} for t in ooms if t.outcome is Outcome.OOM],
        "probe_outcome": probe.outcome.value if probe is not None else None,
    }


def _gib(n: int | None) -> str:
    return "-" if n is None else f"{n / 2**30:.2f} GiB"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.1%}"


def print_loss_tolerances(source: str, tolerances: list[dict]) -> None:
    print(f"loss tolerance per numerics class ({source}):")
    for c in tolerances:
        measured = f"no reference: {c['failure']}" if c["failure"] else f"largest honest score {c['honest_score']:.3g}"
        print(f"  {c['class']}: {c['tolerance']:.3g} ({c['tolerance']:.4%}; {measured})")


def print_findings(f: dict) -> None:
    print(f"campaign: {f['campaign_dir']}")
    basis = f["mfu_basis"]
    if basis:
        print(f"MFU against {basis['num_devices']} x {basis['accelerator']} ({basis['device_name']}) at "
              f"{basis['peak_flops_per_device'] / 1e12:,.0f} TFLOP/s dense bf16")
    print(f"baseline: {f['baseline_step_time_s']:.3f} s/step, MFU {_pct(f['baseline_mfu'])}, "
          f"device peak {_gib(f['baseline_peak_bytes'])} of {_gib(f['capacity_bytes'])}")
    if f["verified_speedup"]:
        lo, hi = f["speedup_ci"]
        print(f"promoted: {f['promoted_config']}")
        print(f"  {f['promoted_step_time_s']:.3f} s/step, MFU {_pct(f['promoted_mfu'])}, "
              f"device peak {_gib(f['promoted_peak_bytes'])} of {_gib(f['capacity_bytes'])}")
        print(f"  verified speedup {f['verified_speedup']:.2f}x (90% interval {lo:.2f}x - {hi:.2f}x)")
        if f["promoted_mfu"] is not None:
            print(f"  goal promoted MFU >= {MFU_GOAL:.0%}: {'met' if f['promoted_mfu'] >= MFU_GOAL else 'not met'}")
    else:
        print("promoted: nothing cleared verification; the baseline stands")
    print_loss_tolerances(f["loss_tolerance_source"], f["loss_tolerances"])
    print(f"trials by outcome: {f['trials_by_outcome']}")
    for oom in f["ooms"]:
        print(f"OOM {oom['trial_id']}: censored peak >= {_gib(oom['censored_peak_bytes'])} "
              f"(capacity {_gib(f['capacity_bytes'])}): {oom['reason']}")
    if not f["ooms"]:
        print("no CUDA OOM was recorded")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.fetch_wheels:
        return fetch_wheels(args.fetch_wheels)
    if args.wheels:
        use_wheels(args.wheels.resolve())
    problem = preflight()
    if problem:
        code, why = problem
        print(f"gpu_check: {why}", file=sys.stderr)
        return code
    sys.path.insert(0, str(ROOT))
    import torch

    capacity = torch.cuda.get_device_properties(0).total_memory
    data = adapt_spec(tomllib.loads(args.spec.read_text()), spec_dir=args.spec.resolve().parent,
                      num_gpus=torch.cuda.device_count(), capacity_bytes=capacity, budget=args.budget,
                      verify_pairs=args.verify_pairs, finalists=args.finalists)
    args.out.mkdir(parents=True, exist_ok=True)
    spec_path = write_spec(data, args.out / f"{data['name']}-{torch.cuda.device_count()}gpu.toml")
    rt, cdir, doctor = run_campaign(spec_path, args.out, proposer=args.proposer, budget=args.budget)
    from infrarsi.core.ledger import Ledger
    from infrarsi.core.trial import Outcome

    probe = None
    if not args.no_oom_probe and not any(t.outcome is Outcome.OOM for t in Ledger(cdir.ledger).trials()):
        probe = oom_probe(rt, capacity)
        Ledger(cdir.root / "oom_probe.jsonl").append_trial(probe)
    result = findings(cdir, doctor, probe)
    cdir.write_json(cdir.root / "gpu_check.json", result)
    print_findings(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
