"""run (between search and verification): what the trials already run say, before any
more are run: which configs verification measures, and which of the winner's changes.

Doctor's baseline runs, its calibration variants and the search's trials, all at the
contract's seed, fit the engine's models once more (time, memory, crash; every outcome).
From them:

- **Finalists**: the measured ok configs that beat the baseline by more than the practical
  margin (``budget.practical_margin``), ranked by the time model's prediction weighed with
  each config's own runs: the model's variance plus what its fit leaves unexplained beyond a
  run's noise, against doctor's noise over the runs (on a quiet machine a config's runs
  decide; on a noisy one its neighbours do). The leader is verified; a runner-up too
  while the model, weighed with the runs the same way, gives it at least ``RUNNER_UP_CHANCE``
  of being faster than the leader by more than the practical margin (up to
  ``budget.num_finalists``). Doctor's noise is no bar here either: minimization weighs a
  runner-up's pairs with that prediction, so one that a noisy machine's pairs cannot tell
  apart from the leader is not promoted on their say alone. Configs carrying a patch that
  broke the contract in any run are out.
- **The leader's changes**, each reverted alone, get a predicted contribution (the time
  without it over the time with it) with a 90% interval, and a call. A change is dropped
  only on evidence, and these calls are the predicted part of it:
  *pays* where the interval lies above 1 (above 1 + the margin for a change the user
  carries at a cost besides time: one that changes the numerics, or a code patch);
  *idle* where it lies below 1 + the margin (predicted to cost, or equivalent within the
  margin); *inert* where doctor's calibration ran it alone and saw the losses and the
  speed unmoved; *needed* where a recorded run without it failed or the memory model does
  not expect the config without it to fit (for a change the user carries at a cost, only
  where it is nearly sure, ``PAID_BAR``); *coupled* where leaving it out alone breaks a
  constraint; *uncertain* otherwise. With a declared job length the objective includes
  start-up, which the model does not predict: every change that is not inert, needed or
  coupled is then uncertain.
- **Arms**: the leader; the *smaller* config, the leader less every change there is
  evidence to drop now (idle, inert) and every numerics-changing or patch change not
  predicted to pay (those pay their way or go: the leader against the smaller config
  measures them), each revert kept feasible and, by the memory and crash models, likely to
  fit and to run; the runners-up; and the smaller config less each uncertain change
  (*leave-one-out*). Verification runs all of them in the same rounds against one baseline
  run each (``stages.verify``); minimization picks among those that cleared
  (``stages.minimize``). Each arm but the leader carries its predicted gain over the
  leader (the model's, weighed with both configs' runs where both have run), which
  minimization weighs against the pairs.

The plan is written to the campaign folder before any round runs, so a resumed campaign
verifies the same arms even if the bank or the priors changed meanwhile.
"""

from __future__ import annotations

import math
from dataclasses import asdict, replace
from typing import Any, Mapping, Sequence

import numpy as np
from scipy import stats

from infrarsi.contract.loss_contract import LossContract
from infrarsi.contract.numerics import changing_knobs
from infrarsi.core.knobs import PATCH_KNOB_PREFIX, Config, Value
from infrarsi.core.trial import Outcome, Role, TrialResult
from infrarsi.engine.time_model import with_measurements
from infrarsi.proposers.engine_proposer import CRASH_BAR, FIT_BAR
from infrarsi.record.campaign import read_plan, write
from infrarsi.record.verification import FINALIST, LEAVE_ONE_OUT, SMALLER, Arm, ChangeEvidence, VerificationPlan
from infrarsi.stages.calibration import inert_knobs
from infrarsi.stages.doctor import DoctorReport
from infrarsi.stages.runtime import CampaignRuntime

# A runner-up is verified beside the leader while the model, weighed with the runs, gives
# it this chance of being faster than the leader by more than the practical margin.
# (Against doctor's noise instead, a noisy machine verified the leader alone: on held-out
# simulated campaigns at 15% noise the promoted config fell from 0.912 to 0.889 of the
# oracle's speedup, docs/measured.md.)
RUNNER_UP_CHANCE = 0.10
# The predicted contribution's interval: two-sided 90%, each side a one-sided 95% bound.
INTERVAL = 0.90
_Z = float(stats.norm.ppf(0.5 + INTERVAL / 2))
# Under a trial cap, the arms run at most the rounds the cap affords with every arm in each
# round, and each arm's sequential test has its last look there; arms leave (leave-one-out
# first, then the smaller config, then runners-up) while fewer than this many rounds fit.
# A test whose last look is at pair 7 decides little at pair 3 (t = 9.9 at 0.5%); one that
# ends at pair 3 does (t = 3.1 at 4.5%): a capped default campaign once ran three rounds of
# a 3.2x leader that its early looks could not clear, and promoted a 2.2x leave-one-out arm.
MIN_ROUNDS = 3

