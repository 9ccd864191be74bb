"""Search benchmark: every registered proposer on the simulator's benchmark workloads.

Each (proposer, workload, seed) run observes the baseline first (role DOCTOR), then asks
``suggest(1)`` sequentially up to the largest budget and observes each simulated result
(role SEARCH). Proposers are not told the budget, so the first ``B`` trials of one run
are exactly a budget-``B`` run; smaller budgets are scored on prefixes. Best-so-far counts
ok trials only and starts at the baseline; speedup = baseline noise-free time / best
noise-free time; the oracle's speedup is exact (``infrarsi.sim.oracle``).

    python benchmarks/search_benchmark.py --budgets 10 20 40 --seeds 10 --out docs/benchmark
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import multiprocessing
import os

# One BLAS thread per worker: the engine's L-BFGS fits and numpy products are small, and
# threaded BLAS on a busy 2-core machine made them ~5x slower (measured: 22 s against
# 4.5 s for one 20-trial engine run). Set before numpy is imported.
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from infrarsi.core.trial import Outcome, Role, TrialResult  # noqa: E402
from infrarsi.proposers import SearchContext, make_proposer, proposer_names  # noqa: E402
from infrarsi.proposers.engine_proposer import warm_start_configs  # noqa: E402
from infrarsi.sim import BENCHMARK_WORKLOADS, oracle, sim_workload, simulate_trial  # noqa: E402

# A proposer named "<name>+warm" starts from the engine's start configs (the same warm start).
WARM_SUFFIX = "+warm"
# "engine@cost=X": the engine with its acquisition divided by predicted trial cost ** X
# (``engine_proposer.COST_EXPONENT`` is the default; "engine@cost=0" ignores cost).
COST_SUFFIX = "@cost="


def _trial_result(trial_id: str, config: dict, role: Role, sim) -> TrialResult:
    # A real harness sees an OOM at the capacity, not the peak the job would have needed.
    peak = min(sim.peak_memory_bytes, sim.memory_capacity_bytes) if sim.outcome is Outcome.OOM else sim.peak_memory_bytes
    return TrialResult(trial_id=trial_id, config=config, role=role, outcome=sim.outcome,
                       step_time_s=sim.step_time_s, step_times_s=sim.step_times_s, peak_memory_bytes=peak,
                       memory_capacity_bytes=sim.memory_capacity_bytes, wall_time_s=sim.trial_time_s,
                       reason=sim.reason)


def _one_thread() -> None:
    """Each worker keeps to one core: Optuna's GP runs on torch, whose default of one thread
    per core oversubscribes the machine when several workers run (measured ~8x slower)."""
    import torch

    torch.set_num_threads(1)


def run_one(args: tuple[str, str, int, int]) -> dict:
    """One search: the per-trial record the scorer needs."""
    proposer_name, workload_name, seed, budget = args
    w = sim_workload(workload_name)
    w.space.feasible  # warm the cache outside the timed part
    t0 = time.perf_counter()
    ctx = SearchContext(space=w.space, baseline=dict(w.baseline), memory_capacity_bytes=w.memory_capacity_bytes,
                        seed=seed)
    base = simulate_trial(workload_name, w.baseline, seed=seed, trial_index=0)
    base_result = _trial_result(f"s{seed}-baseline", dict(w.baseline), Role.DOCTOR, base)
    base_name, warm = proposer_name.removesuffix(WARM_SUFFIX), proposer_name.endswith(WARM_SUFFIX)
    if COST_SUFFIX in base_name:
        base_name, exponent = base_name.split(COST_SUFFIX)
        ctx = dataclasses.replace(ctx, extra={**ctx.extra, "cost_exponent": float(exponent)})
    if warm:  # the engine's start configs, enqueued first (see ``warm_start_configs``)
        ctx = dataclasses.replace(ctx, extra={**ctx.extra,
                                              "warm_start_configs": tuple(warm_start_configs(ctx, base_result))})
    proposer = make_proposer(base_name, ctx)
    proposer.observe(base_result)
    trials = []
    for i in range(1, budget + 1):
        batch = proposer.suggest(1)
        if not batch:
            break
        cfg = batch[0]
        sim = simulate_trial(workload_name, cfg, seed=seed, trial_index=i)
        proposer.observe(_trial_result(f"s{seed}-t{i}", cfg, Role.SEARCH, sim))
        trials.append({"outcome": sim.outcome.value, "true_step_time_s": sim.true_step_time_s,
                       "trial_time_s": sim.trial_time_s, "config": cfg})
    return {"proposer": proposer_name, "workload": workload_name, "seed": seed,
            "baseline_true_step_time_s": base.true_step_time_s, "trials": trials,
            "proposer_seconds": time.perf_counter() - t0}


def score(run: dict, budget: int, best_possible_s: float, tokens_flops: float) -> dict:
    best = run["baseline_true_step_time_s"]
    fail_time = total_time = 0.0
    counts = {"oom": 0, "crash": 0}
    for t in run["trials"][:budget]:
        total_time += t["trial_time_s"]
        if t["outcome"] == "ok":
            best = min(best, t["true_step_time_s"])
        else:
            counts[t["outcome"]] = counts.get(t["outcome"], 0) + 1
            fail_time += t["trial_time_s"]
    speedup = run["baseline_true_step_time_s"] / best
    return {"speedup": speedup, "fraction_of_oracle": speedup / (run["baseline_true_step_time_s"] / best_possible_s),
            "mfu": tokens_flops / best, "oom": counts["oom"], "crash": counts["crash"],
            "failed_time_share": fail_time / total_time if total_time else 0.0}


def curve(run: dict) -> list[float]:
    best, out = run["baseline_true_step_time_s"], []
    for t in run["trials"]:
        if t["outcome"] == "ok":
            best = min(best, t["true_step_time_s"])
        out.append(run["baseline_true_step_time_s"] / best)
    return out


def summarise(runs: list[dict], budgets: list[int]) -> dict:
    oracles = {}
    for name in sorted({r["workload"] for r in runs}):
        w, o = sim_workload(name), oracle(sim_workload(name))
        mfu_scale = o.best_mfu * o.best_step_time_s  # mfu * time is constant for a workload
        oracles[name] = {"speedup": o.speedup, "best_step_time_s": o.best_step_time_s, "best_mfu": o.best_mfu,
                         "baseline_mfu": o.baseline_mfu, "best_config": o.best_config, "mfu_scale": mfu_scale,
                         "num_feasible": o.num_feasible, "paper": w.paper}
    rows = []
    for p in sorted({r["proposer"] for r in runs}):
        for wname, o in oracles.items():
            group = [r for r in runs if r["proposer"] == p and r["workload"] == wname]
            for b in budgets:
                s = [score(r, b, o["best_step_time_s"], o["mfu_scale"]) for r in group]
                rows.append({"proposer": p, "workload": wname, "budget": b, "num_seeds": len(s),
                             "median_fraction_of_oracle": statistics.median(x["fraction_of_oracle"] for x in s),
                             "median_speedup": statistics.median(x["speedup"] for x in s),
                             "median_mfu": statistics.median(x["mfu"] for x in s),
                             "oom_total": sum(x["oom"] for x in s), "crash_total": sum(x["crash"] for x in s),
                             "mean_failed_time_share": statistics.fmean(x["failed_time_share"] for x in s),
                             "proposer_seconds_per_run": statistics.fmean(r["proposer_seconds"] for r in group)})
    return {"oracles": oracles, "rows": rows}


def markdown(summary: dict, meta: dict) -> str:
    lines = ["# Search benchmark (simulator)", "",
             f"Command: `{meta['command']}`  ", f"Wall time: {meta['wall_s']:.0f} s on {meta['processes']} processes; "
             f"sequential `suggest(1)`; {meta['num_seeds']} seeds.", "",
             "## Oracle", "", "| workload | feasible | baseline MFU | oracle MFU | oracle speedup | paper speedup |",
             "|---|---|---|---|---|---|"]
    for name, o in summary["oracles"].items():
        lines.append(f"| {name} | {o['num_feasible']} | {o['baseline_mfu']:.1%} | {o['best_mfu']:.1%} | "
                     f"{o['speedup']:.2f}x | {o['paper'].get('speedup', float('nan')):.2f}x |")
    lines += ["", "## Proposers", "",
              "Medians over seeds; OOM/crash are totals over seeds; failed share = mean share of simulated "
              "trial time spent in OOM and crashed trials.", "",
              "| proposer | workload | budget | frac. of oracle | speedup | MFU | OOM | crash | failed time share | s/run |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for r in summary["rows"]:
        lines.append(f"| {r['proposer']} | {r['workload']} | {r['budget']} | {r['median_fraction_of_oracle']:.3f} | "
                     f"{r['median_speedup']:.2f}x | {r['median_mfu']:.1%} | {r['oom_total']} | {r['crash_total']} | "
                     f"{r['mean_failed_time_share']:.1%} | {r['proposer_seconds_per_run']:.1f} |")
    return "\n".join(lines) + "\n"


def plot(runs: list[dict], summary: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    names = list(summary["oracles"])
    fig, axes = plt.subplots(1, len(names), figsize=(4.5 * len(names), 3.6), squeeze=False)
    for ax, wname in zip(axes[0], names):
        for p in sorted({r["proposer"] for r in runs}):
            curves = [curve(r) for r in runs if r["proposer"] == p and r["workload"] == wname]
            n = min(len(c) for c in curves)
            if n:
                ax.plot(np.arange(1, n + 1), np.median([c[:n] for c in curves], axis=0), label=p)
        ax.axhline(summary["oracles"][wname]["speedup"], color="k", ls="--", lw=0.8, label="oracle")
        ax.set_title(wname, fontsize=9)
        ax.set_xlabel("trials")
        ax.set_ylabel("best-so-far speedup (median)")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budgets", type=int, nargs="+", default=[10, 20, 40])
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--first-seed", type=int, default=0,
                    help="seeds run from here: hold out seeds a change was not tuned on")
    ap.add_argument("--workloads", nargs="+", default=list(BENCHMARK_WORKLOADS))
    ap.add_argument("--proposers", nargs="+", default=None, help="default: every registered proposer")
    ap.add_argument("--processes", type=int, default=2)
    ap.add_argument("--out", type=Path, default=Path("docs/benchmark"))
    args = ap.parse_args(argv)
    proposers = args.proposers or proposer_names()
    budget = max(args.budgets)
    tasks = [(p, w, s, budget) for w in args.workloads for p in proposers for s in range(args.first_seed, args.first_seed + args.seeds)]
    t0 = time.perf_counter()
    if args.processes > 1:
        with multiprocessing.get_context("fork").Pool(args.processes, initializer=_one_thread) as pool:
            runs = []
            for i, run in enumerate(pool.imap_unordered(run_one, tasks, chunksize=1), 1):
                runs.append(run)
                print(f"[{time.perf_counter() - t0:6.0f}s] {i}/{len(tasks)} {run['proposer']} {run['workload']} "
                      f"seed {run['seed']}: {run['proposer_seconds']:.1f}s", file=sys.stderr, flush=True)
            runs.sort(key=lambda r: (r["workload"], r["proposer"], r["seed"]))
    else:
        runs = [run_one(t) for t in tasks]
    summary = summarise(runs, sorted(args.budgets))
    meta = {"command": "python benchmarks/search_benchmark.py " + " ".join(argv if argv is not None else sys.argv[1:]),
            "wall_s": time.perf_counter() - t0, "processes": args.processes, "num_seeds": args.seeds,
            "proposers": proposers, "budgets": sorted(args.budgets)}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps({"meta": meta, **summary}, indent=1, default=str))
    # Every trial of every run: megabytes, for digging in, not for the repository.
    (args.out / "runs.json").write_text(json.dumps(runs, default=str))
    (args.out / "results.md").write_text(markdown(summary, meta))
    plot(runs, summary, args.out / "best_so_far.png")
    print(markdown(summary, meta))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
