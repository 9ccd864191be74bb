"""run (verification): re-measure the plan's arms against the baseline, interleaved, and
stop each as soon as its sequential test decides.

Each round runs the baseline, then every arm still open (A B C A B C ...), so each arm's
run is paired with a baseline run taken moments before and slow drifts of a shared
machine cancel in the ratio; one baseline run serves every arm of its round, the
finalists and minimization's smaller configs alike (``stages.evidence`` plans the arms).
After each round, ``infrarsi.stages.run.sequential`` looks at every open arm: a finalist
or smaller config whose lower bound clears 1 + the practical margin
(``budget.practical_margin``) is decided and stops running, as is one that can no longer
clear, or is unlikely to by its last pair; the noise is in the bound's width, so a noisy
machine runs more rounds rather than facing a higher bar. A leave-one-out arm is decided
when its contribution (its objective over its parent's in the same rounds) clearly pays,
or clearly does not and its own test against the baseline has decided too (it may be
promoted in its parent's place), and its parent runs as long as it does. A run that fails
ends its arm: a config with a failed run is never promoted. With a declared job length the
ratios are of whole-job times (start-up plus steps x step time), and the per-step speedup
is reported beside them.

Each round runs at its own canary seed (the contract's seed + 1000 + round), and every
arm's losses are compared with a run in its own numerics at that seed (a candidate in
another numerics class, e.g. bf16, with a run of the baseline in that class, at that
class's tolerance: ``infrarsi.stages.canary.canary_loss_check``). The search compared
losses at the contract's seed, where a job that replays the baseline's recorded numbers
while skipping the work is indistinguishable from an honest one; at a seed it has not
seen, its replayed trajectory no longer matches. A job that ignores the seed it is given
defeats this; ``canary_check`` says so instead of counting it as a check.

Rounds fit the campaign's trial cap: the plan already cut each arm's most pairs to the
rounds the cap affords (``evidence.within_cap``), and a round that would still not fit
(a reference or a canary split the plan did not foresee) leaves arms out, the
leave-one-out arms first, then the smaller config, then runners-up; the leader last.
Every run is a ledger line, and a resumed campaign takes the recorded runs back instead
of running them again.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping, Sequence

from infrarsi.contract.checks import enforce
from infrarsi.contract.loss_contract import LossContract
from infrarsi.contract.loss_reference import LossReference
from infrarsi.core.knobs import Config
from infrarsi.core.objective import job_steps, run_time_s
from infrarsi.core.trial import Outcome, Role, TrialResult
from infrarsi.record.campaign import read_verification, write
from infrarsi.record.verification import FINALIST, LEAVE_ONE_OUT, Arm, Verdict, VerificationPlan, VerificationReport
from infrarsi.stages.budget import TrialBudgetExhausted
from infrarsi.stages.canary import canary_loss_check, canary_split_runner
from infrarsi.stages.doctor import DoctorReport
from infrarsi.stages.run.evidence import round_runs
from infrarsi.stages.run.sequential import Decision, Look, SequentialRule, log_ratios, look
from infrarsi.stages.runtime import CampaignRuntime

# A canary run whose losses sit this close to the reference's did not see its seed.
CANARY_MIN_DEVIATION = 1e-9


def canary_seed(contract_seed: int, round_index: int) -> int:
    return contract_seed + 1000 + round_index


def objective_look(rule: SequentialRule, slower: Sequence[TrialResult], faster: Sequence[TrialResult],
                   margin: float, steps: float | None) -> Look:
    """The sequential look at ``slower`` over ``faster`` run by run, on the objective."""
    return look(rule, log_ratios([run_time_s(a, steps) for a in slower], [run_time_s(b, steps) for b in faster]),
                margin)


class Replay:
    """Runs of this stage a killed campaign already recorded, handed back instead of run
    again: each is taken by (role, config, seed), at most once."""

    def __init__(self, rt: CampaignRuntime) -> None:
        self.rt = rt
        self.recorded = [t for t in rt.ledger.trials()
                         if not t.extra.get("retried") and t.extra.get("job_seed") is not None
                         and t.role in (Role.VERIFY, Role.VERIFY_BASELINE, Role.MINIMIZE, Role.CALIBRATE)]

    def _find(self, config: Config, role: Role, seed: int) -> int | None:
        return next((i for i, t in enumerate(self.recorded) if t.role is role and t.extra["job_seed"] == seed
                     and dict(t.config) == dict(config)), None)

    def has(self, config: Config, role: Role, seed: int) -> bool:
        return self._find(config, role, seed) is not None

    def run(self, config: Config, role: Role, seed: int, check: Callable[[TrialResult], TrialResult] | None
            ) -> TrialResult:
        i = self._find(config, role, seed)
        if i is not None:
            return self.recorded.pop(i)
        return self.rt.run_one(config, role, check=check, seed=seed)


@dataclass
class _Arm:
    """An arm's state across rounds."""

    arm: Arm
    rule: SequentialRule
    pairs: list[tuple[TrialResult, TrialResult]] = field(default_factory=list)  # (baseline, arm) per round run
    seeds: list[int] = field(default_factory=list)
    decided: str = ""  # why it stopped running ("" while open)
    num_decided: int | None = None  # pairs when it was decided

    @property
    def open(self) -> bool:
        return not self.decided


