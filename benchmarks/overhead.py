"""Orchestration overhead per trial: time a campaign spends outside the trial processes.

Runs the real campaign flow (Prefect, Ray actors, MLflow on SQLite, the ledger) on a
job that does no work, then reads the ledger: each search trial's record is stamped when
it is recorded, so with one slot the gap between two consecutive records minus the
second trial's process wall time is what orchestration cost for it. The experience bank
is off (``bank="off"``): the no-op job's campaign neither reads past campaigns nor is
recorded in the user's bank.

    python benchmarks/overhead.py --trials 30
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SPEC = """
name = "noop"
workload_dir = "{dir}"
repository = "copy"
command = ["{{python}}", "noop_workload.py", "--steps", "{{num_steps}}", "--global-batch-tokens", "{{global_batch_tokens}}"]
baseline = {{ a = 0, b = 0 }}
[knobs.a]
values = [0, 1, 2, 3, 4, 5, 6, 7]
flag = "--a"
[knobs.b]
values = [0, 1, 2, 3, 4, 5, 6, 7]
flag = "--b"
[contract]
seq_len = 128
global_batch_tokens = 1024
num_steps = 3
warmup_steps = 1
loss_tolerance = 0.01
locked = ["noop_workload.py"]
[device]
memory_capacity = "8GiB"
[resources]
cpus_per_trial = 1
[budget]
num_trials = {trials}
num_finalists = 1
verify_pairs = 2
[search]
proposer = "random"
"""


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trials", type=int, default=30)
    args = p.parse_args()
    from flows.campaign import campaign
    from infrarsi.core.ledger import Ledger
    from infrarsi.core.options import CampaignOptions
    from infrarsi.core.workspace import CampaignDir

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp) / "noop"
        work.mkdir()
        (work / "noop_workload.py").write_text((ROOT / "benchmarks" / "noop_workload.py").read_text())
        spec = Path(tmp) / "noop.toml"
        spec.write_text(SPEC.format(dir=work, trials=args.trials))
        t0 = time.perf_counter()
        summary = campaign(CampaignOptions(spec=str(spec), out=str(Path(tmp) / "out"), bank="off"))
        total_s = time.perf_counter() - t0
        events = [e for e in Ledger(CampaignDir(Path(summary["campaign_dir"])).ledger).events() if e["kind"] == "trial"]
    search = [e for e in events if e["role"] == "search"]
    gaps = [b["recorded_at"] - a["recorded_at"] - b["wall_time_s"] for a, b in zip(search, search[1:])]
    result = {
        "num_trials": len(events),
        "per_trial_overhead_s_median": statistics.median(gaps),
        "per_trial_overhead_s_p90": statistics.quantiles(gaps, n=10)[-1],
        "trial_process_wall_s_median": statistics.median(e["wall_time_s"] for e in search),
        "campaign_wall_s": total_s,
        "fixed_and_amortised_overhead_s": total_s - sum(e["wall_time_s"] for e in events),
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
