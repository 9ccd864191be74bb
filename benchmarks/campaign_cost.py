"""What promotion costs and what it keeps: trials per stage, error rates and the speedup the
user receives, the code before a change to the protocol beside the code after it.

*before* is the code at ``--before`` (default ``BEFORE_COMMIT``, the last commit where the
noise floor was the bar a speedup had to clear and minimization dropped whatever was not
shown slower); *after* is this tree (the practical margin as the bar, the noise in the
pairs' variance, changes dropped only on evidence). Each part runs both side by side:

1. ``rule``: the verification rule alone, on simulated pairs (the noise model of
   ``tests/test_promotion.py``): promotion rate and mean pairs per noise level and true
   speedup. *before* is re-implemented here as ``BEFORE_COMMIT`` had it (its sequential test
   against 1 + max(doctor's floor from five runs, the pairs' own noise), seven pairs at most);
   *after* is ``infrarsi.stages.run.sequential`` at the spec's defaults.
2. ``sim``: whole campaigns on the simulator (``backend = "sim"``, trials one at a time in
   this process: no Prefect, Ray or MLflow), each protocol run from its own code (*before*
   from an export of its commit put first on ``PYTHONPATH``), at simulator noise levels set
   through ``infrarsi.sim.backend.NOISE_SIGMA``. Per campaign: trials per stage, and the
   promoted config's true speedup from the simulator's noise-free times. Each workload also
   runs *tuned* (its baseline is the oracle's best config: nothing is truly faster, so every
   promotion is a false one) and, for *after*, *planted*: a knob the simulated job ignores
   is added and set in the leader's search start (``planted_inert``), declared as changing
   the numerics (a ``dtype`` a job ignores) or as keeping them (a flag it ignores), to count
   how often an inert change reaches the promoted config.
3. ``cpu``: the README's default campaign (``infrarsi campaign --json --fresh-doctor``) on
   this machine, in a fresh data folder and a cold torch.compile cache per run, through
   each protocol's own CLI. ``--keep DIR`` copies each run's campaign folder (its ledger,
   summary and reports; not its trials' logs) to ``DIR`` before the temporary folder goes.
   Per run: the promoted config's speedup against the fastest arm verified in the same
   rounds (from the campaign's own pairs), and whether a change with a measured contribution
   above 1 was dropped.

    python benchmarks/campaign_cost.py rule sim --seeds 2 --workers 2
    python benchmarks/campaign_cost.py cpu --cpu-runs 3 --protocols after
    python benchmarks/campaign_cost.py render --pool DIR1 DIR2 --out DIR  # sim runs of other seeds, together

Results are merged into ``OUT/results.json`` (a part run again replaces its rows of the
protocols it ran) and the tables rewritten to ``OUT/results.md``.
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
BEFORE_COMMIT = "f443a5e"  # the noise floor as the bar; minimization on absence of evidence
PROTOCOLS = ("before", "after")
SIM_KINDS = ("plain", "tuned", "planted-changes", "planted-keeps")
RUN_CVS = [0.003, 0.01, 0.035, 0.15]
BEFORE_PAIRS, BEFORE_DOCTOR_RUNS = 7, 5  # BEFORE_COMMIT's budget.verify_pairs and doctor's runs
SPEEDUPS = [1.0, 1.15, 1.3, 1.5, 2.0, 3.0]
SIM_WORKLOADS = ["dense-9b-h100", "dense-27b-h200", "moe-26b-a4b-h200", "llama3-8b-a100"]
SIM_NOISE = [0.003, 0.01, 0.035, 0.15]
STAGES = ("doctor", "search", "verification", "minimization")
PLANTED = "planted_inert"


# ---- part 1: the rule ---------------------------------------------------------------------
def _doctor_floor(rng: np.random.Generator, run_cv: float, step_cv: float = 0.05) -> float:
    """BEFORE_COMMIT's bar: doctor's noise estimate from five back-to-back baseline runs."""
    from infrarsi.contract.noise import estimate_noise

    levels = rng.lognormal(0, run_cv, BEFORE_DOCTOR_RUNS)
    steps = [level * rng.lognormal(0, step_cv, 5) for level in levels]
    return estimate_noise([float(np.median(s)) for s in steps], [list(s) for s in steps]).noise_cv


def _before_rule(x: list[float], floor: float) -> tuple[bool, int]:
    """BEFORE_COMMIT's sequential test: the same looks, each against log(1 + max(floor, the
    pairs' own per-run noise)), at most seven pairs."""
    from infrarsi.stages.run.sequential import SequentialRule

    rule = SequentialRule(max_pairs=BEFORE_PAIRS)
    for n in range(2, BEFORE_PAIRS + 1):
        sd = statistics.stdev(x[:n])
        mean, half = statistics.fmean(x[:n]), rule.multiplier(n) * sd / math.sqrt(n)
        bar = math.log1p(max(floor, sd / math.sqrt(2)))
        if mean - half > bar:
            return True, n
        if mean + half < bar or n == BEFORE_PAIRS:
            return False, n
    raise AssertionError("the last look decides")