# A change the user carries at a cost besides time (``must_pay``) is kept on the memory or
# crash model's word alone only where it gives the config without it less than this chance
# to fit or to run; above it the smaller config runs without the change, and a failed run
# there is the evidence. (At the engine's bars, 0.6 and 0.3, a do-nothing knob planted to
# change the numerics was kept on P(fit) 0.48 and on P(no crash) 0.25, docs/measured.md.)
PAID_BAR = 0.2

PAYS, IDLE, INERT, UNCERTAIN, NEEDED, COUPLED = "pays", "idle", "inert", "uncertain", "needed", "coupled"
CALLS = (PAYS, IDLE, INERT, UNCERTAIN, NEEDED, COUPLED)


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


def _candidates(rt: CampaignRuntime, history: Sequence[TrialResult], doctor: DoctorReport,
                base: Config) -> list[TrialResult]:
    """The fastest run of each distinct ok config that beats the baseline by more than the
    practical margin, without a patch that broke the contract anywhere."""
    tainted = tainted_patches(history)
    best: dict[tuple, TrialResult] = {}
    for r in history:
        config = {**base, **r.config}
        if (r.outcome is not Outcome.OK or r.role is Role.DOCTOR or config == base
                or any(config.get(k) is True for k in tainted)):
            continue
        key = tuple(sorted(config.items()))
        if key not in best or r.step_time_s < best[key].step_time_s:
            best[key] = r
    bar = doctor.step_time_s / (1 + rt.spec.budget.practical_margin)
    return [r for r in best.values() if r.step_time_s < bar]


def tainted_patches(trials: Sequence[TrialResult]) -> set[str]:
    """Patch knobs that were on in a run that broke the contract: a patch can keep the numerics
    in one config (bit-identical under bf16) and change them in another (fp32), so passing in
    the promoted config proves nothing about the rest, and such a patch is out of the campaign."""
    return {k for t in trials if t.outcome is Outcome.CONTRACT_VIOLATION
            for k, v in t.config.items() if k.startswith(PATCH_KNOB_PREFIX) and v is True}


def must_pay(rt: CampaignRuntime) -> set[str]:
    """Knobs whose change the user carries at a cost besides step time: those that change
    the numerics (``infrarsi.contract.numerics``: the job computes other numbers), code
    patches (code to keep) and, where the spec declares the job's length, compile knobs (a
    start-up paid on every run of the job, measured here with the compile cache the
    campaign's own trials warmed). Each is promoted only where shown to pay at least the
    margin."""
    objective = rt.spec.objective
    startup = ({n for n, k in rt.spec.knobs.items() if (k.kind or n) == "compile"}
               if objective.job_steps is not None or objective.job_hours is not None else set())
    return {*changing_knobs(rt.spec.knobs), *(n for n in rt.space.names if n.startswith(PATCH_KNOB_PREFIX)),
            *startup}


def _finalists(rt: CampaignRuntime, model: Any, candidates: list[TrialResult], history: Sequence[TrialResult],
               base: Config, threshold: float, noise: float) -> list[TrialResult]:
    """The leader by the time model's posterior weighed with each config's own runs
    (``with_measurements``), then runners-up with a real chance of being faster than it by
    more than ``threshold`` (the log of 1 + the practical margin)."""
    space, tm = rt.space, model.time_model
    configs = [{**base, **r.config} for r in candidates]
    pred, sds = tm.predict(np.array([space.indices(c) for c in configs]))
    lack = tm.lack_of_fit_var(noise)
    est = []
    for i, config in enumerate(configs):
        runs = _runs_of(config, history, base)
        est.append(with_measurements(pred[i], sds[i] ** 2 + lack, float(np.mean(runs)), noise**2 / len(runs))[0])
    order = sorted(range(len(candidates)), key=lambda i: (est[i], candidates[i].step_time_s))
    out = [candidates[order[0]]]
    for i in order[1:]:
        if len(out) >= rt.spec.budget.num_finalists:
            break
        gap, sd = _gap(rt, model, configs[i], configs[order[0]], history, base, noise)
        if stats.norm.cdf((-gap - threshold) / sd) >= RUNNER_UP_CHANCE:
            out.append(candidates[i])
    return out


def _gap(rt: CampaignRuntime, model: Any, config: Config, leader: Config, history: Sequence[TrialResult],
         base: Config, noise: float) -> tuple[float, float]:
    """Mean and sd of log t(config) - log t(leader): the time model's, weighed with the two
    configs' own runs where both have run (``noise``: a run's, log scale)."""
    tm = model.time_model
    gap, sd = tm.predict_difference(np.array(rt.space.indices(config)), np.array(rt.space.indices(leader)))
    mine, theirs = _runs_of(config, history, base), _runs_of(leader, history, base)
    if not mine or not theirs:
        return gap, sd
    return with_measurements(gap, sd**2 + 2 * tm.lack_of_fit_var(noise), float(np.mean(mine) - np.mean(theirs)),
                             noise**2 * (1 / len(mine) + 1 / len(theirs)))


