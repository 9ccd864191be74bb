"""Transfer benchmark (simulator): does the experience bank make a campaign reach the
oracle sooner on a job it has never seen?

For each pair (source workloads -> target workload): engine campaigns on the sources
(seeds ``100..100+S-1``, ``--source-budget`` trials each) are recorded in a fresh SQLite
bank exactly as a finished campaign is (``bank.CampaignRecord``: features, every trial,
the engine's posterior per-setting effects). Then the target is searched cold (no bank)
and seeded (``bank.nearest``: start configs and priors from the bank) for each of
``--seeds`` seeds; the score is the number of search trials until the best ok config
reaches ``--target`` x the oracle's speedup (noise-free times; the baseline counts as
trial 0; ``budget + 1`` when never reached). Nothing here was tuned on these pairs: the
bank's constants (``NUM_NEAREST``, the spread per unit of distance) were set before the
first run and are reported as they are.

    nice -n 15 python benchmarks/transfer.py --seeds 10 --out docs/benchmark/transfer
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from infrarsi.backends.backend import sim_features  # noqa: E402
from infrarsi.bank.records import CampaignRecord  # noqa: E402
from infrarsi.bank.similarity import nearest  # noqa: E402
from infrarsi.bank.sqlite import Bank  # noqa: E402
from infrarsi.core.trial import Outcome, Role, TrialResult  # noqa: E402
from infrarsi.proposers import SearchContext, make_proposer  # noqa: E402
from infrarsi.sim import oracle, sim_workload, simulate_trial  # noqa: E402

# name -> (what changes, source workloads, target workload)
PAIRS = {
    "model size": ("same GPU, 9B -> 27B dense", ["dense-9b-h100"], "dense-27b-h100"),
    "GPU": ("same 27B dense, H200 -> H100", ["dense-27b-h200"], "dense-27b-h100"),
    "GPU and size": ("9B H100 -> Llama-3-8B A100", ["dense-9b-h100"], "llama3-8b-a100"),
    "dense to MoE": ("27B dense -> 26B-A4B MoE, both H200", ["dense-27b-h200"], "moe-26b-a4b-h200"),
    "MoE to MoE": ("26B-A4B -> 35B-A3B MoE, H200", ["moe-26b-a4b-h200"], "moe-35b-a3b-h200"),
}


def _result(trial_id: str, config: dict, role: Role, sim) -> TrialResult:
    peak = min(sim.peak_memory_bytes, sim.memory_capacity_bytes) if sim.outcome is Outcome.OOM else sim.peak_memory_bytes
    return TrialResult(trial_id=trial_id, config=config, role=role, outcome=sim.outcome, step_time_s=sim.step_time_s,
                       peak_memory_bytes=peak, memory_capacity_bytes=sim.memory_capacity_bytes, reason=sim.reason)


def search(workload_name: str, seed: int, budget: int, experience=None) -> tuple[list[float], list[TrialResult], dict]:
    """One engine search: the true step time of each trial (inf when it failed), the
    results, and the engine's describe()."""
    w = sim_workload(workload_name)
    ctx = SearchContext(space=w.space, baseline=dict(w.baseline), memory_capacity_bytes=w.memory_capacity_bytes,
                        seed=seed, experience_configs=experience.configs if experience else (),
                        priors=experience.priors if experience else None)
    proposer = make_proposer("engine", ctx)
    base = simulate_trial(workload_name, w.baseline, seed=seed, trial_index=0)
    results = [_result("t0", dict(w.baseline), Role.DOCTOR, base)]
    proposer.observe(results[0])
    times = [base.true_step_time_s]
    for i in range(1, budget + 1):
        batch = proposer.suggest(1)
        if not batch:
            break
        sim = simulate_trial(workload_name, batch[0], seed=seed, trial_index=i)
        results.append(_result(f"t{i}", batch[0], Role.SEARCH, sim))
        proposer.observe(results[-1])
        times.append(sim.true_step_time_s if sim.outcome is Outcome.OK else float("inf"))
    return times, results, proposer.describe()


def source_record(args: tuple[str, int, int]) -> CampaignRecord:
    name, seed, budget = args
    _, results, describe = search(name, seed, budget)
    hw, wl = sim_features(name)
    effects = tuple({k: p[k] for k in ("knob", "value", "log_time_effect", "log_time_sd", "log_memory_effect",
                                       "log_memory_sd")} for p in describe["memory_prices"])
    return CampaignRecord(id=f"{name}-s{seed}", name=name, backend="sim", proposer="engine", hardware=hw, workload=wl,
                          baseline=dict(sim_workload(name).baseline), baseline_step_time_s=results[0].step_time_s,
                          trials=tuple(results), effects=effects)


def trials_to_reach(times: list[float], target_time_s: float, budget: int) -> int:
    best = float("inf")
    for i, t in enumerate(times):
        best = min(best, t)
        if best <= target_time_s:
            return i
    return budget + 1