def _decide(state: _Arm, states: Mapping[str, _Arm], margin: float, steps: float | None) -> None:
    """After a round: whether ``state``'s arm is decided, and why."""
    a, b = state.pairs[-1]
    if a.outcome is not Outcome.OK or b.outcome is not Outcome.OK:
        state.decided, state.num_decided = "a run failed", len(state.pairs)
        return
    if state.arm.kind == LEAVE_ONE_OUT:
        if states[state.arm.parent].decided == "a run failed":
            state.decided, state.num_decided = "the config it leaves a change out of failed", len(state.pairs)
            return
        both = _shared(states[state.arm.parent], state)
        if not both:
            return
        # no futility stop here: a change is dropped on evidence, not on its pairs running short
        lk = objective_look(replace(state.rule, futility_z=None), [x for _, x in both], [p for p, _ in both],
                            margin, steps)
        last = lk.num_pairs >= state.rule.max_pairs
        if lk.decision is Decision.CANNOT_CLEAR and not last \
                and _own_look(state, margin, steps).decision is Decision.CONTINUE:
            # Its change does not pay, so it may be promoted in its parent's place, which needs
            # it to clear the baseline on its own pairs: it runs on until that test decides (two
            # pairs whose baselines' start-ups differed once left it short).
            return
        why = {Decision.CLEARS: "its change pays", Decision.CANNOT_CLEAR: "measured to its last pair"
               if last else "its change does not pay"}.get(lk.decision)
    else:
        why = {Decision.CLEARS: "it clears", Decision.CANNOT_CLEAR: "it cannot clear",
               Decision.FUTILE: "it is unlikely to clear by its last pair"}.get(
            _own_look(state, margin, steps).decision)
    if why:
        state.decided, state.num_decided = why, len(state.pairs)


def _own_look(state: _Arm, margin: float, steps: float | None) -> Look:
    """The arm against the baseline, on its pairs so far."""
    return objective_look(state.rule, [x for x, _ in state.pairs], [y for _, y in state.pairs], margin, steps)


def _shared(parent: _Arm, child: _Arm) -> list[tuple[TrialResult, TrialResult]]:
    """(parent's run, child's run) of the rounds both ran, both ok."""
    by_baseline = {a.trial_id: b for a, b in parent.pairs}
    return [(by_baseline[a.trial_id], b) for a, b in child.pairs
            if a.trial_id in by_baseline and by_baseline[a.trial_id].outcome is Outcome.OK
            and b.outcome is Outcome.OK]


def _needed(states: list[_Arm]) -> list[_Arm]:
    """The arms that run this round: the open ones, and the parent of each open leave-one-out arm."""
    run = {s.arm.key for s in states if s.open}
    run |= {s.arm.parent for s in states if s.open and s.arm.kind == LEAVE_ONE_OUT}
    return [s for s in states if s.arm.key in run]


def _cost(rt: CampaignRuntime, doctor: DoctorReport, replay: Replay, arms: list[_Arm], seed: int) -> int:
    """New trials a round of ``arms`` runs (``evidence.round_runs``) that a killed campaign did not record."""
    return sum(1 for cfg, role in round_runs([s.arm for s in arms], doctor) if not replay.has(cfg, role, seed))


