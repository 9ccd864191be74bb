"""What verification planned and decided: the plan's arms (``infrarsi.stages.run.evidence`` plans
them: verify_plan.json) and a verdict on each (``infrarsi.stages.run.verify``: verification.json)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from infrarsi.core.knobs import Config, Value
from infrarsi.core.serial import Record
from infrarsi.core.trial import Role

FINALIST, SMALLER, LEAVE_ONE_OUT = "finalist", "smaller", "leave_one_out"


@dataclass(frozen=True, kw_only=True)
class ChangeEvidence:
    """One change of the leader and what the evidence in hand says about it."""

    knob: str
    baseline_value: Value
    value: Value
    call: str  # one of infrarsi.stages.run.evidence.CALLS
    predicted: float | None = None  # the model's contribution: time without the change / with it
    predicted_low: float | None = None
    predicted_high: float | None = None
    reason: str = ""


@dataclass(frozen=True, kw_only=True)
class Arm:
    """A config verification measures against the baseline, round by round."""

    key: str
    kind: str  # FINALIST, SMALLER or LEAVE_ONE_OUT
    config: Mapping[str, Value]
    source_trial_id: str
    max_pairs: int
    parent: str | None = None  # the arm a smaller config is compared with while it runs
    reverts: tuple[str, ...] = ()  # knobs set back to the baseline's value, against the leader
    # log(leader's step time / this arm's) and its sd as the runs before verification predict
    # it: the time model's, weighed with both configs' own runs where both ran (None for the
    # leader, or where the objective counts start-up, which the model does not predict):
    # minimization weighs it against the pairs (stages.run.minimize).
    predicted_gain: float | None = None
    predicted_sd: float | None = None

    @property
    def role(self) -> Role:
        return Role.VERIFY if self.kind == FINALIST else Role.MINIMIZE


@dataclass(frozen=True, kw_only=True)
class VerificationPlan(Record):
    arms: tuple[Arm, ...]
    # Each finalist's changes, in the space's knob order, by arm key; the leader's decided its arms.
    changes: Mapping[str, tuple[ChangeEvidence, ...]]
    margin: float  # budget.practical_margin: the smallest speedup worth having
    note: str = ""

    @property
    def leader(self) -> Arm | None:
        return self.arms[0] if self.arms else None

    def family(self, key: str) -> str:
        """The finalist an arm derives from (the leader for smaller configs)."""
        arm = next(a for a in self.arms if a.key == key)
        return arm.key if arm.kind == FINALIST else self.arms[0].key

    @classmethod
    def upgrade(cls, data: Mapping[str, Any]) -> Mapping[str, Any]:
        return _margin_was_noise_floor(data, missing=0.0)


def _margin_was_noise_floor(data: Mapping[str, Any], missing: float | None = None) -> Mapping[str, Any]:
    """A folder written before the practical margin called it the noise floor."""
    return {"margin": data.get("noise_floor", missing), **data}


@dataclass(frozen=True, kw_only=True)
class Verdict(Record):
    config: Config
    source_trial_id: str
    pairs: tuple[tuple[str, str], ...]  # (baseline trial id, candidate trial id), those the decision used
    baseline_times_s: tuple[float, ...]
    candidate_times_s: tuple[float, ...]
    speedup: float | None
    ci_low: float | None  # the sequential test's bounds at the look that decided
    ci_high: float | None
    promoted: bool
    reason: str
    canary_seeds: tuple[int, ...] = ()  # the seed of each pair
    # speedup / ci_* / promoted are on the objective (infrarsi.core.objective): the step time, or
    # with a declared job length (job_steps), the job's total time; step_* are per step.
    baseline_startups_s: tuple[float, ...] = ()
    candidate_startups_s: tuple[float, ...] = ()
    step_speedup: float | None = None
    step_ci_low: float | None = None
    step_ci_high: float | None = None
    job_steps: float | None = None
    margin: float | None = None  # the practical margin this verdict was held to
    pair_noise_cv: float | None = None  # per-run noise its own pairs show (sequential.pair_noise): a diagnostic
    arm: str = ""  # the plan's arm (stages.evidence): "finalist 1", "leader less compile", ...
    kind: str = FINALIST
    clears: bool = False  # its lower bound cleared 1 + the margin with no failed run
    level: float | None = None  # the one-sided level of each bound at the deciding look

    @classmethod
    def upgrade(cls, data: Mapping[str, Any]) -> Mapping[str, Any]:
        return _margin_was_noise_floor(data)


@dataclass(frozen=True, kw_only=True)
class VerificationReport(Record):
    verdicts: tuple[Verdict, ...]
    margin: float  # budget.practical_margin: what a speedup must clear
    doctor_noise_cv: float | None = None  # doctor's estimate of one run's noise (a diagnostic)
    observed_noise_cv: float | None = None  # the largest of the verdicts' pair_noise_cv
    canary_effective: bool | None = None  # None: no baseline run to tell
    canary_note: str = ""
    plan: VerificationPlan | None = None  # the arms it ran (None: a report with no plan)
    # Per round: its canary seed, its baseline run and each arm's run ({arm: trial id}).
    rounds: tuple[Mapping[str, Any], ...] = ()
    note: str = ""

    @property
    def promoted(self) -> Verdict | None:
        winners = [v for v in self.verdicts if v.promoted]
        return max(winners, key=lambda v: v.speedup) if winners else None

    @classmethod
    def upgrade(cls, data: Mapping[str, Any]) -> Mapping[str, Any]:
        """A report with no plan wrote an empty one."""
        return {**_margin_was_noise_floor(data), "plan": data.get("plan") or None}
