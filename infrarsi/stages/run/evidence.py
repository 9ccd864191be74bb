"""run (between search and verification): what the trials already run say, before any
more are run: which configs verification measures, and which of the winner's changes.

Doctor's baseline runs, its calibration variants and the search's trials, all at the
contract's seed, fit the engine's models once more (time, memory, crash; every outcome).
From them:

- **Finalists**: the measured ok configs that beat the baseline by more than its noise,
  ranked by the time model's posterior, which weighs each single measurement against its
  neighbours. The leader is verified; a runner-up too while the model gives it at least
  ``RUNNER_UP_CHANCE`` of being faster than the leader by more than the noise floor (up
  to ``budget.num_finalists``): within the floor, verification could not tell them apart.
- **The leader's changes**, each reverted alone, get a predicted contribution (the time
  without it over the time with it) with a 90% interval. A change whose interval lies
  above 1 + the noise floor pays and is kept without a trial; one whose interval lies
  below it is *idle*. Where the interval straddles the floor but the posterior leans
  far one way (P(it pays) at least ``LEAN`` with the interval above 1, or at most
  1 - ``LEAN``), the change is called as it leans; the rest are *uncertain*. A change
  without which a recorded run failed, or without which the memory model does not expect
  the config to fit, is *needed*; one whose reversal breaks a constraint is *coupled*. With a declared job
  length the objective includes start-up, which the model does not predict: every change
  is then uncertain.
- **Arms**: the finalists; the leader less every idle change that can go (kept feasible
  and, by the memory and crash models, likely to fit and to run): the *smaller* config;
  and that config less each uncertain change (*leave-one-out*), for the changes the model
  cannot call. Verification runs all of them in the same rounds against one baseline run
  each (``stages.verify``); minimization picks among those that cleared
  (``stages.minimize``).

The plan is written to the campaign folder before any round runs, so a resumed campaign
verifies the same arms even if the bank or the priors changed meanwhile.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Any, Mapping, Sequence

import numpy as np
from scipy import stats

from infrarsi.contract.loss_contract import LossContract
from infrarsi.core.knobs import PATCH_KNOB_PREFIX, Config, Value
from infrarsi.core.trial import Outcome, Role, TrialResult
from infrarsi.proposers.engine_proposer import CRASH_BAR, FIT_BAR
from infrarsi.stages.doctor import DoctorReport
from infrarsi.stages.runtime import CampaignRuntime

# A runner-up is verified beside the leader while the model gives it this chance of being
# faster than the leader by more than the noise floor. A runner-up less than the floor
# faster would be promoted only where verification's pairs happened to rank it first.
RUNNER_UP_CHANCE = 0.10
# The predicted contribution's interval: two-sided 90%, each side a one-sided 95% bound.
INTERVAL = 0.90
_Z = float(stats.norm.ppf(0.5 + INTERVAL / 2))
# A change whose interval straddles the floor is still called without a trial where the
# posterior leans this far one way: kept at P(it pays) >= LEAN where its interval also
# lies above 1 (the model is sure it helps at all: a change no trial ever separated from
# the others, such as a patch that only ever ran with the winner's other changes, gets an
# interval far below 1 whatever its mean), reverted with the idle changes in the smaller
# config at P(it pays) <= 1 - LEAN. Neither call can cost speed unseen: a kept change is
# in the config verification measures, and a reverted one is dropped only when the
# smaller config, measured, holds up. Only the changes in between get a leave-one-out
# arm. Chosen on one default CPU campaign's ledger (in-sample): its 13.9% floor left four
# of the leader's six changes straddling it (P(it pays) 0.07-0.72); at 2/3 all four are
# called and the smaller config tests the three that lean idle at once.
LEAN = 2 / 3
# Under a trial cap, the arms run at most the rounds the cap affords with every arm in each
# round, and each arm's sequential test has its last look there; arms leave (leave-one-out
# first, then the smaller config, then runners-up) while fewer than this many rounds fit.
# A test whose last look is at pair 7 decides little at pair 3 (t = 9.9 at 0.5%); one that
# ends at pair 3 does (t = 3.1 at 4.5%): a capped default campaign once ran three rounds of
# a 3.2x leader that its early looks could not clear, and promoted a 2.2x leave-one-out arm.
MIN_ROUNDS = 3

PAYS, IDLE, UNCERTAIN, NEEDED, COUPLED = "pays", "idle", "uncertain", "needed", "coupled"
FINALIST, SMALLER, LEAVE_ONE_OUT = "finalist", "smaller", "leave_one_out"


@dataclass(frozen=True, kw_only=True)
class ChangeEvidence:
    """One change of the leader and what the evidence in hand says about it."""

    knob: str
    baseline_value: Value
    value: Value
    call: str  # PAYS, IDLE, UNCERTAIN, NEEDED or COUPLED
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

    @property
    def role(self) -> Role:
        return Role.VERIFY if self.kind == FINALIST else Role.MINIMIZE


@dataclass(frozen=True, kw_only=True)
class VerificationPlan:
    arms: tuple[Arm, ...]
    # Each finalist's changes, in the space's knob order, by arm key; the leader's decided its arms.
    changes: Mapping[str, tuple[ChangeEvidence, ...]]
    noise_floor: float  # doctor's: what a change must beat to pay
    note: str = ""

    @property
    def leader(self) -> Arm | None:
        return self.arms[0] if self.arms else None

    def family(self, key: str) -> str:
        """The finalist an arm derives from (the leader for smaller configs)."""
        arm = next(a for a in self.arms if a.key == key)
        return arm.key if arm.kind == FINALIST else self.arms[0].key

    def to_json(self) -> dict[str, Any]:
        return {"arms": [asdict(a) | {"config": dict(a.config)} for a in self.arms],
                "changes": {k: [asdict(c) for c in cs] for k, cs in self.changes.items()},
                "noise_floor": self.noise_floor, "note": self.note}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "VerificationPlan":
        return cls(arms=tuple(Arm(**{**a, "reverts": tuple(a["reverts"])}) for a in d["arms"]),
                   changes={k: tuple(ChangeEvidence(**c) for c in cs) for k, cs in d["changes"].items()},
                   noise_floor=d["noise_floor"], note=d.get("note", ""))


def full_baseline(rt: CampaignRuntime, doctor: DoctorReport) -> dict[str, Value]:
    """Doctor's baseline with every knob of the space: a patch proposed during the run is
    a knob doctor never saw, and the baseline runs without it."""
    return {**{n: False for n in rt.space.names}, **doctor.baseline}


def evidence_model(rt: CampaignRuntime, priors: Any, history: Sequence[TrialResult]) -> Any:
    """The engine's models fitted on ``history`` (every outcome), whatever proposer searched."""
    from infrarsi.stages.run.search import build_proposer, padded

    model = build_proposer(rt, "engine", priors)
    for r in history:
        model.observe(padded(r, rt.space.names))
    return model.fitted()


