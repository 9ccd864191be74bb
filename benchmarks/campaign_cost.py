"""What the trust machinery costs: trials per stage and error rates, the protocol before
sequential verification beside the one after it.

The *old* protocol is the code at ``OLD_COMMIT`` (doctor, search, two finalists x five
interleaved pairs, then leave-one-out minimization in three rounds of its own); the *new*
one is this tree's (the search sees doctor's calibration runs, verification stops each
arm when its sequential test decides, and minimization measures only what the time model
cannot call, in verification's own rounds). Each part runs both side by side:

1. ``rule``: the verification rule alone, on simulated pairs (the noise model of
   ``tests/test_promotion.py``): promotion rate and mean pairs of the fixed five-pair rule
   (re-implemented here as ``OLD_COMMIT`` had it) and of ``infrarsi.stages.run.sequential``, per
   noise level and true speedup.
2. ``sim``: whole campaigns on the simulator (``backend = "sim"``, trials one at a time in
   this process: no Prefect, Ray or MLflow), each protocol run from its own code (the old
   one from an export of ``OLD_COMMIT`` put first on ``PYTHONPATH``), at simulator noise
   levels set through ``infrarsi.sim.backend.NOISE_SIGMA``. Per campaign: trials per
   stage, and the promoted config's true speedup from the simulator's noise-free times.
   Each workload also runs *tuned*: its baseline is the oracle's best config, so nothing
   is truly faster and every promotion is a false one.
3. ``cpu``: the README's default campaign (``infrarsi campaign --json --fresh-doctor``) on
   this machine, in a fresh data folder and a cold torch.compile cache per run, through
   each protocol's own CLI. ``--keep DIR`` copies each run's campaign folder (its ledger,
   summary and reports; not its trials' logs) to ``DIR`` before the temporary folder goes.

    python benchmarks/campaign_cost.py rule sim --seeds 2 --out docs/benchmark/campaign_cost
    python benchmarks/campaign_cost.py cpu --cpu-runs 3 --protocols new --out docs/benchmark/campaign_cost

Results are merged into ``OUT/results.json`` (a part run again replaces its rows) and the
tables rewritten to ``OUT/results.md``.
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
OLD_COMMIT = "53ce622"  # the last commit before sequential verification
NOISE_LEVELS = [(0.003, 0.13), (0.01, 0.05), (0.035, 0.05), (0.15, 0.10)]  # (run CV, step CV), as the tests
SPEEDUPS = [1.0, 1.15, 1.3, 1.5, 2.0, 3.0]
SIM_WORKLOADS = ["dense-9b-h100", "dense-27b-h200", "moe-26b-a4b-h200", "llama3-8b-a100"]
SIM_NOISE = [0.003, 0.01, 0.035, 0.15]
STAGES = ("doctor", "search", "verification", "minimization")
OLD_PAIRS = 5  # OLD_COMMIT's budget.verify_pairs: every finalist ran all of them


# ---- part 1: the rule ---------------------------------------------------------------------
def _fixed_rule(x: list[float], floor: float) -> bool:
    """The rule before: five pairs, a two-sided 90% t interval on the mean log ratio, promoted
    when its lower end clears log(1 + max(floor, the pairs' own per-run noise))."""
    from scipy import stats

    sd = statistics.stdev(x)
    floor = max(floor, sd / math.sqrt(2))
    low = stats.t.interval(0.90, len(x) - 1, loc=statistics.fmean(x), scale=sd / math.sqrt(len(x)))[0]
    return low > math.log1p(floor)


def rule_part(num_repeats: int) -> list[dict]:
    sys.path.insert(0, str(ROOT / "tests"))
    from test_promotion import MAX_PAIRS, _doctor_floor, verify

    from infrarsi.stages.run.sequential import SequentialRule

    rows = []
    # At the threshold: the floor fixed at 3%, the true speedup exactly 1.03, no drift. The
    # rate is each rule's false-promotion rate at the edge of what it may promote.
    rng, floor = np.random.default_rng(12), 0.03
    old = new = pairs = 0
    for _ in range(num_repeats * 10):
        x = list(math.log1p(floor) + rng.normal(0, 0.02, MAX_PAIRS))  # per-run noise 1.4%: under the floor
        old += _fixed_rule(x[:OLD_PAIRS], floor)
        ok, n = verify(x, floor, SequentialRule(max_pairs=MAX_PAIRS))
        new, pairs = new + ok, pairs + n
    rows.append({"run_cv": None, "step_cv": None, "speedup": 1 + floor, "old_rate": old / num_repeats / 10,
                 "new_rate": new / num_repeats / 10, "old_pairs": OLD_PAIRS, "new_pairs": pairs / num_repeats / 10})
    print(json.dumps(rows[-1]), flush=True)
    for run_cv, step_cv in NOISE_LEVELS:
        for speedup in SPEEDUPS:
            rng = np.random.default_rng(11)
            old = new = pairs = 0
            for _ in range(num_repeats):
                floor = _doctor_floor(rng, run_cv, step_cv)
                drift = np.exp(np.cumsum(rng.normal(0, 0.05, MAX_PAIRS)))
                base, cand = (drift * rng.lognormal(0, run_cv, MAX_PAIRS),
                              drift / speedup * rng.lognormal(0, run_cv, MAX_PAIRS))
                x = [math.log(b / c) for b, c in zip(base, cand)]
                old += _fixed_rule(x[:OLD_PAIRS], floor)
                ok, n = verify(x, floor, SequentialRule(max_pairs=MAX_PAIRS))  # the default budget.verify_pairs
                new, pairs = new + ok, pairs + n
            rows.append({"run_cv": run_cv, "step_cv": step_cv, "speedup": speedup, "old_rate": old / num_repeats,
                         "new_rate": new / num_repeats, "old_pairs": OLD_PAIRS, "new_pairs": pairs / num_repeats})
            print(json.dumps(rows[-1]), flush=True)
    return rows


# ---- part 2: simulated campaigns ----------------------------------------------------------
def _stage(role: str, job_seed) -> str:
    if role in ("doctor", "calibrate"):
        return "doctor" if role == "doctor" or job_seed is None else "verification"
    if role == "search":
        return "search"
    return "minimization" if role.startswith("minimize") else "verification"


def worker(protocol: str, spec_path: Path, out: Path, noise: float) -> dict:
    """One campaign in this process with whichever ``infrarsi`` is first on the path (each
    protocol's code has its own module layout)."""
    import importlib

    import infrarsi.sim.backend as sim_backend
    from infrarsi.sim.cost import estimate
    from infrarsi.sim.job import columns
    from infrarsi.sim.workloads import workload

    if protocol == "old":
        def stage(name):
            return importlib.import_module({"runtime": "infrarsi.runtime", "ledger": "infrarsi.ledger"}.get(
                name, f"infrarsi.stages.{name}"))
    else:
        def stage(name):
            return importlib.import_module({"runtime": "infrarsi.stages.runtime", "ledger": "infrarsi.core.ledger",
                                            "doctor": "infrarsi.stages.doctor", "init": "infrarsi.stages.init"}.get(
                name, f"infrarsi.stages.run.{name}"))
    Ledger, runtime = stage("ledger").Ledger, stage("runtime")
    CampaignRuntime, RuntimeSettings = runtime.CampaignRuntime, runtime.RuntimeSettings
    init_campaign, run_doctor = stage("init").init_campaign, stage("doctor").run_doctor
    run_search, run_verification = stage("search").run_search, stage("verify").run_verification
    run_minimize = stage("minimize").run_minimize
    sim_backend.NOISE_SIGMA = noise
    contract, cdir = init_campaign(spec_path, out)
    rt = CampaignRuntime(contract, cdir, RuntimeSettings(tracking_uri="none", in_process=True, bank="off"))
    try:
        doctor = run_doctor(rt)
        search = run_search(rt, doctor, proposer_name=rt.spec.search.proposer, num_trials=rt.spec.budget.num_trials)
        if protocol == "old":
            plan = stage("search").finalists(search.trials, doctor, rt.spec.budget.num_finalists)
        else:
            plan = stage("evidence").plan_verification(rt, doctor, search.history, search.priors)
        final = run_minimize(rt, doctor, run_verification(rt, doctor, plan))
    finally:
        rt.close()
    w = workload(contract.spec.sim_workload)
    true = lambda cfg: float(estimate(w.job, columns(w.space.validate(cfg))).step_time_s[0])  # noqa: E731
    counts = collections.Counter()
    for t in Ledger(cdir.ledger).trials():
        if not t.extra.get("retried"):
            counts[_stage(t.role.value, t.extra.get("job_seed"))] += 1
    promoted = final.promoted
    base = true(contract.spec.baseline)
    return {"trials": {s: counts[s] for s in STAGES}, "promoted": dict(promoted.config) if promoted else None,
            "verified_speedup": promoted.speedup if promoted else None,
            "true_speedup": base / true(promoted.config) if promoted else None}


def _sim_spec(folder: Path, name: str, tuned: bool, seed: int) -> Path:
    from infrarsi.sim.oracle import oracle
    from infrarsi.sim.workloads import workload

    lines = [f'name = "cost-{name}"', 'backend = "sim"', f'sim_workload = "{name}"']
    if tuned:
        best = oracle(workload(name)).best_config
        lines.append("baseline = { " + ", ".join(f"{k} = {json.dumps(v)}" for k, v in best.items()) + " }")
    lines += ["[budget]", "num_trials = 20", "[search]", 'proposer = "engine"', f"seed = {seed}"]
    path = folder / f"{name}-{'tuned' if tuned else 'plain'}-{seed}.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def _old_tree(dest: Path) -> Path:
    """``OLD_COMMIT``'s tree, exported (no worktree, the checkout untouched)."""
    dest.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", OLD_COMMIT], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    return dest


def _run_worker(job: dict) -> dict:
    env = {**os.environ, "PYTHONPATH": job["code"], "INFRARSI_BANK": "off"}
    cmd = [sys.executable, str(Path(__file__).resolve()), "worker", "--protocol", job["protocol"], "--spec",
           job["spec"], "--worker-out", job["out"], "--noise", str(job["noise"])]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=job["out_parent"])
    if done.returncode:
        raise RuntimeError(f"worker failed: {' '.join(cmd)}\n{done.stderr[-3000:]}")
    return {**{k: job[k] for k in ("protocol", "workload", "tuned", "noise", "seed")},
            **json.loads(done.stdout.strip().splitlines()[-1])}


def _codes(protocols: list[str], tmp: Path) -> dict[str, str]:
    """Each protocol's code folder, for PYTHONPATH: the old one exported once."""
    return {p: str(_old_tree(tmp / "old")) if p == "old" else str(ROOT) for p in protocols}


def sim_part(seeds: int, workers: int, protocols: list[str], tmp: Path) -> list[dict]:
    sys.path.insert(0, str(ROOT))
    from infrarsi.sim.oracle import oracle
    from infrarsi.sim.workloads import workload

    codes = _codes(protocols, tmp)
    jobs = []
    for name in SIM_WORKLOADS:
        for tuned in (False, True):
            for noise in SIM_NOISE:
                for seed in range(seeds):
                    spec = _sim_spec(tmp, name, tuned, seed)
                    for protocol, code in codes.items():
                        out = tmp / "runs" / f"{protocol}-{spec.stem}-{noise}"
                        jobs.append({"protocol": protocol, "code": code, "spec": str(spec), "out": str(out),
                                     "out_parent": str(tmp), "workload": name, "tuned": tuned, "noise": noise,
                                     "seed": seed})
    rows = []
    with concurrent.futures.ProcessPoolExecutor(workers) as pool:
        for row in pool.map(_run_worker, jobs):
            row["oracle_speedup"] = 1.0 if row["tuned"] else oracle(workload(row["workload"])).speedup
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


# ---- part 3: the default CPU campaign -----------------------------------------------------
def cpu_part(runs: int, protocols: list[str], tmp: Path, keep: Path | None = None) -> list[dict]:
    codes = _codes(protocols, tmp)
    rows = []
    for i in range(runs):
        for protocol in protocols:
            data = tmp / f"cpu-{protocol}-{i}"
            # Each run compiles from a cold torch.compile cache, as on a fresh machine: a
            # cache warmed by the run before would make later runs' compile trials cheaper.
            env = {**os.environ, "INFRARSI_DATA_DIR": str(data), "PYTHONPATH": codes[protocol],
                   "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "TORCHINDUCTOR_CACHE_DIR": str(data / "inductor")}
            cmd = [sys.executable, "-m", "infrarsi.cli", "campaign", "--json", "--fresh-doctor", "--no-progress"]
            t0 = time.perf_counter()
            done = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=tmp)
            wall = time.perf_counter() - t0
            if done.returncode:
                raise RuntimeError(f"campaign failed ({protocol}):\n{done.stderr[-3000:]}")
            s = json.loads(done.stdout.strip().splitlines()[-1])
            if keep is not None:
                shutil.copytree(s["campaign_dir"], keep / f"cpu-{protocol}-{i}",
                                ignore=shutil.ignore_patterns("trials", "repo", "worktrees"), dirs_exist_ok=True)
            counts, seconds = collections.Counter(), collections.Counter()
            for line in (Path(s["campaign_dir"]) / "ledger.jsonl").read_text().splitlines():
                e = json.loads(line)
                if e.get("kind") != "trial":
                    continue
                stage = _stage(e["role"], e.get("extra", {}).get("job_seed"))
                seconds[stage] += e.get("wall_time_s", 0.0)  # re-measured attempts cost time too
                if not e.get("extra", {}).get("retried"):
                    counts[stage] += 1
            rows.append({"protocol": protocol, "run": i, "date": time.strftime("%Y-%m-%d", time.gmtime()),
                         "wall_s": round(wall, 1),
                         "campaign_wall_s": s.get("campaign_wall_s"), "trials": {k: counts[k] for k in STAGES},
                         "trial_wall_s": {k: round(seconds[k], 1) for k in STAGES},
                         "verified_speedup": s["verified_speedup"], "speedup_ci": s["speedup_ci"],
                         "promoted": [f"{c['knob']}={c['to']}" for c in s.get("promoted_changes") or []],
                         "promoted_config": s["promoted_config"], "trials_by_outcome": s["trials_by_outcome"]})
            print(json.dumps(rows[-1]), flush=True)
    return rows


# ---- tables -------------------------------------------------------------------------------
def _rule_table(rows: list[dict]) -> list[str]:
    out = ["## 1. The rule (simulated pairs; drift shared within a pair; doctor's floor from 5 runs)", "",
           "Promotion rate of a candidate with the given true speedup: the fixed rule always runs 5 pairs; "
           "the sequential one at most 7 (the default `budget.verify_pairs`), stopping when it decides.", "",
           "| run CV | true speedup | promoted: fixed 5 pairs | promoted: sequential | mean pairs: sequential |",
           "|---|---|---|---|---|"]
    for r in rows:
        cv = "at the threshold (floor 3%, fixed)" if r["run_cv"] is None else f"{r['run_cv']:.1%}"
        out.append(f"| {cv} | {r['speedup']:.2f}x | {r['old_rate']:.1%} | {r['new_rate']:.1%} | "
                   f"{r['new_pairs']:.2f} |")
    return out + [""]


def _sim_table(rows: list[dict]) -> list[str]:
    out = ["## 2. Simulated campaigns (engine, 20 search trials; each protocol from its own code)", "",
           "Trials per stage are means over campaigns, on the plain jobs (something to promote) and the "
           "tuned ones (the baseline is the oracle's best: nothing is truly faster, so every promotion is a "
           "false one; verification runs only where a lucky search trial beat the baseline by its noise). "
           "*False promotion*: something promoted on a tuned job, or a promoted config truly slower than the "
           "baseline. *Fraction of the oracle*: the promoted config's true speedup (from the simulator's "
           "noise-free times; 1.0 when nothing was promoted) over the oracle's, median over the plain jobs.", "",
           "| sim noise | jobs | protocol | campaigns | doctor | search | verification | minimization | all | "
           "false promotion | promoted | fraction of the oracle |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for noise in sorted({r["noise"] for r in rows}):
        for tuned in (False, True):
            for protocol in ("old", "new"):
                mine = [r for r in rows if r["noise"] == noise and r["protocol"] == protocol and r["tuned"] == tuned]
                if not mine:
                    continue
                mean = {s: statistics.fmean(r["trials"][s] for r in mine) for s in STAGES}
                false = sum(1 for r in mine if r["promoted"] is not None and (tuned or r["true_speedup"] <= 1.0))
                fracs = [(r["true_speedup"] or 1.0) / r["oracle_speedup"] for r in mine]
                frac = "-" if tuned else f"{statistics.median(fracs):.3f}"
                out.append(f"| {noise:.1%} | {'tuned' if tuned else 'plain'} | {protocol} | {len(mine)} | "
                           + " | ".join(f"{mean[s]:.1f}" for s in STAGES)
                           + f" | {sum(mean.values()):.1f} | {false} of {len(mine)} | "
                           f"{sum(r['promoted'] is not None for r in mine)} of {len(mine)} | {frac} |")
    return out + [""]


def _cpu_table(rows: list[dict]) -> list[str]:
    out = ["## 3. The default CPU campaign (`infrarsi campaign --json --fresh-doctor`, this machine)", "",
           "| protocol | run | date | doctor | search | verification | minimization | all | outcomes | wall s | "
           "verified (90% CI) | promoted changes |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        t = r["trials"]
        ci = f" ({r['speedup_ci'][0]:.2f}-{r['speedup_ci'][1]:.2f})" if r["speedup_ci"] else ""
        verified = f"{r['verified_speedup']:.2f}x{ci}" if r["verified_speedup"] else "none"
        outcomes = ", ".join(f"{k} {v}" for k, v in sorted(r["trials_by_outcome"].items()))
        out.append(f"| {r['protocol']} | {r['run']} | {r.get('date', '')} | " + " | ".join(str(t[s]) for s in STAGES)
                   + f" | {sum(t.values())} | {outcomes} | {r['campaign_wall_s']} | {verified} | {', '.join(r['promoted'])} |")
    for protocol in ("old", "new"):
        mine = [r for r in rows if r["protocol"] == protocol]
        if len(mine) > 1:
            med = lambda f: statistics.median(f(r) for r in mine)  # noqa: E731
            out.append(f"| {protocol} | median of {len(mine)} | | "
                       + " | ".join(f"{med(lambda r: r['trials'][s]):g}" for s in STAGES)
                       + f" | {med(lambda r: sum(r['trials'].values())):g} | | {med(lambda r: r['campaign_wall_s']):.1f} | "
                       f"{med(lambda r: r['verified_speedup'] or 1.0):.2f}x | |")
    return out + [""]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("parts", nargs="+", choices=["rule", "sim", "cpu", "render", "worker"],
                    help="render: rewrite results.md from results.json, running nothing")
    ap.add_argument("--seeds", type=int, default=2, help="sim: campaigns per workload, tuning and noise level")
    ap.add_argument("--workers", type=int, default=2, help="sim: campaigns at once")
    ap.add_argument("--repeats", type=int, default=2000, help="rule: simulated verifications per cell")
    ap.add_argument("--cpu-runs", type=int, default=3)
    ap.add_argument("--protocols", nargs="+", default=["old", "new"], choices=["old", "new"])
    ap.add_argument("--keep", type=Path, help="cpu: copy each run's campaign folder here (ledger, summary, reports)")
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmark" / "campaign_cost")
    ap.add_argument("--protocol", choices=["old", "new"], help=argparse.SUPPRESS)  # worker only
    ap.add_argument("--spec", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--worker-out", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--noise", type=float, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.parts == ["worker"]:
        print(json.dumps(worker(args.protocol, args.spec, args.worker_out, args.noise)))
        return 0
    sys.path.insert(0, str(ROOT))
    path = args.out / "results.json"
    results = json.loads(path.read_text()) if path.exists() else {}
    with tempfile.TemporaryDirectory(prefix="campaign-cost-") as tmp:
        command = "python benchmarks/campaign_cost.py " + " ".join(sys.argv[1:])
        for part in (p for p in args.parts if p != "render"):
            t0 = time.perf_counter()
            rows = (rule_part(args.repeats) if part == "rule"
                    else sim_part(args.seeds, args.workers, args.protocols, Path(tmp))
                    if part == "sim" else cpu_part(args.cpu_runs, args.protocols, Path(tmp), args.keep))
            rows = [{**r, "command": command} for r in rows]  # each row says which run made it
            if part in ("sim", "cpu") and part in results:  # rows of a protocol not run again are kept
                rows = [r for r in results[part]["rows"] if r["protocol"] not in args.protocols] + rows
            results[part] = {"rows": rows, "wall_s": round(time.perf_counter() - t0, 1), "command": command}
    args.out.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=1))
    lines = ["# Campaign cost: the protocol before sequential verification beside the one after", "",
             f"Old: the code at `{OLD_COMMIT}`; new: this tree. Written by `benchmarks/campaign_cost.py` "
             "(each part's command and wall time below).", ""]
    for part, table in (("rule", _rule_table), ("sim", _sim_table), ("cpu", _cpu_table)):
        if part in results:
            lines += table(results[part]["rows"])
            lines += [f"`{results[part]['command']}`: {results[part]['wall_s']:.0f} s."
                      + "".join(f" Rows of a protocol it did not run come from an earlier `{c}`."
                                for c in sorted({r.get("command") for r in results[part]["rows"]}
                                                - {results[part]["command"], None})), ""]
    (args.out / "results.md").write_text("\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