def _after_rule(x: list[float]) -> tuple[bool, int]:
    sys.path.insert(0, str(ROOT / "tests"))
    from test_promotion import MARGIN, MAX_PAIRS, verify

    from infrarsi.stages.run.sequential import SequentialRule

    return verify(x[:MAX_PAIRS], MARGIN, SequentialRule(max_pairs=MAX_PAIRS))


def rule_part(num_repeats: int) -> list[dict]:
    from infrarsi.core.spec import BudgetSpec

    pairs_after = BudgetSpec().verify_pairs
    rows = []
    for run_cv in RUN_CVS:
        for speedup in SPEEDUPS:
            rng = np.random.default_rng(11)
            counts = {p: [0, 0] for p in PROTOCOLS}  # promoted, pairs
            for _ in range(num_repeats):
                floor = _doctor_floor(rng, run_cv)
                n = max(BEFORE_PAIRS, pairs_after)
                drift = np.exp(np.cumsum(rng.normal(0, 0.05, n)))
                base, cand = drift * rng.lognormal(0, run_cv, n), drift / speedup * rng.lognormal(0, run_cv, n)
                x = [math.log(b / c) for b, c in zip(base, cand)]
                for protocol, (ok, used) in (("before", _before_rule(x, floor)), ("after", _after_rule(x))):
                    counts[protocol][0] += ok
                    counts[protocol][1] += used
            for protocol, (ok, used) in counts.items():
                rows.append({"protocol": protocol, "run_cv": run_cv, "speedup": speedup,
                             "rate": ok / num_repeats, "pairs": used / num_repeats})
                print(json.dumps(rows[-1]), flush=True)
    return rows


# ---- part 2: simulated campaigns ----------------------------------------------------------
def _stage(role: str, job_seed) -> str:
    if role in ("doctor", "calibrate"):
        return "doctor" if role == "doctor" or job_seed is None else "verification"
    if role == "search":
        return "search"
    return "minimization" if role.startswith("minimize") else "verification"