def _candidates(history: Sequence[TrialResult], doctor: DoctorReport, base: Config) -> list[TrialResult]:
    """The fastest run of each distinct ok config that beats the baseline by more than its noise."""
    best: dict[tuple, TrialResult] = {}
    for r in history:
        if r.outcome is not Outcome.OK or r.role is Role.DOCTOR or {**base, **r.config} == base:
            continue
        key = tuple(sorted({**base, **r.config}.items()))
        if key not in best or r.step_time_s < best[key].step_time_s:
            best[key] = r
    floor = doctor.step_time_s / (1 + doctor.noise_cv)
    return [r for r in best.values() if r.step_time_s < floor]


def _finalists(rt: CampaignRuntime, model: Any, candidates: list[TrialResult], base: Config,
               threshold: float) -> list[TrialResult]:
    """The leader by the model's posterior, then runners-up with a real chance of being
    faster than it by more than ``threshold`` (the log of 1 + the noise floor)."""
    space, tm = rt.space, model.time_model
    idx = [np.array(space.indices({**base, **r.config})) for r in candidates]
    means, _ = tm.predict(np.array(idx))
    order = sorted(range(len(candidates)), key=lambda i: (means[i], candidates[i].step_time_s))
    leader = order[0]
    out = [candidates[leader]]
    for i in order[1:]:
        if len(out) >= rt.spec.budget.num_finalists:
            break
        gap, sd = tm.predict_difference(idx[i], idx[leader])  # log t(runner-up) - log t(leader)
        if stats.norm.cdf((-gap - threshold) / sd) >= RUNNER_UP_CHANCE:
            out.append(candidates[i])
    return out


