"""Proposers side by side on the built-in CPU workload: whole campaigns, verified speedups.

Each (seed, proposer) pair runs a real campaign through the flow on the GPT trainer's
`tiny` flavour over its CPU knobs (micro-batch, checkpointing, attention, optimizer,
precision; 120 configs), with the capacity three quarters of the way from the measured
micro-batch-2 peak to the hungriest corner's, so that corner really OOMs. Proposers of one
seed run back to back, so machine drift hits them alike; doctor is measured by the first
campaign and reused by the rest (same contract, same machine). The experience bank is off
(``bank="off"``): no campaign reads an earlier one's configs or priors, nor leaves its own
in the user's bank, so each proposer starts from what the spec gives it. Two figures per
campaign: its own *verified* speedup (1.0 when nothing was promoted), and the promoted
config *re-measured* after all campaigns, side by side with every other campaign's and the
baseline in shuffled rounds (median over rounds of the baseline's step time over the
config's in the same round), so that drift between campaigns does not decide the comparison.

    python benchmarks/cpu_campaigns.py --seeds 3 --budget 10 --out docs/benchmark/cpu
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # tiny_gpt: the tests' tiny campaigns


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--budget", type=int, default=10)
    ap.add_argument("--proposers", nargs="+", default=["engine", "tpe", "random"])
    ap.add_argument("--rounds", type=int, default=3, help="re-measurement rounds of the promoted configs")
    ap.add_argument("--out", type=Path, default=Path("docs/benchmark/cpu"))
    args = ap.parse_args()
    from tiny_gpt import WIDE_KNOBS, oom_capacity, tiny_spec

    from flows.campaign import campaign
    from infrarsi.core.options import CampaignOptions

    rows, t0 = [], time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        capacity = oom_capacity()
        for seed in range(args.seeds):
            for proposer in args.proposers:
                spec = tiny_spec(tmp, capacity_bytes=capacity, num_trials=args.budget, proposer=proposer,
                                 knobs=WIDE_KNOBS, seed=seed, num_finalists=2, name=f"{proposer}-{seed}.toml")
                # The first campaign measures doctor afresh (this code, this machine); the rest reuse it.
                s = campaign(CampaignOptions(spec=str(spec), out=str(tmp / "out"), fresh_doctor=not rows, bank="off"))
                rows.append({"seed": seed, "proposer": proposer, "verified_speedup": s["verified_speedup"] or 1.0,
                             "best_search_speedup": s["baseline_step_time_s"] / s["best_step_time_s"]
                             if s["best_step_time_s"] else 1.0,
                             "promoted_config": s["promoted_config"],
                             "trials_by_outcome": s["trials_by_outcome"],
                             "failed_trial_seconds": s["failed_trial_seconds"]})
                print(json.dumps(rows[-1]), flush=True)
        remeasure(rows, tmp, args.rounds)
    wall = time.perf_counter() - t0
    lines = ["# Proposers on the built-in CPU workload (tiny flavour, 120 configs)", "",
             f"Command: `python benchmarks/cpu_campaigns.py --seeds {args.seeds} --budget {args.budget}`; "
             f"wall time {wall:.0f} s on this machine. Verified speedup: interleaved A/B re-runs against "
             "the baseline, 1.0 when nothing was promoted.", "",
             f"Re-measured: every promoted config and the baseline, {args.rounds} shuffled rounds after all campaigns.", "",
             "| proposer | median verified speedup | per seed | median re-measured speedup | per seed "
             "| median failed-trial seconds |", "|---|---|---|---|---|---|"]
    for p in args.proposers:
        mine = [r for r in rows if r["proposer"] == p]
        lines.append(f"| {p} | {statistics.median(r['verified_speedup'] for r in mine):.2f}x | "
                     + ", ".join(f"{r['verified_speedup']:.2f}" for r in mine)
                     + f" | {statistics.median(r['remeasured_speedup'] for r in mine):.2f}x | "
                     + ", ".join(f"{r['remeasured_speedup']:.2f}" for r in mine)
                     + f" | {statistics.median(r['failed_trial_seconds'] for r in mine):.1f} |")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.md").write_text("\n".join(lines) + "\n")
    (args.out / "results.json").write_text(json.dumps({"rows": rows, "wall_s": wall}, indent=1))
    print("\n".join(lines))


def remeasure(rows: list[dict], tmp: Path, rounds: int) -> None:
    """Each distinct promoted config and the baseline once per round, in a seeded shuffled
    order; a config's figure is the median over rounds of baseline / config step time."""
    import random

    from tiny_gpt import WIDE_BASELINE as baseline
    from tiny_gpt import run_tiny

    key = lambda c: json.dumps(c, sort_keys=True)  # noqa: E731
    configs = {key(c): c for c in [baseline] + [r["promoted_config"] for r in rows if r["promoted_config"]]}
    ratios: dict[str, list[float]] = {k: [] for k in configs}
    for rnd in range(rounds):
        order = list(configs)
        random.Random(rnd).shuffle(order)
        times = {}
        for i, k in enumerate(order):
            r = run_tiny(configs[k], tmp / "remeasure", f"r{rnd}-{i}", warmup_steps=2)
            if r.outcome.value != "ok":
                raise RuntimeError(f"re-measuring {configs[k]} failed ({r.outcome.value}: {r.reason}); log {r.log_path}")
            times[k] = r.step_time_s
        for k in configs:
            ratios[k].append(times[key(baseline)] / times[k])
    for r in rows:
        r["remeasured_speedup"] = statistics.median(ratios[key(r["promoted_config"])]) if r["promoted_config"] else 1.0


if __name__ == "__main__":
    main()
