"""The ``sim`` trial backend: a trial of a simulated cluster job, as a TrialResult.

Times and device-seconds are *simulated* (what the trial would have occupied on the
cluster), marked ``extra["simulated"]``; an OOM is censored at the capacity, as the
process backend records it, because a real run only shows that the peak crossed it.
"""

from __future__ import annotations

from infrarsi.core.trial import Outcome, TrialResult
from infrarsi.harness.launcher import TrialRequest
from infrarsi.sim.backend import sim_workload, simulate_trial


def run_sim_trial(req: TrialRequest) -> TrialResult:
    assert req.sim_workload, "a sim trial needs its workload"
    out = simulate_trial(req.sim_workload, req.config, seed=req.seed, trial_index=0)
    w = sim_workload(req.sim_workload)
    gpus = w.job.num_gpus
    peak = max(out.peak_memory_bytes, out.memory_capacity_bytes) if out.outcome is Outcome.OOM else out.peak_memory_bytes
    return TrialResult(
        trial_id=req.trial_id, config=dict(req.config), role=req.role, attempt=req.attempt, outcome=out.outcome,
        step_time_s=out.step_time_s, step_times_s=out.step_times_s if out.outcome is Outcome.OK else (),
        peak_memory_bytes=min(peak, out.memory_capacity_bytes) if out.outcome is Outcome.OOM else peak,
        memory_capacity_bytes=out.memory_capacity_bytes, reason=out.reason,
        tokens_per_step=w.job.seq_len * w.job.global_batch if out.outcome is Outcome.OK else None,
        wall_time_s=out.trial_time_s, device_seconds=out.trial_time_s * gpus,
        extra={"simulated": True, "mfu": out.mfu, "true_step_time_s": out.true_step_time_s, "num_gpus": gpus})