def _failed_without(history: Sequence[TrialResult], config: Config, base: Config) -> TrialResult | None:
    return next((r for r in history if r.outcome is not Outcome.OK and {**base, **r.config} == config), None)


def _call(rt: CampaignRuntime, model: Any, leader: Config, knob: str, base: Config, history: Sequence[TrialResult],
          threshold: float, per_step: bool) -> ChangeEvidence:
    space, tm = rt.space, model.time_model
    common = dict(knob=knob, baseline_value=base[knob], value=leader[knob])
    alt = {**leader, knob: base[knob]}
    if space.violated(alt):
        return ChangeEvidence(**common, call=COUPLED, reason=f"not left out alone: that breaks {space.violated(alt)}")
    idx_alt, idx_lead = np.array(space.indices(alt)), np.array(space.indices(leader))
    mean, sd = tm.predict_difference(idx_alt, idx_lead)  # log t(without) - log t(with)
    low, high = mean - _Z * sd, mean + _Z * sd
    predicted = dict(predicted=math.exp(mean), predicted_low=math.exp(low), predicted_high=math.exp(high))
    failed = _failed_without(history, alt, base)
    if failed is not None:
        return ChangeEvidence(**common, **predicted, call=NEEDED, reason=(
            f"without it {failed.trial_id} ended {failed.outcome.value}: {failed.reason[:120]}"))
    p_fit = float(model.memory_model.fit_probability_main(model.encoding.main(idx_alt[None]))[0])
    if p_fit < FIT_BAR:
        return ChangeEvidence(**common, **predicted, call=NEEDED,
                              reason=f"the memory model gives the config without it P(fit) = {p_fit:.2f}")
    if not per_step:
        return ChangeEvidence(**common, **predicted, call=UNCERTAIN,
                              reason="a declared job length counts start-up, which the model does not predict")
    if low > threshold:
        return ChangeEvidence(**common, **predicted, call=PAYS,
                              reason="predicted to pay: its interval clears the floor")
    if high < threshold:
        return ChangeEvidence(**common, **predicted, call=IDLE,
                              reason="predicted not to pay: its interval lies below the floor")
    p_pays = float(stats.norm.cdf((mean - threshold) / sd))
    if p_pays >= LEAN and low > 0.0:
        return ChangeEvidence(**common, **predicted, call=PAYS, reason=(
            f"likely to pay: P(it pays) = {p_pays:.2f}, and its interval, which straddles the floor, "
            "lies above 1"))
    if p_pays <= 1 - LEAN:
        return ChangeEvidence(**common, **predicted, call=IDLE, reason=(
            f"likely not to pay: its interval straddles the floor, but P(it pays) = {p_pays:.2f}"))
    return ChangeEvidence(**common, **predicted, call=UNCERTAIN,
                          reason=f"the model cannot call it (P(it pays) = {p_pays:.2f}): measured")