def _fit_budget(rt: CampaignRuntime, doctor: DoctorReport, replay: Replay, states: list[_Arm], seed: int) -> list[_Arm]:
    """This round's arms within the trials left, counting the rounds each still needs to
    reach its fewest pairs (an arm that cannot get there would be run for nothing): the
    last-planned open arms leave first."""
    while True:
        needed = _needed(states)
        rounds = max((s.rule.min_pairs - len(s.pairs) for s in needed if s.open), default=1)
        if not needed or max(rounds, 1) * _cost(rt, doctor, replay, needed, seed) <= rt.trials_left:
            return needed
        last = [s for s in states if s.open][-1]
        last.decided, last.num_decided = "the trial cap (budget.max_trials) left no room", len(last.pairs)


def _canary_check(rt: CampaignRuntime, doctor: DoctorReport, a: TrialResult, seed: int, configs: list[Config],
                  replay: Replay) -> Callable[[TrialResult], TrialResult]:
    """Each arm's loss against a run in its own numerics at the canary seed."""
    contract, losses = rt.spec.contract, doctor.loss_reference
    if isinstance(losses, LossContract):
        return canary_loss_check(contract, losses, a, seed, configs, lambda cfg: replay.run(
            cfg, Role.VERIFY_BASELINE, seed, lambda r: enforce(r, contract, None)),
            canary_split_runner(rt, seed, replay.run))
    reference = LossReference(losses=a.losses, tolerance=doctor.loss_tolerance,
                              name=f"the baseline at canary seed {seed} ({a.trial_id})")
    return lambda r: enforce(r, contract, reference if a.outcome is Outcome.OK else None)


def _run_rounds(rt: CampaignRuntime, doctor: DoctorReport, plan: VerificationPlan, margin: float,
                steps: float | None) -> tuple[list[_Arm], list[dict[str, Any]]]:
    contract, replay = rt.spec.contract, Replay(rt)
    states = [_Arm(arm=a, rule=SequentialRule(max_pairs=a.max_pairs)) for a in plan.arms]
    by_key = {s.arm.key: s for s in states}
    rounds: list[dict[str, Any]] = []
    for i in range(max((a.max_pairs for a in plan.arms), default=0)):
        seed = canary_seed(contract.seed, i)
        needed = _fit_budget(rt, doctor, replay, states, seed)
        if not needed:
            break
        runs: dict[str, str] = {}
        try:
            a = replay.run(doctor.baseline, Role.VERIFY_BASELINE, seed, lambda r: enforce(r, contract, None))
            check = _canary_check(rt, doctor, a, seed, [s.arm.config for s in needed], replay)
            for s in needed:
                b = replay.run(s.arm.config, s.arm.role, seed, check)
                s.pairs.append((a, b))
                s.seeds.append(seed)
                runs[s.arm.key] = b.trial_id
        except TrialBudgetExhausted:  # a reference the round's estimate did not foresee took the last trial
            for s in states:
                if s.open:
                    s.decided, s.num_decided = "the trial cap (budget.max_trials) left no room", len(s.pairs)
            break
        finally:
            if runs:
                rounds.append({"seed": seed, "baseline": a.trial_id, "runs": runs})
        for s in needed:
            if s.open:
                _decide(s, by_key, margin, steps)
    return states, rounds