def target_run(args: tuple[str, str, int, int, str | None, float, float, float]) -> dict:
    pair, target, seed, budget, bank_path, fraction, oracle_time_s, oracle_speedup = args
    import torch

    torch.set_num_threads(1)
    w = sim_workload(target)
    experience = None
    if bank_path:
        hw, wl = sim_features(target)
        experience = nearest(Bank(bank_path).records(), hardware=hw, workload=wl, space=w.space,
                             baseline=dict(w.baseline))
    times, _, _ = search(target, seed, budget, experience)
    # speedup >= fraction * oracle speedup  <=>  time <= oracle time / fraction
    return {"pair": pair, "target": target, "seed": seed, "seeded": bank_path is not None,
            "trials": trials_to_reach(times, oracle_time_s / fraction, budget),
            "fraction_at_budget": (times[0] / min(times)) / oracle_speedup}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--source-seeds", type=int, default=2)
    ap.add_argument("--budget", type=int, default=30)
    ap.add_argument("--source-budget", type=int, default=20)
    ap.add_argument("--target", type=float, default=0.95)
    ap.add_argument("--processes", type=int, default=2)
    ap.add_argument("--pairs", nargs="*", default=list(PAIRS))
    ap.add_argument("--out", type=Path, default=Path("docs/benchmark/transfer"))
    args = ap.parse_args()
    t0 = time.time()
    tmp = Path(tempfile.mkdtemp(prefix="infrarsi-transfer-"))
    jobs = []
    with multiprocessing.get_context("spawn").Pool(args.processes) as pool:
        banks = {}
        for pair in args.pairs:
            _, sources, target = PAIRS[pair]
            bank = Bank(tmp / f"{pair.replace(' ', '_')}.sqlite")
            for rec in pool.map(source_record, [(s, 100 + i, args.source_budget) for s in sources
                                                for i in range(args.source_seeds)]):
                bank.add(rec)
            banks[pair] = str(bank.path)
            o = oracle(sim_workload(target))
            jobs += [(pair, target, seed, args.budget, path, args.target, o.best_step_time_s, o.speedup)
                     for seed in range(args.seeds) for path in (None, banks[pair])]
        runs = []
        for run in pool.imap_unordered(target_run, jobs):  # progress, so a long run can be followed
            runs.append(run)
            print(f"{len(runs)}/{len(jobs)} {run}", flush=True)
    rows = []
    for pair in args.pairs:
        cold = [r["trials"] for r in runs if r["pair"] == pair and not r["seeded"]]
        seeded = [r["trials"] for r in runs if r["pair"] == pair and r["seeded"]]
        rows.append({"pair": pair, "what": PAIRS[pair][0], "target": PAIRS[pair][2], "sources": PAIRS[pair][1],
                     "cold_median": statistics.median(cold), "seeded_median": statistics.median(seeded),
                     "cold_mean": statistics.fmean(cold), "seeded_mean": statistics.fmean(seeded),
                     "seeded_fewer": sum(s < c for s, c in zip(seeded, cold)),
                     "seeded_more": sum(s > c for s, c in zip(seeded, cold)),
                     "cold_never": sum(c > args.budget for c in cold), "seeded_never": sum(s > args.budget for s in seeded)})
    meta = {"command": "nice -n 15 python " + shlex.join(sys.argv), "wall_s": time.time() - t0,
            "seeds": args.seeds, "budget": args.budget, "target": args.target, "source_seeds": args.source_seeds,
            "source_budget": args.source_budget}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps({"meta": meta, "rows": rows, "runs": runs}, indent=1))
    (args.out / "results.md").write_text(markdown(rows, meta))
    print(markdown(rows, meta))


def markdown(rows: list[dict], meta: dict) -> str:
    lines = ["# Transfer through the experience bank (simulator)", "",
             f"Command: `{meta['command']}`  ",
             f"Wall time {meta['wall_s']:.0f} s. Engine proposer, sequential trials. Score: search trials until the "
             f"best ok config reaches {meta['target']:.2f} of the oracle's speedup (budget {meta['budget']}; "
             f"{meta['budget'] + 1} = never), over {meta['seeds']} seeds, cold (no bank) vs seeded (a bank holding "
             f"{meta['source_seeds']} engine campaigns of {meta['source_budget']} trials on each source). "
             "Paired by seed: fewer / more = seeds where seeded needed fewer / more trials than cold.", "",
             "| pair | change | target | cold median | seeded median | cold mean | seeded mean | fewer | more | never (cold/seeded) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['pair']} | {r['what']} | {r['target']} | {r['cold_median']:g} | {r['seeded_median']:g} | "
                     f"{r['cold_mean']:.1f} | {r['seeded_mean']:.1f} | {r['seeded_fewer']} | {r['seeded_more']} | "
                     f"{r['cold_never']}/{r['seeded_never']} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