def _smaller(rt: CampaignRuntime, model: Any, leader: Config, changes: list[ChangeEvidence]
             ) -> tuple[dict[str, Value], list[ChangeEvidence]]:
    """The leader less every idle change that can go, least predicted contribution first:
    each revert must keep the config feasible and, by the models, likely to fit and to run."""
    space, config, out = rt.space, dict(leader), []
    for c in sorted(changes, key=lambda c: (c.call != IDLE, c.predicted or 0.0)):
        if c.call != IDLE:
            out.append(c)
            continue
        trial = {**config, c.knob: c.baseline_value}
        idx = np.array(space.indices(trial))[None]
        p_fit = float(model.memory_model.fit_probability_main(model.encoding.main(idx))[0])
        p_ok = float(model.crash_model.no_crash_probability(idx)[0])
        if space.violated(trial) or p_fit < FIT_BAR or p_ok < CRASH_BAR:
            why = (f"breaks {space.violated(trial)}" if space.violated(trial)
                   else f"P(fit) {p_fit:.2f}, P(no crash) {p_ok:.2f}")
            out.append(ChangeEvidence(**{**asdict(c), "call": COUPLED,
                                         "reason": c.reason + f"; kept: dropping it with the others {why}"}))
            continue
        config = trial
        out.append(c)
    order = {n: i for i, n in enumerate(space.names)}
    return config, sorted(out, key=lambda c: order[c.knob])


def plan_verification(rt: CampaignRuntime, doctor: DoctorReport, history: Sequence[TrialResult],
                      priors: Any = None) -> VerificationPlan:
    """The arms verification runs, from ``history`` (the contract-seed runs: doctor's,
    calibration's and the search's); read back from the campaign folder when it exists."""
    if rt.cdir.plan.exists():
        return VerificationPlan.from_json(rt.cdir.read_json(rt.cdir.plan))
    budget = rt.spec.budget
    base = full_baseline(rt, doctor)
    candidates = _candidates(history, doctor, base)
    if not candidates:
        plan = VerificationPlan(arms=(), changes={}, noise_floor=doctor.noise_cv,
                                note="no run beat the baseline by more than its noise: nothing to verify")
        rt.cdir.write_json(rt.cdir.plan, plan.to_json())
        return plan
    model = evidence_model(rt, priors, history)
    threshold = math.log1p(doctor.noise_cv)
    finals = _finalists(rt, model, candidates, base, threshold)
    arms = [Arm(key=f"finalist {i + 1}", kind=FINALIST, config={**base, **r.config}, source_trial_id=r.trial_id,
                max_pairs=budget.verify_pairs) for i, r in enumerate(finals)]
    per_step = rt.spec.objective.job_steps is None and rt.spec.objective.job_hours is None
    calls = {a.key: [_call(rt, model, dict(a.config), k, base, history, threshold, per_step)
                     for k in rt.space.names if a.config[k] != base[k]] for a in arms}
    leader, changes = dict(arms[0].config), calls[arms[0].key]
    names = [c.knob for c in changes]
    note = f"{len(finals)} finalist(s) of {len(candidates)} configs that beat the baseline"
    if len(changes) > 1 and budget.minimize_pairs > 0:
        smaller, changes = _smaller(rt, model, leader, changes)
        parent = next((a for a in arms if rt.space.key(a.config) == rt.space.key(smaller)), None)
        if parent is None:
            reverts = tuple(k for k in names if smaller[k] != leader[k])
            parent = Arm(key="leader less " + ", ".join(reverts), kind=SMALLER, config=smaller,
                         source_trial_id=arms[0].source_trial_id, max_pairs=budget.verify_pairs,
                         parent=arms[0].key, reverts=reverts)
            arms.append(parent)
        seen = {rt.space.key(a.config) for a in arms}
        for c in sorted((c for c in changes if c.call == UNCERTAIN), key=leave_one_out_order):
            alone = {**parent.config, c.knob: c.baseline_value}
            if rt.space.violated(alone) or rt.space.key(alone) in seen:
                continue
            seen.add(rt.space.key(alone))
            arms.append(Arm(key=f"{parent.key} less {c.knob}", kind=LEAVE_ONE_OUT, config=alone,
                            source_trial_id=arms[0].source_trial_id, max_pairs=max(2, budget.minimize_pairs),
                            parent=parent.key, reverts=(*parent.reverts, c.knob)))
        calls[arms[0].key] = changes
        counts = {c: sum(1 for x in changes if x.call == c) for c in (PAYS, IDLE, UNCERTAIN, NEEDED, COUPLED)}
        note += "; the leader's changes: " + ", ".join(f"{n} {c}" for c, n in counts.items() if n)
    arms, rounds = within_cap(arms, rt.trials_left, doctor)
    if rounds < budget.verify_pairs:
        note += f"; the trial cap affords {rounds} round(s) of {len(arms)} arm(s)"
    plan = VerificationPlan(arms=tuple(arms), changes={k: tuple(v) for k, v in calls.items()},
                            noise_floor=doctor.noise_cv, note=note)
    rt.cdir.write_json(rt.cdir.plan, plan.to_json())
    return plan