def _runs_of(config: Config, history: Sequence[TrialResult], base: Config) -> list[float]:
    """The log step times of ``config``'s ok runs in ``history`` (doctor's baseline runs aside)."""
    return [math.log(r.step_time_s) for r in history
            if r.outcome is Outcome.OK and r.role is not Role.DOCTOR and {**base, **r.config} == config]


def _failed_without(history: Sequence[TrialResult], config: Config, base: Config) -> TrialResult | None:
    return next((r for r in history if r.outcome is not Outcome.OK and {**base, **r.config} == config), None)


def _call(rt: CampaignRuntime, model: Any, leader: Config, knob: str, base: Config, history: Sequence[TrialResult],
          *, margin: float, per_step: bool, inert: Mapping[str, Value], paid: bool) -> ChangeEvidence:
    """What the runs in hand say about the leader's change of ``knob``; ``paid``: it must be
    shown to pay at least the margin (numerics or a patch, ``must_pay``)."""
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
    if p_fit < (PAID_BAR if paid else FIT_BAR):
        return ChangeEvidence(**common, **predicted, call=NEEDED,
                              reason=f"the memory model gives the config without it P(fit) = {p_fit:.2f}")
    if inert.get(knob) == leader[knob]:
        return ChangeEvidence(**common, **predicted, call=INERT, reason=(
            "inert: doctor's calibration ran it alone and saw the baseline's losses and speed unmoved"))
    if not per_step:
        return ChangeEvidence(**common, **predicted, call=UNCERTAIN,
                              reason="a declared job length counts start-up, which the model does not predict")
    bar = math.log1p(margin) if paid else 0.0
    if low > bar:
        return ChangeEvidence(**common, **predicted, call=PAYS, reason=(
            f"predicted to pay: its interval lies above {'1 + the margin' if paid else '1'}"))
    if high < math.log1p(margin):
        return ChangeEvidence(**common, **predicted, call=IDLE, reason=(
            "predicted to cost: its interval lies below 1" if high < 0 else
            "predicted equivalent: its interval lies below 1 + the margin"))
    return ChangeEvidence(**common, **predicted, call=UNCERTAIN, reason="the model cannot call it: measured "
                          + ("with the leader against the smaller config" if paid else "by leaving it out"))


def _without_unpaid(rt: CampaignRuntime, arm: Arm, changes: list[ChangeEvidence], paid: set[str]) -> Arm:
    """A runner-up verified without its numerics changes and patches that are not predicted
    to pay: only the leader gets arms that measure them, and one not shown to pay is never
    promoted, so the runner-up as measured could not be (where leaving one out keeps the
    config feasible)."""
    config = dict(arm.config)
    for c in changes:
        trial = {**config, c.knob: c.baseline_value}
        if c.knob in paid and c.call != PAYS and not rt.space.violated(trial):
            config = trial
    return replace(arm, config=config)


def _reverted(c: ChangeEvidence, paid: set[str]) -> bool:
    """Whether the smaller config leaves ``c`` out: evidence to drop it is in hand, or it
    is a change the user carries at a cost (numerics, a patch) not predicted to pay."""
    return c.call in (IDLE, INERT) or (c.call == UNCERTAIN and c.knob in paid)


