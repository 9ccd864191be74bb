"""How exactly the harness clock measures steps of a known length.

Runs ``tests/jobs/clock_job.py`` (steps on a fixed 5 ms or 50 ms grid; each step event
carries the interval the job measured itself between two reports, and the instant it
wrote the line) through ``run_process_trial`` several times, and prints per setting:
the harness's median step time against the job's own median (relative error, median
and worst over repeats), how many recorded step times were 0 (next to how many of the
job's own were under 1 ms: a job that fell behind its grid writes the next lines back to
back), and, where the launcher records arrival stamps, how late the harness stamped each
line after the job wrote it.

    python benchmarks/harness_clock.py --repeats 5
    python benchmarks/harness_clock.py --repeats 5 --repo /path/to/an/older/checkout

``--repo`` measures the launcher of another checkout of infrarsi (e.g. one unpacked with
``git archive <commit> infrarsi workloads | tar -x -C DIR``) on the same job, for a
before/after comparison side by side.
"""

from __future__ import annotations

import argparse
import inspect
import json
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CLOCK_JOB = ROOT / "tests" / "jobs" / "clock_job.py"
STEP_LOG = r"iter (?P<step>\d+): loss (?P<loss>\S+), dt (?P<step_time_s>\S+) s"
TOKENS_LOG = r"tokens per iteration will be: (?P<tokens>[\d,]+)"


def run_once(launcher, step_ms: float, steps: int, via: str, tmp: Path) -> dict:
    kwargs = {}
    if via == "log":
        from infrarsi.core.spec_metrics import MetricsSpec

        kwargs["metrics"] = MetricsSpec(source="log", step_pattern=STEP_LOG, tokens_pattern=TOKENS_LOG)
    r = launcher.run_process_trial(launcher.TrialRequest(
        trial_id="clock", config={}, role=launcher.Role.SEARCH,
        argv=(sys.executable, str(CLOCK_JOB), "--step-ms", str(step_ms), "--steps", str(steps), "--via", via),
        env={}, cwd=str(tmp), trial_dir=str(tmp / "trial"), memory_capacity_bytes=2**40, emulate_capacity=False,
        timeout_s=120, warmup_steps=2, num_steps=steps, **kwargs))
    assert r.outcome.value == "ok", r.reason
    own = r.extra["reported_step_times_s"][2:]
    lags = []
    for line in (tmp / "trial" / "metrics.jsonl").read_text().splitlines():
        event = json.loads(line)
        if "harness_monotonic_s" in event and "written_at" in event:
            lags.append(event["harness_monotonic_s"] - event["written_at"])
    return {"rel_error": r.step_time_s / statistics.median(own) - 1, "zeros": sum(t <= 0 for t in r.step_times_s),
            "own_under_1ms": sum(t < 1e-3 for t in own), "lags": lags}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--repo", type=Path, default=ROOT, help="the checkout whose launcher to measure")
    args = p.parse_args()
    sys.path.insert(0, str(args.repo.resolve()))
    import infrarsi.harness.launcher as launcher

    has_log = "metrics" in inspect.signature(launcher.TrialRequest).parameters
    print(f"launcher: {Path(launcher.__file__).resolve()}")
    for via in ("jsonl", "log") if has_log else ("jsonl",):
        for step_ms, steps in ((5, 80), (50, 40)):
            runs = [run_once(launcher, step_ms, steps, via, Path(tempfile.mkdtemp())) for _ in range(args.repeats)]
            errors = [abs(r["rel_error"]) for r in runs]
            lags = sorted(x for r in runs for x in r["lags"])
            lag = (f"; stamp lag after the write: median {1e3 * statistics.median(lags):.3f} ms, "
                   f"p99 {1e3 * lags[int(0.99 * (len(lags) - 1))]:.3f} ms") if lags else ""
            print(f"{via:5s} {step_ms:2d} ms steps x{steps}: |harness/job - 1| median {statistics.median(errors):.2%}, "
                  f"worst {max(errors):.2%} over {len(runs)} runs; step times of 0: {sum(r['zeros'] for r in runs)} "
                  f"(the job's own under 1 ms, catching up its grid: {sum(r['own_under_1ms'] for r in runs)})"
                  f"{lag}")


if __name__ == "__main__":
    main()