def _verdict(state: _Arm, margin: float, steps: float | None) -> Verdict:
    """The verdict on an arm against the baseline, from the pairs its decision used. A run
    that failed after the decision (one the arm ran as another arm's parent) still fails it:
    a config with a failed run, a loss off its reference at a canary seed above all, is
    never promoted."""
    pairs = state.pairs[:state.num_decided] if state.num_decided else state.pairs
    seeds = state.seeds[:len(pairs)]
    problems = [f"{r.trial_id} ({r.role.value}) {r.outcome.value}: {r.reason}"
                for pair in state.pairs for r in pair if r.outcome is not Outcome.OK]
    good = [(a, b) for a, b in pairs if a.outcome is Outcome.OK and b.outcome is Outcome.OK]
    arm = state.arm
    common = dict(config=dict(arm.config), source_trial_id=arm.source_trial_id, arm=arm.key, kind=arm.kind,
                  canary_seeds=tuple(s for s, (a, b) in zip(seeds, pairs)
                                     if a.outcome is Outcome.OK and b.outcome is Outcome.OK),
                  pairs=tuple((a.trial_id, b.trial_id) for a, b in good),
                  baseline_times_s=tuple(a.step_time_s for a, _ in good),
                  candidate_times_s=tuple(b.step_time_s for _, b in good),
                  baseline_startups_s=tuple(a.startup_s or 0.0 for a, _ in good),
                  candidate_startups_s=tuple(b.startup_s or 0.0 for _, b in good), job_steps=steps)
    if problems or len(good) < state.rule.min_pairs:
        why = ("a verification run failed: " + "; ".join(problems) if problems
               else f"only {len(good)} ok pair(s): too few to decide ({state.decided or 'not run'})")
        return Verdict(**common, speedup=None, ci_low=None, ci_high=None, promoted=False, reason=why,
                       margin=margin)
    lk = objective_look(state.rule, [a for a, _ in good], [b for _, b in good], margin, steps)
    step = look(state.rule, log_ratios(common["baseline_times_s"], common["candidate_times_s"]), margin)
    clears = lk.decision is Decision.CLEARS
    what = "per step" if steps is None else f"end to end over {steps:,.0f} steps"
    level = state.rule.level(len(good))
    reason = (f"lower bound {math.exp(lk.low):.3f} ({what}; {len(good)} pairs, each bound at {level:.2%}) "
              f"{'clears' if clears else 'does not clear'} 1 + the practical margin {lk.margin:.3f}")
    if steps is not None and step.low > step.threshold and not clears:
        reason += f"; faster per step ({math.exp(step.mean):.3f}x) but its start-up is not repaid within the job"
    if arm.kind != FINALIST:
        reason += f"; a smaller config of the leader: minimization decides ({state.decided or 'open'})"
    return Verdict(**common, speedup=math.exp(lk.mean), ci_low=math.exp(lk.low), ci_high=math.exp(lk.high),
                   promoted=clears and arm.kind == FINALIST, clears=clears, reason=reason,
                   step_speedup=math.exp(step.mean), step_ci_low=math.exp(step.low), step_ci_high=math.exp(step.high),
                   margin=lk.margin, pair_noise_cv=lk.pair_noise_cv, level=level)


def canary_check(doctor: DoctorReport, baseline_runs: list[TrialResult]) -> tuple[bool | None, str]:
    """Whether the canary seeds reached the job: a baseline run at a canary seed whose losses
    match the reference (taken at the contract's seed) no more loosely than repeats at one
    seed match each other says the job ignores the seed, so the canary checked nothing."""
    ok = [r for r in baseline_runs if r.outcome is Outcome.OK and r.losses]
    if not ok or not doctor.reference_losses:
        return None, "no baseline run at a canary seed finished; the canary could not be assessed"
    repeats = max((abs(row.get("deviation") or 0.0) for row in doctor.calibration
                   if row.get("config") == "baseline repeats"), default=0.0)
    same_seed_spread = max(2.0 * repeats, CANARY_MIN_DEVIATION)
    reference = LossReference(losses=doctor.reference_losses, tolerance=float("inf"))
    moved = max(abs(reference.deviation(r.losses)[0]) for r in ok)
    if moved > same_seed_spread:
        return True, f"canary seeds moved the baseline's losses by up to {moved:.2e} (same-seed spread {repeats:.2e})"
    return False, (f"canary ineffective: at the canary seeds the baseline's losses moved by {moved:.2e}, no more "
                   f"than repeats at one seed ({repeats:.2e}): the job ignores the seed it is given, so "
                   "verification could not tell an honest job from one that replays recorded losses")


def run_verification(rt: CampaignRuntime, doctor: DoctorReport, plan: VerificationPlan) -> VerificationReport:
    done = read_verification(rt.cdir)
    if done is not None:
        return done
    steps = job_steps(rt.spec.objective, doctor.step_time_s, doctor.startup_s)
    margin = rt.spec.budget.practical_margin
    states, rounds = _run_rounds(rt, doctor, plan, margin, steps)
    baselines = list({a.trial_id: a for s in states for a, _ in s.pairs}.values())
    effective, note = canary_check(doctor, baselines)
    verdicts = tuple(_verdict(s, margin, steps) for s in states)
    observed = max((v.pair_noise_cv for v in verdicts if v.pair_noise_cv is not None), default=None)
    stopped = [f"{s.arm.key}: {s.decided} after {s.num_decided or len(s.pairs)} round(s)" for s in states]
    report = VerificationReport(verdicts=verdicts, margin=margin,
                                doctor_noise_cv=doctor.noise_cv, observed_noise_cv=observed,
                                canary_effective=effective, canary_note=note, plan=plan,
                                rounds=tuple(rounds), note="; ".join(stopped))
    write(rt.cdir, rt.cdir.verification, report)
    return report