def leave_one_out_order(c: ChangeEvidence) -> tuple[float, bool, str]:
    """The order uncertain changes get leave-one-out arms in, which a trial cap cuts from
    the end: least predicted contribution first (the likeliest to be dropped). Changes the
    runs in hand cannot tell apart (they only ever ran together) get one prediction, equal
    but for float noise in the last digits: among those a patch, code the user would carry,
    is measured before a launch knob, then by name."""
    return round(c.predicted or 0.0, 9), not c.knob.startswith(PATCH_KNOB_PREFIX), c.knob


def round_runs(arms: Sequence[Arm], doctor: DoctorReport) -> list[tuple[Config, Role]]:
    """The runs one round of ``arms`` makes: the baseline, a reference per other numerics
    class among them, each arm."""
    losses = doctor.loss_reference
    runs = [(dict(doctor.baseline), Role.VERIFY_BASELINE)] + [(a.config, a.role) for a in arms]
    if isinstance(losses, LossContract):
        classes = {losses.class_of(a.config) for a in arms} - {()}
        runs += [(losses.reference_config(c), Role.VERIFY_BASELINE) for c in classes]
    return runs


def round_cost(arms: Sequence[Arm], doctor: DoctorReport) -> int:
    """Trials one round of ``arms`` runs."""
    return len(round_runs(arms, doctor))


def within_cap(arms: Sequence[Arm], trials_left: int, doctor: DoctorReport) -> tuple[list[Arm], int]:
    """The arms the cap leaves room for and the rounds it affords them, each arm's most
    pairs cut to those rounds (never below two): arms leave from the last while fewer than
    ``MIN_ROUNDS`` rounds of all of them fit. Decided before any round runs, from the plan
    and the trials left alone, so the looks' error spending does not depend on the pairs."""
    arms = list(arms)
    while len(arms) > 1 and trials_left // round_cost(arms, doctor) < MIN_ROUNDS:
        arms.pop()
    rounds = trials_left // round_cost(arms, doctor)
    return [replace(a, max_pairs=max(2, min(a.max_pairs, rounds))) for a in arms], rounds


def finalist_plan(rt: CampaignRuntime, doctor: DoctorReport, trials: Sequence[TrialResult]) -> VerificationPlan:
    """A plan that verifies ``trials``' configs as they are, each a finalist, with no
    smaller configs: for checking given configs (a replayed cheat, a config by hand)."""
    base = full_baseline(rt, doctor)
    arms = tuple(Arm(key=f"finalist {i + 1}", kind=FINALIST, config={**base, **r.config}, source_trial_id=r.trial_id,
                     max_pairs=rt.spec.budget.verify_pairs) for i, r in enumerate(trials))
    return VerificationPlan(arms=arms, changes={}, noise_floor=doctor.noise_cv, note="finalists given by hand")