def worker(spec_path: Path, out: Path, noise: float) -> dict:
    """One campaign in this process with whichever ``infrarsi`` is first on the path."""
    import infrarsi.sim.backend as sim_backend
    from infrarsi.core.ledger import Ledger
    from infrarsi.sim.cost import estimate
    from infrarsi.sim.job import columns
    from infrarsi.sim.workloads import workload
    from infrarsi.stages.doctor import run_doctor
    from infrarsi.stages.init import init_campaign
    from infrarsi.stages.run.evidence import plan_verification
    from infrarsi.stages.run.minimize import run_minimize
    from infrarsi.stages.run.search import run_search
    from infrarsi.stages.run.verify import run_verification
    from infrarsi.stages.runtime import CampaignRuntime, RuntimeSettings

    sim_backend.NOISE_SIGMA = noise
    contract, cdir = init_campaign(spec_path, out)
    rt = CampaignRuntime(contract, cdir, RuntimeSettings(tracking_uri="none", in_process=True, bank="off"))
    try:
        doctor = run_doctor(rt)
        search = run_search(rt, doctor, proposer_name=rt.spec.search.proposer, num_trials=rt.spec.budget.num_trials)
        plan = plan_verification(rt, doctor, search.history, search.priors)
        final = run_minimize(rt, doctor, run_verification(rt, doctor, plan))
    finally:
        rt.close()
    w = workload(contract.spec.sim_workload)

    def true(cfg: dict) -> float:
        return float(estimate(w.job, columns(w.space.validate({k: cfg[k] for k in w.space.names}))).step_time_s[0])

    counts = collections.Counter()
    for t in Ledger(cdir.ledger).trials():
        if not t.extra.get("retried"):
            counts[_stage(t.role.value, t.extra.get("job_seed"))] += 1
    promoted = final.promoted
    # read as JSON: this worker may run an older infrarsi (``--before``), without infrarsi.record
    plan_json = cdir.read_json(cdir.plan) if cdir.plan.exists() else {}
    changes = plan_json.get("changes", {})
    base = true(contract.spec.baseline)
    search_ok = [t.config for t in Ledger(cdir.ledger).trials() if t.role.value == "search" and t.outcome.value == "ok"]
    return {"trials": {s: counts[s] for s in STAGES}, "promoted": dict(promoted.config) if promoted else None,
            "verified_speedup": promoted.speedup if promoted else None,
            "true_speedup": base / true(promoted.config) if promoted else None,
            # what verification and the search had to choose from (true speedups; 1.0: nothing)
            "best_arm_speedup": max([base / true(a["config"]) for a in plan_json.get("arms", [])] + [1.0]),
            "best_search_speedup": max([base / true(c) for c in search_ok] + [1.0]),
            # the search put the inert knob in a finalist: verification had it to drop or keep
            "winner_planted": any(c["knob"] == PLANTED for cs in changes.values() for c in cs),
            "promoted_planted": bool(promoted and promoted.config.get(PLANTED) is True)}


def _sim_spec(folder: Path, name: str, jobs: str, seed: int) -> Path:
    """``jobs``: plain, tuned (the baseline is the oracle's best), or planted-changes /
    planted-keeps (a knob the simulated job ignores, declared as changing the numerics or not)."""
    from infrarsi.sim.oracle import oracle
    from infrarsi.sim.workloads import workload

    lines = [f'name = "cost-{name}"', 'backend = "sim"', f'sim_workload = "{name}"']
    if jobs == "tuned":
        best = oracle(workload(name)).best_config
        lines.append("baseline = { " + ", ".join(f"{k} = {json.dumps(v)}" for k, v in best.items()) + " }")
    if jobs.startswith("planted"):
        numerics = jobs.split("-")[1]
        lines += [f"baseline = {{ {PLANTED} = false }}", f"[knobs.{PLANTED}]", "values = [false, true]",
                  f'numerics = "{numerics}"', 'description = "a flag the simulated job ignores"']
    lines += ["[budget]", "num_trials = 20", "[search]", 'proposer = "engine"', f"seed = {seed}"]
    path = folder / f"{name}-{jobs}-{seed}.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def _before_tree(dest: Path, commit: str) -> Path:
    """``commit``'s tree, exported (no worktree, the checkout untouched)."""
    dest.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", commit], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    return dest


def _run_worker(job: dict) -> dict:
    env = {**os.environ, "PYTHONPATH": job["code"], "INFRARSI_BANK": "off"}
    cmd = [sys.executable, str(Path(__file__).resolve()), "worker", "--spec", job["spec"],
           "--worker-out", job["out"], "--noise", str(job["noise"])]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=job["out_parent"])
    if done.returncode:
        raise RuntimeError(f"worker failed: {' '.join(cmd)}\n{done.stderr[-3000:]}")
    return {**{k: job[k] for k in ("protocol", "workload", "jobs", "noise", "seed")},
            **json.loads(done.stdout)}


def _codes(protocols: list[str], tmp: Path, before: str) -> dict[str, str]:
    """Each protocol's code folder, for PYTHONPATH: *before* exported once."""
    return {p: str(_before_tree(tmp / "before", before)) if p == "before" else str(ROOT) for p in protocols}


