"""Search benchmark on generated jobs: a development split to tune on, a held-out split to report.

The jobs come from ``infrarsi.sim.generator`` (fixed seeds in ``DEVELOPMENT_SEEDS``,
``EXTRA_DEVELOPMENT_SEEDS`` and ``HELD_OUT_SEEDS``). Each (proposer, job, seed) run is the sequential ``suggest(1)`` loop
of ``search_benchmark.run_one``; a run's score is its noise-free speedup over the baseline
as a fraction of the oracle's. Per split and budget: the median, the worst decile (10th
percentile) and the mean of that fraction over every (job, seed) run, and the share of
simulated trial time lost to OOMs and crashes (pooled over runs, and per job).

    python benchmarks/generated_benchmark.py --split held-out --seeds 3 --out docs/benchmark/generated/held_out
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
from search_benchmark import _one_thread, run_one, score  # noqa: E402

from infrarsi.sim import oracle, sim_workload  # noqa: E402
from infrarsi.sim.generator import SPLITS, split_names  # noqa: E402

DEFAULT_PROPOSERS = ("engine", "tpe+warm", "tpe", "random")
# What each proposer is given, for the tables.
GIVEN = {
    "engine": "built-in priors; its own start (prior-best and space-filling configs)",
    "tpe+warm": "the engine's start configs enqueued; no priors (TPE takes none)",
    "gp+warm": "the engine's start configs enqueued; no priors (GP takes none)",
    "tpe": "nothing: 5 random start trials",
    "gp": "nothing: 5 random start trials",
    "random": "nothing",
    "greedy": "nothing",
}


def _oracles(names: list[str]) -> dict[str, dict]:
    out = {}
    for name in names:
        w, o = sim_workload(name), oracle(sim_workload(name))
        out[name] = {"description": w.description, "speedup": o.speedup, "best_step_time_s": o.best_step_time_s,
                     "mfu_scale": o.best_mfu * o.best_step_time_s, "num_feasible": o.num_feasible,
                     "num_ok": o.num_ok, "best_config": o.best_config, "baseline_mfu": o.baseline_mfu,
                     "best_mfu": o.best_mfu}
    return out


def _job_bootstrap(scored: list[dict], draws: int = 2000) -> dict[str, list[float]]:
    """90% intervals of the median, worst decile and mean, resampling whole jobs (a job's
    seeds move together: they share its landscape), fixed seed."""
    by_job: dict[str, list[float]] = {}
    for x in scored:
        by_job.setdefault(x["workload"], []).append(x["fraction_of_oracle"])
    jobs = [np.array(v) for v in by_job.values()]
    rng = np.random.default_rng(0)
    stats = []
    for _ in range(draws):
        fr = np.concatenate([jobs[i] for i in rng.integers(len(jobs), size=len(jobs))])
        stats.append((np.median(fr), np.percentile(fr, 10), fr.mean()))
    lo, hi = np.percentile(np.array(stats), [5, 95], axis=0)
    return {k: [float(lo[i]), float(hi[i])] for i, k in enumerate(("median", "worst_decile", "mean"))}


def summarise(runs: list[dict], oracles: dict[str, dict], budgets: list[int]) -> dict:
    overall, per_job = [], []
    for p in sorted({r["proposer"] for r in runs}):
        for b in budgets:
            scored = []
            fail_s = total_s = 0.0
            for r in runs:
                if r["proposer"] != p:
                    continue
                o = oracles[r["workload"]]
                sc = score(r, b, o["best_step_time_s"], o["mfu_scale"])
                trials = r["trials"][:b]
                total = sum(t["trial_time_s"] for t in trials)
                fail = sum(t["trial_time_s"] for t in trials if t["outcome"] != "ok")
                fail_s += fail
                total_s += total
                scored.append({**sc, "workload": r["workload"], "seed": r["seed"]})
            fr = [x["fraction_of_oracle"] for x in scored]
            num_runs = len(fr)
            overall.append({"proposer": p, "budget": b, "num_runs": num_runs, "median": statistics.median(fr),
                            "worst_decile": float(np.percentile(fr, 10)), "mean": statistics.fmean(fr),
                            "interval_90": _job_bootstrap(scored),
                            "failed_time_share": fail_s / total_s if total_s else 0.0,
                            "trial_hours_per_run": total_s / 3600 / num_runs if num_runs else 0.0,
                            "oom": sum(x["oom"] for x in scored), "crash": sum(x["crash"] for x in scored)})
            for name in oracles:
                js = [x for x in scored if x["workload"] == name]
                if js:
                    per_job.append({"proposer": p, "budget": b, "workload": name,
                                    "median": statistics.median(x["fraction_of_oracle"] for x in js),
                                    "failed_time_share": statistics.fmean(x["failed_time_share"] for x in js)})
    return {"overall": overall, "per_job": per_job}


def markdown(split: str, oracles: dict, summary: dict, meta: dict) -> str:
    lines = [f"# Search benchmark on generated jobs: {split} split", "",
             f"Command: `{meta['command']}`  ",
             f"Wall time: {meta['wall_s']:.0f} s on {meta['processes']} processes (this project's 2-core machine); "
             f"{len(oracles)} jobs x {meta['num_seeds']} seeds, sequential `suggest(1)`."
             + (" Resumed: the wall time is the last invocation's, runs logged earlier are not in it." if meta.get("resumed") else ""),
             "",
             *([f"**Partial:** {len(oracles)} of {meta['num_jobs_planned']} jobs had finished for every proposer "
                "when these tables were made (`--summarise-only`); the wall time is that of the last invocation.", ""]
               if len(oracles) < meta["num_jobs_planned"] else []),
             "Fraction of the oracle's speedup over every (job, seed) run, with 90% intervals from resampling "
             "jobs; failed share = simulated trial time spent in OOMs and crashes over all trial time, pooled "
             "over runs; trial hours = simulated wall time of the search's trials (start-up, compiling, "
             "steps) per run, mean over runs.", ""]
    for b in meta["budgets"]:
        lines += [f"## Budget {b}", "", "| proposer | given | median | worst decile | mean | failed time share | "
                  "trial hours | OOM | crash |", "|---|---|---|---|---|---|---|---|---|"]
        rows = sorted((r for r in summary["overall"] if r["budget"] == b), key=lambda r: -r["mean"])
        for r in rows:
            ci = r.get("interval_90", {})
            cells = [f"{r[k]:.3f}" + (" ({:.3f}-{:.3f})".format(*ci[k]) if k in ci else "")
                     for k in ("median", "worst_decile", "mean")]
            lines.append(f"| {r['proposer']} | {GIVEN.get(r['proposer'].split('@')[0], '')} | " + " | ".join(cells) +
                         f" | {r['failed_time_share']:.1%} | {r.get('trial_hours_per_run', float('nan')):.2f} | "
                         f"{r['oom']} | {r['crash']} |")
        lines.append("")
    b = 20 if 20 in meta["budgets"] else meta["budgets"][-1]
    proposers = sorted({r["proposer"] for r in summary["per_job"]})
    lines += [f"## Per job at budget {b}", "",
              "Median fraction of the oracle over seeds (mean failed time share).", "",
              "| job | description | oracle | " + " | ".join(proposers) + " |",
              "|---|---|---|" + "---|" * len(proposers)]
    cell = {(r["proposer"], r["workload"]): r for r in summary["per_job"] if r["budget"] == b}
    for name, o in oracles.items():
        cells = [f"{cell[(p, name)]['median']:.3f} ({cell[(p, name)]['failed_time_share']:.0%})"
                 if (p, name) in cell else "" for p in proposers]
        lines.append(f"| {name} | {o['description']} | {o['speedup']:.2f}x | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--split", choices=tuple(SPLITS), required=True)
    ap.add_argument("--jobs", type=int, default=None, help="only the first N jobs of the split (for iterating)")
    ap.add_argument("--budgets", type=int, nargs="+", default=[10, 20])
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--proposers", nargs="+", default=list(DEFAULT_PROPOSERS))
    ap.add_argument("--processes", type=int, default=2)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--resume", action="store_true", help="keep the runs in OUT/runs.jsonl, run the rest")
    ap.add_argument("--summarise-only", action="store_true",
                    help="tables from the runs in OUT/runs.jsonl so far (jobs every proposer finished); runs nothing; "
                         "keeps the command and wall time of OUT/results.json when it is of the same run")
    args = ap.parse_args(argv)
    names = list(split_names(args.split))[: args.jobs]
    num_planned = len(names)
    budget = max(args.budgets)
    tasks = [(p, w, s, budget) for w in names for s in range(args.seeds) for p in args.proposers]
    args.out.mkdir(parents=True, exist_ok=True)
    # Every finished run is appended here at once, so an interrupted run keeps its data and
    # ``--resume`` runs only what is missing.
    log = args.out / "runs.jsonl"
    keep = args.resume or args.summarise_only
    runs = [json.loads(line) for line in log.read_text().splitlines()] if keep and log.exists() else []
    done = {(r["proposer"], r["workload"], r["seed"]) for r in runs}
    tasks = [] if args.summarise_only else [t for t in tasks if t[:3] not in done]
    if not keep:
        log.write_text("")
    t0 = time.perf_counter()
    with log.open("a") as sink:
        if args.processes > 1:
            with multiprocessing.get_context("fork").Pool(args.processes, initializer=_one_thread) as pool:
                for run in pool.imap_unordered(run_one, tasks, chunksize=1):
                    runs.append(run)
                    sink.write(json.dumps(run, default=str) + "\n")
                    sink.flush()
        else:
            for t in tasks:
                runs.append(run_one(t))
                sink.write(json.dumps(runs[-1], default=str) + "\n")
    if args.summarise_only:  # only jobs every proposer has finished, for a fair table
        names = [n for n in names
                 if all(sum(r["workload"] == n and r["proposer"] == p for r in runs) == args.seeds
                        for p in args.proposers)]
        runs = [r for r in runs if r["workload"] in names and r["proposer"] in args.proposers]
    runs.sort(key=lambda r: (r["workload"], r["proposer"], r["seed"]))
    oracles = _oracles(names)
    summary = summarise(runs, oracles, sorted(args.budgets))
    # Re-summarising a finished run (new table columns) keeps the run's command and wall time.
    earlier = json.loads((args.out / "results.json").read_text())["meta"] if (
        args.summarise_only and (args.out / "results.json").exists()) else {}
    if (earlier.get("split"), earlier.get("num_seeds"), earlier.get("proposers")) != (
            args.split, args.seeds, args.proposers):
        earlier = {}
    meta = {"command": earlier.get("command") or
            "python benchmarks/generated_benchmark.py " + " ".join(argv if argv is not None else sys.argv[1:]),
            "wall_s": earlier.get("wall_s", time.perf_counter() - t0), "processes": args.processes, "num_seeds": args.seeds,
            "budgets": sorted(args.budgets), "split": args.split, "num_jobs_planned": num_planned, "resumed": bool(args.resume and done), "proposers": args.proposers, "given": GIVEN}
    (args.out / "results.json").write_text(json.dumps({"meta": meta, "oracles": oracles, **summary}, indent=1,
                                                      default=str))
    text = markdown(args.split, oracles, summary, meta)
    (args.out / "results.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
