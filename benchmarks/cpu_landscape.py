"""Proposers on a measured landscape of the built-in CPU workload: many seeds, cheaply.

``measure`` runs every config of the `tiny` trainer's CPU knobs (``WIDE_KNOBS``, 120
configs) in a shuffled order per pass, the baseline every tenth run, and keeps step time
and peak memory. ``replay`` then runs whole searches against that table: a proposer asks
for two configs, then one per finished trial (the campaign's two slots), for ``--budget``
trials, after observing the baseline; an ok trial's step time is the config's median over
passes times log-normal noise at the baseline repeats' spread, a config whose peak passes
the capacity is an OOM. The capacity is the campaign benchmark's rule
(``tests/tiny_gpt.py``: ``capacity_between``) applied to the table. The figure is the measured
speedup of each search's best config, so noise in the search can pick a slower config, as
in a campaign.

    python benchmarks/cpu_landscape.py measure --passes 2 --out docs/benchmark/cpu_landscape
    python benchmarks/cpu_landscape.py replay --seeds 20 --budget 10 --out docs/benchmark/cpu_landscape
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # tiny_gpt: the tests' tiny campaigns

from tiny_gpt import WIDE_BASELINE, WIDE_KNOBS, capacity_between, knob_space, run_tiny  # noqa: E402

from infrarsi.core.trial import Outcome, Role, TrialResult  # noqa: E402
from infrarsi.proposers import SearchContext, make_proposer  # noqa: E402

BASELINE = WIDE_BASELINE
SPACE = knob_space(WIDE_KNOBS)


def _key(config: dict) -> str:
    return json.dumps({k: config[k] for k in WIDE_KNOBS})


def measure(passes: int, out: Path) -> None:
    configs = [dict(zip(WIDE_KNOBS, v)) for v in itertools.product(*WIDE_KNOBS.values())]
    rows, t0 = [], time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        for p in range(passes):
            order = configs[:]
            random.Random(p).shuffle(order)
            for i, cfg in enumerate(order):
                for c in ([BASELINE] if i % 10 == 0 else []) + [cfg]:
                    r = run_tiny(c, Path(tmp), f"p{p}-{len(rows)}", warmup_steps=2)
                    rows.append({"pass": p, "config": c, "outcome": r.outcome.value, "step_time_s": r.step_time_s,
                                 "peak_memory_bytes": r.peak_memory_bytes})
    out.mkdir(parents=True, exist_ok=True)
    (out / "landscape.json").write_text(json.dumps({"rows": rows, "wall_s": time.perf_counter() - t0}, indent=0))


class Table:
    def __init__(self, rows: list[dict]) -> None:
        ok: dict[str, list[dict]] = {}
        for r in rows:
            if r["outcome"] == "ok":
                ok.setdefault(_key(r["config"]), []).append(r)
        self.time = {k: statistics.median(r["step_time_s"] for r in v) for k, v in ok.items()}
        self.peak = {k: max(r["peak_memory_bytes"] for r in v) for k, v in ok.items()}
        base = [r["step_time_s"] for r in ok[_key(BASELINE)]]
        self.noise = statistics.stdev(math.log(t) for t in base)
        self.capacity = capacity_between(self.peak[_key(BASELINE)],
                                         self.peak[_key({**BASELINE, "micro_batch": 64, "checkpointing": "none"})])
        self.baseline_time = self.time[_key(BASELINE)]
        fits = [t for k, t in self.time.items() if self.peak[k] <= self.capacity]
        self.oracle = self.baseline_time / min(fits)

    def result(self, config: dict, trial_id: str, role: Role, rng: np.random.Generator) -> TrialResult:
        k = _key(config)
        if self.peak[k] > self.capacity:
            return TrialResult(trial_id=trial_id, config=config, role=role, outcome=Outcome.OOM,
                               peak_memory_bytes=self.capacity, memory_capacity_bytes=self.capacity)
        return TrialResult(trial_id=trial_id, config=config, role=role, outcome=Outcome.OK,
                           step_time_s=self.time[k] * math.exp(rng.normal(0.0, self.noise)),
                           peak_memory_bytes=self.peak[k], memory_capacity_bytes=self.capacity)


def search(table: Table, proposer_name: str, seed: int, budget: int) -> dict:
    rng = np.random.default_rng(10_000 + seed)
    proposer = make_proposer(proposer_name, SearchContext(
        space=SPACE, baseline=dict(BASELINE), memory_capacity_bytes=table.capacity, seed=seed, on_cpu=True))
    proposer.observe(table.result(dict(BASELINE), "baseline", Role.DOCTOR, rng))
    pending, done = proposer.suggest(2), []
    while pending and len(done) < budget:
        r = table.result(pending.pop(0), f"t{len(done)}", Role.SEARCH, rng)
        proposer.observe(r)
        done.append(r)
        if len(done) + len(pending) < budget:
            pending += proposer.suggest(1)
    ok = [r for r in done if r.outcome is Outcome.OK]
    best = min(ok, key=lambda r: r.step_time_s).config if ok else BASELINE
    return {"proposer": proposer_name, "seed": seed, "speedup": table.baseline_time / table.time[_key(best)],
            "oom": sum(r.outcome is Outcome.OOM for r in done), "best": best}


def replay(landscape: Path, proposers: list[str], seeds: int, budget: int, out: Path) -> None:
    table = Table(json.loads(landscape.read_text())["rows"])
    runs = [search(table, p, s, budget) for p in proposers for s in range(seeds)]
    lines = [f"# Proposers replayed on the measured CPU landscape ({len(table.time)} configs)", "",
             f"Command: `python benchmarks/cpu_landscape.py replay --seeds {seeds} --budget {budget}`. "
             f"Capacity {table.capacity / 2**20:.0f} MiB; noise: log-sd {table.noise:.3f} (baseline repeats); "
             f"best config that fits: {table.oracle:.2f}x.", "",
             "| proposer | median speedup | mean | fraction of best (median) | OOM trials (all seeds) |",
             "|---|---|---|---|---|"]
    for p in proposers:
        sp = [r["speedup"] for r in runs if r["proposer"] == p]
        lines.append(f"| {p} | {statistics.median(sp):.2f}x | {statistics.fmean(sp):.2f}x | "
                     f"{statistics.median(sp) / table.oracle:.3f} | {sum(r['oom'] for r in runs if r['proposer'] == p)} |")
    out.mkdir(parents=True, exist_ok=True)
    (out / "replay.md").write_text("\n".join(lines) + "\n")
    (out / "replay.json").write_text(json.dumps(runs, indent=1))
    print("\n".join(lines))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    m = sub.add_parser("measure")
    m.add_argument("--passes", type=int, default=2)
    r = sub.add_parser("replay")
    r.add_argument("--seeds", type=int, default=20)
    r.add_argument("--budget", type=int, default=10)
    r.add_argument("--proposers", nargs="+", default=["engine", "tpe", "gp", "random", "greedy"])
    r.add_argument("--landscape", type=Path, default=None, help="default: OUT/landscape.json")
    for p in (m, r):
        p.add_argument("--out", type=Path, default=Path("docs/benchmark/cpu_landscape"))
    args = ap.parse_args()
    if args.command == "measure":
        measure(args.passes, args.out)
    else:
        replay(args.landscape or args.out / "landscape.json", args.proposers, args.seeds, args.budget, args.out)


if __name__ == "__main__":
    main()