def sim_part(seeds: int, workers: int, protocols: list[str], tmp: Path, before: str,
             kinds: tuple[str, ...] = SIM_KINDS, first_seed: int = 0,
             noises: tuple[float, ...] = tuple(SIM_NOISE)) -> list[dict]:
    sys.path.insert(0, str(ROOT))
    from infrarsi.sim.oracle import oracle
    from infrarsi.sim.workloads import workload

    codes = _codes(protocols, tmp, before)
    jobs = []
    for name in SIM_WORKLOADS:
        for kind in kinds:
            for noise in noises:
                for seed in range(first_seed, first_seed + seeds):
                    spec = _sim_spec(tmp, name, kind, seed)
                    # BEFORE_COMMIT's simulator rejects a knob it does not model: planted jobs are after's
                    for protocol in [p for p in protocols if p == "after" or not kind.startswith("planted")]:
                        out = tmp / "runs" / f"{protocol}-{spec.stem}-{noise}"
                        jobs.append({"protocol": protocol, "code": codes[protocol], "spec": str(spec), "out": str(out),
                                     "out_parent": str(tmp), "workload": name, "jobs": kind, "noise": noise,
                                     "seed": seed})
    rows = []
    with concurrent.futures.ProcessPoolExecutor(workers) as pool:
        for row in pool.map(_run_worker, jobs):
            row["oracle_speedup"] = 1.0 if row["jobs"] == "tuned" else oracle(workload(row["workload"])).speedup
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


# ---- part 3: the default CPU campaign -----------------------------------------------------
def kept_of_found(campaign_dir: Path) -> dict:
    """What the user receives of what the campaign verified: the promoted arm's speedup over
    the cleared arm with the highest verified speedup (the pairs alone, as issue 34 measures
    it; minimization weighs the time model in too), from their runs in the rounds both ran (same baseline run
    each round: the geometric mean of fastest / promoted step time), and the changes dropped
    although their measured contribution's interval lies above 1."""
    from infrarsi.core.workspace import CampaignDir
    from infrarsi.record.campaign import final_verification, read_minimize, read_verification

    cdir = CampaignDir(campaign_dir)
    verification, minimize, final = read_verification(cdir), read_minimize(cdir), final_verification(cdir)
    cleared = [v for v in final.verdicts if v.clears]
    promoted = next((v for v in final.verdicts if v.promoted), None)
    dropped = [c.knob for c in (minimize.contributions if minimize else ())
               if not c.kept and c.source == "measured" and (c.ci_low or 0) > 1]
    if not cleared or promoted is None:
        return {"kept_of_fastest": None, "fastest_arm": None, "dropped_paying": dropped}
    fastest = max(cleared, key=lambda v: v.speedup)
    times = {}
    for line in (campaign_dir / "ledger.jsonl").read_text().splitlines():
        e = json.loads(line)
        if e.get("kind") == "trial" and not e.get("extra", {}).get("retried"):
            times[e["trial_id"]] = e.get("step_time_s")
    logs = [math.log(times[r["runs"][fastest.arm]] / times[r["runs"][promoted.arm]])
            for r in verification.rounds if fastest.arm in r["runs"] and promoted.arm in r["runs"]
            and times.get(r["runs"][fastest.arm]) and times.get(r["runs"][promoted.arm])]
    return {"kept_of_fastest": math.exp(statistics.fmean(logs)) if logs else None, "fastest_arm": fastest.arm,
            "promoted_arm": promoted.arm, "dropped_paying": dropped}


def cpu_part(runs: int, protocols: list[str], tmp: Path, before: str, keep: Path | None = None) -> list[dict]:
    codes = _codes(protocols, tmp, before)
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
            s = json.loads(done.stdout)
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
                         "promoted_config": s["promoted_config"], "trials_by_outcome": s["trials_by_outcome"],
                         **kept_of_found(Path(s["campaign_dir"]))})
            print(json.dumps(rows[-1]), flush=True)
    return rows