def _smaller(rt: CampaignRuntime, model: Any, leader: Config, changes: list[ChangeEvidence], paid: set[str]
             ) -> tuple[dict[str, Value], list[ChangeEvidence]]:
    """The leader less every change ``_reverted`` picks that can go, least predicted
    contribution first: each revert must keep the config feasible and, by the models,
    likely to fit and to run (a change the user carries at a cost: not nearly sure to fail,
    ``PAID_BAR``)."""
    space, config, out = rt.space, dict(leader), []
    for c in sorted(changes, key=lambda c: (not _reverted(c, paid), c.predicted or 0.0)):
        if not _reverted(c, paid):
            out.append(c)
            continue
        trial = {**config, c.knob: c.baseline_value}
        idx = np.array(space.indices(trial))[None]
        p_fit = float(model.memory_model.fit_probability_main(model.encoding.main(idx))[0])
        p_ok = float(model.crash_model.no_crash_probability(idx)[0])
        fit_bar, crash_bar = (PAID_BAR, PAID_BAR) if c.knob in paid else (FIT_BAR, CRASH_BAR)
        if space.violated(trial) or p_fit < fit_bar or p_ok < crash_bar:
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
    done = read_plan(rt.cdir)
    if done is not None:
        return done
    budget, margin = rt.spec.budget, rt.spec.budget.practical_margin
    base = full_baseline(rt, doctor)
    candidates = _candidates(rt, history, doctor, base)
    if not candidates:
        plan = VerificationPlan(arms=(), changes={}, margin=margin, note=(
            f"no run beat the baseline by more than the practical margin ({margin:.1%}): nothing to verify"))
        write(rt.cdir, rt.cdir.plan, plan)
        return plan
    model = evidence_model(rt, priors, history)
    noise = max(math.log1p(doctor.noise_cv), 1e-3)  # a run's, log scale
    finals = _finalists(rt, model, candidates, history, base, math.log1p(margin), noise)
    arms = [Arm(key=f"finalist {i + 1}", kind=FINALIST, config={**base, **r.config}, source_trial_id=r.trial_id,
                max_pairs=budget.verify_pairs) for i, r in enumerate(finals)]
    paid, inert = must_pay(rt), inert_knobs(doctor, rt.ledger.trials(), margin)
    per_step = rt.spec.objective.job_steps is None and rt.spec.objective.job_hours is None
    calls = {a.key: [_call(rt, model, dict(a.config), k, base, history, margin=margin, per_step=per_step,
                           inert=inert, paid=k in paid)
                     for k in rt.space.names if a.config[k] != base[k]] for a in arms}
    arms[1:] = [_without_unpaid(rt, a, calls[a.key], paid) for a in arms[1:]]
    leader, changes = dict(arms[0].config), calls[arms[0].key]
    names = [c.knob for c in changes]
    note = f"{len(finals)} finalist(s) of {len(candidates)} configs that beat the baseline"
    if len(changes) > 1 and budget.minimize_pairs > 0:
        smaller, changes = _smaller(rt, model, leader, changes, paid)
        parent = next((a for a in arms if rt.space.key(a.config) == rt.space.key(smaller)), None)
        if parent is None:
            reverts = tuple(k for k in names if smaller[k] != leader[k])
            parent = Arm(key="leader less " + ", ".join(reverts), kind=SMALLER, config=smaller,
                         source_trial_id=arms[0].source_trial_id, max_pairs=budget.verify_pairs,
                         parent=arms[0].key, reverts=reverts)
            arms.insert(1, parent)  # before the runners-up: the cap takes them first
        seen = {rt.space.key(a.config) for a in arms}
        for c in sorted((c for c in changes if c.call == UNCERTAIN and c.knob not in paid), key=leave_one_out_order):
            alone = {**parent.config, c.knob: c.baseline_value}
            if rt.space.violated(alone) or rt.space.key(alone) in seen | {rt.space.key(base)}:
                continue  # the baseline itself: the smaller config's own verdict measures the change
            seen.add(rt.space.key(alone))
            arms.append(Arm(key=f"{parent.key} less {c.knob}", kind=LEAVE_ONE_OUT, config=alone,
                            source_trial_id=arms[0].source_trial_id, max_pairs=max(2, budget.minimize_pairs),
                            parent=parent.key, reverts=(*parent.reverts, c.knob)))
        calls[arms[0].key] = changes
        counts = {c: sum(1 for x in changes if x.call == c) for c in CALLS}
        note += "; the leader's changes: " + ", ".join(f"{n} {c}" for c, n in counts.items() if n)
    arms, rounds = within_cap(arms, rt.trials_left, doctor)
    if per_step:
        arms = [arms[0], *(_predicted(rt, model, a, arms[0], history, base, noise) for a in arms[1:])]
    if rounds < budget.verify_pairs:
        note += f"; the trial cap affords {rounds} round(s) of {len(arms)} arm(s)"
    plan = VerificationPlan(arms=tuple(arms), changes={k: tuple(v) for k, v in calls.items()}, margin=margin,
                            note=note)
    write(rt.cdir, rt.cdir.plan, plan)
    return plan


def _predicted(rt: CampaignRuntime, model: Any, arm: Arm, leader: Arm, history: Sequence[TrialResult],
               base: Config, noise: float) -> Arm:
    """``arm`` with its predicted gain over the leader (log scale) and its sd (``_gap``)."""
    gap, sd = _gap(rt, model, dict(arm.config), dict(leader.config), history, base, noise)
    return replace(arm, predicted_gain=-float(gap), predicted_sd=float(sd))


def leave_one_out_order(c: ChangeEvidence) -> tuple[float, str]:
    """The order uncertain changes get leave-one-out arms in, which a trial cap cuts from
    the end: least predicted contribution first (the likeliest to be dropped). Changes the
    runs in hand cannot tell apart (they only ever ran together) get one prediction, equal
    but for float noise in the last digits: those go by name, so the noise never decides."""
    return round(c.predicted or 0.0, 9), c.knob


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
    return VerificationPlan(arms=arms, changes={}, margin=rt.spec.budget.practical_margin,
                            note="finalists given by hand")
