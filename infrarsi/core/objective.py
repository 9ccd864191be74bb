"""What the user pays for one run of the real job.

Without a declared job length the objective is the step time. With one
(``[objective] job_steps`` or ``job_hours``), it is the job's total time: start-up
(process launch, compile, data loading: ``TrialResult.startup_s``) plus steps x step
time. A config that is faster per step but slower to start can then lose.
"""

from __future__ import annotations

from infrarsi.core.spec import ObjectiveSpec
from infrarsi.core.trial import TrialResult


def job_steps(objective: ObjectiveSpec, baseline_step_s: float, baseline_startup_s: float) -> float | None:
    """The real job's length in steps; ``job_hours`` is counted at the baseline's pace."""
    if objective.job_steps is not None:
        return float(objective.job_steps)
    if objective.job_hours is not None:
        return max(1.0, (objective.job_hours * 3600 - baseline_startup_s) / baseline_step_s)
    return None


def job_time_s(step_time_s: float, startup_s: float | None, steps: float | None) -> float:
    """The objective of one measured run: its step time, or its whole job's time."""
    if steps is None:
        return step_time_s
    return (startup_s or 0.0) + steps * step_time_s


def run_time_s(result: TrialResult, steps: float | None) -> float:
    assert result.step_time_s is not None, "only an ok run has an objective"
    return job_time_s(result.step_time_s, result.startup_s, steps)