# ---- tables -------------------------------------------------------------------------------
def _rule_table(rows: list[dict]) -> list[str]:
    from infrarsi.core.spec import BudgetSpec

    by = {(r["protocol"], r["run_cv"], r["speedup"]): r for r in rows}
    out = ["## 1. The rule (simulated pairs; drift shared within a pair)", "",
           "Promotion rate of a candidate with the given true speedup. *before*: the sequential test against "
           "1 + max(doctor's noise floor from five runs, the pairs' own noise), at most 7 pairs; *after*: against "
           "1 + the practical margin (1%), the noise in the bound's width only, at most "
           f"{BudgetSpec().verify_pairs} pairs and a futility stop (the defaults; the rows record the code they ran "
           "on).",
           "", "| run CV | true speedup | promoted: before | promoted: after | mean pairs: before | "
           "mean pairs: after |", "|---|---|---|---|---|---|"]
    for cv in RUN_CVS:
        for sp in SPEEDUPS:
            b, a = by.get(("before", cv, sp)), by.get(("after", cv, sp))
            cell = lambda r, k, f: f.format(r[k]) if r else "-"  # noqa: E731
            out.append(f"| {cv:.1%} | {sp:.2f}x | {cell(b, 'rate', '{:.1%}')} | {cell(a, 'rate', '{:.1%}')} | "
                       f"{cell(b, 'pairs', '{:.2f}')} | {cell(a, 'pairs', '{:.2f}')} |")
    return out + [""]


def _median_ci(values: list[float]) -> tuple[float, float]:
    """A 90% bootstrap interval (percentile, seeded: a re-render gives the same figures) of
    the median of ``values``: how far a median over this many campaigns is from the
    median over many more. With eight campaigns it spans a few points of the oracle."""
    from scipy import stats

    if len(set(values)) < 2:
        return values[0], values[0]
    ci = stats.bootstrap((np.asarray(values),), np.median, confidence_level=0.9, n_resamples=5000,
                         method="percentile", random_state=np.random.default_rng(0)).confidence_interval
    return float(ci.low), float(ci.high)


def _sim_table(rows: list[dict]) -> list[str]:
    out = ["## 2. Simulated campaigns (engine, 20 search trials; each protocol from its own code)", "",
           "Trials per stage are means over campaigns. *plain*: something to promote; *tuned*: the baseline "
           "is the oracle's best, so every promotion is a false one; *planted*: a knob the simulated job ignores "
           "added to the plain job, declared as changing the numerics or keeping them. *False promotion*: "
           "something promoted on a tuned job, or a promoted config truly slower than the baseline. *Fraction "
           "of the oracle*: the promoted config's true speedup (noise-free; 1.0 when nothing was promoted) over "
           "the oracle's, median over the plain jobs, with its 90% bootstrap interval in square brackets (how far "
           "a median over so few campaigns may sit from the median over many); in round brackets what the "
           "campaign had to choose from, the median of the same figure for the truly fastest arm "
           "verification ran and for the truly fastest config a search trial ran (where recorded). *Planted "
           "kept*: campaigns whose promoted config carries the inert knob, of those where the search put it in "
           "a finalist.", "",
           "| sim noise | jobs | protocol | campaigns | doctor | search | verification | minimization | all | "
           "false promotion | promoted | fraction of the oracle | planted kept |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for noise in sorted({r["noise"] for r in rows}):
        for kind in SIM_KINDS:
            for protocol in PROTOCOLS:
                mine = [r for r in rows if r["noise"] == noise and r["protocol"] == protocol and r["jobs"] == kind]
                if not mine:
                    continue
                tuned = kind == "tuned"
                mean = {s: statistics.fmean(r["trials"][s] for r in mine) for s in STAGES}
                false = sum(1 for r in mine if r["promoted"] is not None and (tuned or r["true_speedup"] <= 1.0))
                fracs = [(r["true_speedup"] or 1.0) / r["oracle_speedup"] for r in mine]
                frac = "-" if tuned else "{:.3f} [{:.3f}-{:.3f}]".format(statistics.median(fracs), *_median_ci(fracs))
                if not tuned and all("best_arm_speedup" in r for r in mine):
                    frac += " ({:.3f}, {:.3f})".format(*(statistics.median(r[k] / r["oracle_speedup"] for r in mine)
                                                         for k in ("best_arm_speedup", "best_search_speedup")))
                carried = [r for r in mine if r.get("winner_planted")]
                planted = (f"{sum(r['promoted_planted'] for r in carried)} of {len(carried)}"
                           if kind.startswith("planted") else "-")
                out.append(f"| {noise:.1%} | {kind} | {protocol} | {len(mine)} | "
                           + " | ".join(f"{mean[s]:.1f}" for s in STAGES)
                           + f" | {sum(mean.values()):.1f} | {false} of {len(mine)} | "
                           f"{sum(r['promoted'] is not None for r in mine)} of {len(mine)} | {frac} | {planted} |")
    return out + [""]


def _cpu_table(rows: list[dict]) -> list[str]:
    out = ["## 3. The default CPU campaign (`infrarsi campaign --json --fresh-doctor`, this machine)", "",
           "*Of the fastest*: the promoted config's speedup over the arm that cleared verification with the "
           "highest verified speedup (its pairs alone), in the rounds both ran (1.00: that arm was promoted). "
           "*Dropped paying*: changes dropped although "
           "their measured contribution's 90% interval lies above 1.", "",
           "| protocol | run | date | doctor | search | verification | minimization | all | outcomes | wall s | "
           "verified (90% CI) | of the fastest | dropped paying | promoted changes |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        t = r["trials"]
        ci = f" ({r['speedup_ci'][0]:.2f}-{r['speedup_ci'][1]:.2f})" if r["speedup_ci"] else ""
        verified = f"{r['verified_speedup']:.2f}x{ci}" if r["verified_speedup"] else "none"
        outcomes = ", ".join(f"{k} {v}" for k, v in sorted(r["trials_by_outcome"].items()))
        kept = f"{r['kept_of_fastest']:.2f}" if r.get("kept_of_fastest") else "-"
        out.append(f"| {r['protocol']} | {r['run']} | {r.get('date', '')} | "
                   + " | ".join(str(t[s]) for s in STAGES)
                   + f" | {sum(t.values())} | {outcomes} | {r['campaign_wall_s']} | {verified} | {kept} | "
                   f"{', '.join(r.get('dropped_paying') or []) or '-'} | {', '.join(r['promoted'])} |")
    for protocol in PROTOCOLS:
        mine = [r for r in rows if r["protocol"] == protocol]
        if len(mine) > 1:
            med = lambda f: statistics.median(f(r) for r in mine)  # noqa: E731
            out.append(f"| {protocol} | median of {len(mine)} | | "
                       + " | ".join(f"{med(lambda r: r['trials'][s]):g}" for s in STAGES)
                       + f" | {med(lambda r: sum(r['trials'].values())):g} | | "
                       f"{med(lambda r: r['campaign_wall_s']):.1f} | {med(lambda r: r['verified_speedup'] or 1.0):.2f}x"
                       " | | | |")
    return out + [""]


def _after_code(part: dict) -> str:
    """The commits the part's *after* rows ran on (and, for the simulated part, which jobs)."""
    kinds: dict[str, set[str]] = collections.defaultdict(set)
    for r in part["rows"]:
        if r["protocol"] == "after":
            kinds[r.get("code", part.get("after", "this tree"))].add(r.get("jobs", ""))
    return ", ".join(f"`{code}`" + (f" ({', '.join(sorted(k))})" if len(kinds) > 1 and any(k) else "")
                     for code, k in sorted(kinds.items()))


def _head() -> str:
    """This tree's commit, marked ``+changes`` where its code differs from it (results and
    docs written meanwhile do not count)."""
    git = ["git", "-C", str(ROOT)]
    head = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run([*git, "status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)docs"],
                           capture_output=True, text=True).stdout
    return head + ("+changes" if dirty.strip() else "")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("parts", nargs="+", choices=["rule", "sim", "cpu", "render", "worker"],
                    help="render: rewrite results.md from results.json, running nothing")
    ap.add_argument("--seeds", type=int, default=2, help="sim: campaigns per workload, job kind and noise level")
    ap.add_argument("--first-seed", type=int, default=0,
                    help="sim: the first search seed (the tables were tuned on seeds 0-1: 2 on are held out)")
    ap.add_argument("--noises", nargs="+", type=float, default=SIM_NOISE, choices=SIM_NOISE,
                    help="sim: the simulator noise levels to run (default: all)")
    ap.add_argument("--workers", type=int, default=2, help="sim: campaigns at once")
    ap.add_argument("--kinds", nargs="+", default=list(SIM_KINDS), choices=SIM_KINDS,
                    help="sim: the jobs to run (rows of other kinds are kept from the last run)")
    ap.add_argument("--repeats", type=int, default=2000, help="rule: simulated verifications per cell")
    ap.add_argument("--cpu-runs", type=int, default=3)
    ap.add_argument("--protocols", nargs="+", default=list(PROTOCOLS), choices=PROTOCOLS)
    ap.add_argument("--before", default=BEFORE_COMMIT, help="the commit whose code is 'before'")
    ap.add_argument("--keep", type=Path, help="cpu: copy each run's campaign folder here (ledger, summary, reports)")
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmark" / "campaign_cost")
    ap.add_argument("--pool", nargs="+", type=Path, default=[],
                    help="render: OUT's simulated part becomes these results folders' rows together (seeds run apart)")
    ap.add_argument("--spec", type=Path, help=argparse.SUPPRESS)  # worker only
    ap.add_argument("--worker-out", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--noise", type=float, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.parts == ["worker"]:
        print(json.dumps(worker(args.spec, args.worker_out, args.noise)))
        return 0
    sys.path.insert(0, str(ROOT))
    path = args.out / "results.json"
    results = json.loads(path.read_text()) if path.exists() else {}
    if args.pool:
        parts = [json.loads((d / "results.json").read_text())["sim"] for d in args.pool]
        results["sim"] = {"rows": [r for p in parts for r in p["rows"]], "wall_s": sum(p["wall_s"] for p in parts),
                          "command": " and ".join(p["command"] for p in parts), "before": parts[0]["before"],
                          "after": parts[0]["after"], "pooled": True}
    with tempfile.TemporaryDirectory(prefix="campaign-cost-") as tmp:
        command = "python benchmarks/campaign_cost.py " + " ".join(sys.argv[1:])
        for part in (p for p in args.parts if p != "render"):
            t0 = time.perf_counter()
            rows = (rule_part(args.repeats) if part == "rule"
                    else sim_part(args.seeds, args.workers, args.protocols, Path(tmp), args.before, tuple(args.kinds),
                                  args.first_seed, tuple(args.noises))
                    if part == "sim" else cpu_part(args.cpu_runs, args.protocols, Path(tmp), args.before, args.keep))
            head = _head()
            # each row says which run made it, and on which code
            rows = [{**r, "command": command, "code": head if r["protocol"] == "after" else args.before} for r in rows]
            if part in ("sim", "cpu") and part in results:  # rows of a protocol not run again are kept
                rows = [r for r in results[part]["rows"] if r["protocol"] not in args.protocols
                        or (part == "sim" and r["jobs"] not in args.kinds)] + rows
            results[part] = {"rows": rows, "wall_s": round(time.perf_counter() - t0, 1), "command": command,
                             "before": args.before, "after": head}
    args.out.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=1))
    lines = ["# Campaign cost: the protocol before and after, side by side", "",
             "*before* and *after*: the code at the commits each part names. Written by "
             "`benchmarks/campaign_cost.py` (each part's command and wall time below).", ""]
    for part, table in (("rule", _rule_table), ("sim", _sim_table), ("cpu", _cpu_table)):
        if part in results:
            lines += table(results[part]["rows"])
            lines += [f"*before* = `{results[part].get('before', BEFORE_COMMIT)}`, *after* = {_after_code(results[part])}. "
                      f"`{results[part]['command']}`: {results[part]['wall_s']:.0f} s."
                      + "".join(f" Rows of a protocol it did not run come from an earlier `{c}`."
                                for c in sorted({r.get("command") for r in results[part]["rows"]}
                                                - {results[part]["command"], None}) if not results[part].get("pooled")),
                      ""]
    (args.out / "results.md").write_text("\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
