"""run (minimization, after verification): promote the smallest change the evidence allows.

The verified winner usually changes several knobs; some do nothing for the user (a
precision knob a CPU job ignores, a compile whose start-up a short job never repays).
No trial runs here: verification already measured the plan's arms side by side
(``stages.evidence`` plans them, ``stages.verify`` runs them): the finalists, the leader
less the changes there was evidence to drop (the *smaller* config), and that config less
each change the time model could not call (*leave-one-out*).

The fastest arm that cleared verification (its pairs against the leader weighed with the
time model's prediction: ``gains``) is promoted unless the evidence says the user loses
nothing by less: failing to show a difference is not evidence of none. A change is
dropped only on one of these grounds (``Ground``):

- *equivalent*: leaving it out is shown to cost less than the practical margin
  (``budget.practical_margin``): the upper bound of its contribution, measured by its
  leave-one-out arm or predicted by the time model, lies below 1 + the margin; or the arm
  without it (with others) is shown within the margin of the fastest in the rounds they
  shared;
- *costs*: that bound lies below 1;
- *inert*: doctor's calibration ran it alone and saw the losses and the speed unmoved;
- *not shown to pay*: a change the user carries at a cost besides step time (one that
  changes the numerics, a code patch, a compile whose start-up the declared job pays on
  every run) stays only where shown to pay at least the margin (a measured interval above
  1 but not above 1 + the margin does not keep it).

A smaller arm replaces the fastest where every change it leaves out has one of these
grounds and the rounds they shared do not show it slower, or where those rounds show it
within the margin; a change whose measured contribution lies above 1 is never dropped,
unless its whole interval lies below 1 + the margin (shown equivalent), or it is one that
must pay the margin and its interval does not clear 1 + the margin.
An arm carrying a patch that broke the contract in any run is never promoted. Each of the
leader's changes is reported with its contribution (the objective without it over with
it; > 1: it pays), where that figure comes from (*measured* by leave-one-out pairs, or
*predicted* with the model's 90% interval) and the ground it was kept or dropped on.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, replace
from typing import Mapping

from infrarsi.core.knobs import Value
from infrarsi.core.objective import job_steps, run_time_s
from infrarsi.core.trial import Outcome, Role, TrialResult
from infrarsi.record.campaign import read_minimize, write
from infrarsi.record.minimize import Contribution, MinimizeReport
from infrarsi.stages.calibration import inert_knobs
from infrarsi.stages.doctor import DoctorReport
from infrarsi.stages.run.evidence import (
    COUPLED,
    IDLE,
    LEAVE_ONE_OUT,
    NEEDED,
    PAYS,
    ChangeEvidence,
    VerificationPlan,
    full_baseline,
    must_pay,
    tainted_patches,
)
from infrarsi.stages.run.sequential import Look, SequentialRule, log_ratios, look
from infrarsi.stages.run.verify import Verdict, VerificationReport
from infrarsi.stages.runtime import CampaignRuntime


class Ground:
    """Why a change was kept or dropped: the short names the report and the console show."""

    EQUIVALENT = "equivalent"
    COSTS = "costs"
    INERT = "inert"
    NOT_SHOWN = "not shown to pay"
    PAYS = "pays"
    NEEDED = "needed"
    COUPLED = "coupled"
    NO_EVIDENCE = "no evidence to drop it"
    NO_ARM = "no promotable arm without it"
    FASTEST_WITHOUT = "the fastest arm leaves it out"
    NOT_CLEARED = "no arm with it cleared verification"
    SET_EQUIVALENT = "equivalent (measured with the other changes left out)"
    ONLY_CHANGE = "the verified speedup"


class _Runs:
    """Each arm's ok run by round, from verification's rounds and the ledger."""

    def __init__(self, rt: CampaignRuntime, verification: VerificationReport) -> None:
        by_id = {t.trial_id: t for t in rt.ledger.trials() if not t.extra.get("retried")}
        self.by_arm: dict[str, dict[int, TrialResult]] = {}
        for i, rnd in enumerate(verification.rounds):
            for arm, trial_id in rnd["runs"].items():
                self.by_arm.setdefault(arm, {})[i] = by_id[trial_id]

    def shared(self, a: str, b: str) -> list[tuple[TrialResult, TrialResult]]:
        """(a's run, b's run) of every round both ran, both ok."""
        ra, rb = self.by_arm.get(a, {}), self.by_arm.get(b, {})
        return [(ra[i], rb[i]) for i in sorted(set(ra) & set(rb))
                if ra[i].outcome is Outcome.OK and rb[i].outcome is Outcome.OK]

    def failed_without(self, parent: str, child: str) -> TrialResult | None:
        """A child's run that failed in a round where its parent's run was ok."""
        ra, rb = self.by_arm.get(parent, {}), self.by_arm.get(child, {})
        return next((rb[i] for i in sorted(set(ra) & set(rb))
                     if ra[i].outcome is Outcome.OK and rb[i].outcome is not Outcome.OK), None)


def _paired_look(pairs: list[tuple[TrialResult, TrialResult]], margin: float, steps: float | None) -> Look:
    """The sequential test's last look at ``pairs`` (a's run, b's run): the bounds on how
    much faster b is than a, at the level a candidate clears the baseline at."""
    logs = log_ratios([run_time_s(a, steps) for a, _ in pairs], [run_time_s(b, steps) for _, b in pairs])
    return look(SequentialRule(max_pairs=max(len(logs), 2)), logs, margin)


@dataclass(frozen=True, kw_only=True)
class _Evidence:
    """What is known about one change of the leader."""

    change: ChangeEvidence
    contribution: Contribution  # kept=True, ground="" until the choice
    drop: str | None  # a Ground to drop it on, or None
    keep: str  # the Ground to keep it on where it is kept
    measured_pays: bool = False  # measured to pay (above 1, not within the margin): never dropped


def _evidence(c: ChangeEvidence, plan: VerificationPlan, runs: _Runs, paid: bool, inert: bool, margin: float,
              steps: float | None, measure: bool) -> _Evidence:
    """Change ``c``'s contribution and grounds, from the pairs of an arm that leaves out just
    this change against its parent where one ran (a leave-one-out arm, or a smaller config
    that reverts only this change; ``measure``: the leader's family), else from the time
    model's call."""
    common = dict(knob=c.knob, baseline_value=c.baseline_value, value=c.value, inert=inert)
    arm = next((a for a in plan.arms if a.parent and a.reverts[-1:] == (c.knob,)
                and (a.kind == LEAVE_ONE_OUT or len(a.reverts) == 1)), None) if measure else None
    pairs = runs.shared(arm.key, arm.parent) if arm is not None else []  # (without it, with it)
    if len(pairs) >= 2:
        job, step = _paired_look(pairs, margin, steps), _paired_look(pairs, margin, None)
        contribution = Contribution(**common, contribution=math.exp(job.mean), ci_low=math.exp(job.low),
                                    ci_high=math.exp(job.high), step_contribution=math.exp(step.mean),
                                    pairs=tuple((w.trial_id, o.trial_id) for o, w in pairs), source="measured")
        low, high, where = job.low, job.high, "measured"
    else:
        failed = runs.failed_without(arm.parent, arm.key) if arm is not None else None
        contribution = Contribution(**common, contribution=c.predicted, ci_low=c.predicted_low,
                                    ci_high=c.predicted_high, step_contribution=c.predicted, source="predicted",
                                    note=f"without it {failed.trial_id} ended {failed.outcome.value} "
                                         f"({failed.reason[:120]})" if failed else c.reason)
        if failed is not None:
            return _Evidence(change=c, contribution=contribution, drop=None, keep=Ground.NEEDED)
        if c.call in (NEEDED, COUPLED):
            return _Evidence(change=c, contribution=contribution, drop=None, keep=c.call)
        called = c.call in (PAYS, IDLE) and c.predicted_low is not None  # else its interval decides nothing
        low, high = (math.log(c.predicted_low), math.log(c.predicted_high)) if called else (-math.inf, math.inf)
        where = "predicted"
    bar = math.log1p(margin)
    # Paying means above 1 and not shown within the margin (a gain of 0.003% that two quiet
    # pairs pin down is still below what the user asked to be shown), and for a change the
    # user carries at a cost besides time (numerics, a patch), above 1 + the margin.
    pays = low > (bar if paid else 0.0) and high >= bar
    if pays:
        return _Evidence(change=c, contribution=contribution, drop=None, keep=f"{Ground.PAYS} ({where})",
                         measured_pays=where == "measured")
    drop = (Ground.INERT if inert else f"{Ground.COSTS} ({where})" if high < 0
            else f"{Ground.EQUIVALENT} ({where})" if high < bar else Ground.NOT_SHOWN if paid else None)
    return _Evidence(change=c, contribution=contribution, drop=drop, keep=Ground.NO_EVIDENCE)


def _changes(config: Mapping[str, Value], base: Mapping[str, Value]) -> int:
    return sum(1 for k, x in config.items() if base.get(k) != x)


def _acceptable(v: Verdict, best: Verdict, runs: _Runs, base: Mapping[str, Value],
                evidence: Mapping[tuple[str, Value], _Evidence],
                margin: float, steps: float | None) -> str | None:
    """Why ``v``, an arm that leaves some of ``best``'s changes out, may be promoted in its
    place (None: it may not)."""
    left_out = [(k, x) for k, x in best.config.items() if v.config.get(k) != x]
    if any(v.config.get(k) != base.get(k) for k, _ in left_out):  # not a subset of best's changes
        return None
    if any(c not in evidence or evidence[c].measured_pays for c in left_out):
        return None
    shared = runs.shared(v.arm, best.arm)  # (v's run, best's run)
    lk = _paired_look(shared, margin, steps) if len(shared) >= 2 else None
    if lk is not None and lk.high < lk.threshold:
        return (f"{v.arm} is shown within the practical margin ({margin:.1%}) of the fastest ({best.arm}) in the "
                f"{len(shared)} rounds they shared: {math.exp(lk.mean):.3f}x its objective, upper bound "
                f"{math.exp(lk.high):.3f}")
    if lk is not None and lk.low > 0:
        return None  # shown slower: what it leaves out pays, together
    if not all(evidence[c].drop for c in left_out):
        return None
    grounds = "; ".join(f"{c[0]}: {evidence[c].drop}" for c in left_out)
    seen = f", and {len(shared)} shared rounds do not show it slower" if lk is not None else ""
    return f"{v.arm} leaves out only changes with grounds to drop them ({grounds}){seen}"


def gains(verdicts: tuple[Verdict, ...], cleared: list[Verdict], plan: VerificationPlan, runs: _Runs,
          steps: float | None) -> dict[str, float]:
    """Each cleared arm's gain over the leader, log(leader's objective / the arm's): the mean
    of the pairs they shared, weighed by precision with what the runs before verification
    predict (``Arm.predicted_gain``). A few noisy pairs alone would crown
    whichever arm's runs happened to be quick; the model has seen every search trial of the
    arms' neighbours. The pairs' variance is pooled over the arms (each arm's own spread of
    two or three pairs is itself too noisy to weigh by). With a declared job length the
    objective counts start-up, which the model does not predict: the pairs alone decide."""
    leader = plan.leader
    lead = next((v.speedup for v in verdicts if leader is not None and v.arm == leader.key and v.speedup), None)
    if leader is None or lead is None:
        return {v.arm: math.log(v.speedup) for v in cleared}
    logs = {}
    for v in cleared:
        if v.arm != leader.key:
            pairs = runs.shared(leader.key, v.arm)  # (the leader's run, v's run)
            logs[v.arm] = log_ratios([run_time_s(a, steps) for a, _ in pairs],
                                     [run_time_s(b, steps) for _, b in pairs])
    spread = [x for x in logs.values() if len(x) >= 2]
    dof = sum(len(x) - 1 for x in spread)
    pooled = sum((len(x) - 1) * statistics.variance(x) for x in spread) / dof if dof else 0.0
    arms = {a.key: a for a in plan.arms}
    out = {leader.key: 0.0}
    for arm_key, x in logs.items():
        arm = arms.get(arm_key)
        if not x:  # no round beside the leader: the verdicts alone
            out[arm_key] = math.log(next(v.speedup for v in cleared if v.arm == arm_key) / lead)
            continue
        mean = statistics.fmean(x)
        if pooled > 0 and arm is not None and arm.predicted_gain is not None and steps is None:
            measured, predicted = len(x) / pooled, 1 / arm.predicted_sd ** 2  # precisions
            mean = (mean * measured + arm.predicted_gain * predicted) / (measured + predicted)
        out[arm_key] = mean
    return out


def promotable(verdicts: tuple[Verdict, ...], tainted: set[str]) -> list[Verdict]:
    """The arms that cleared verification, less those carrying a patch that broke the
    contract in any run (``tainted``: never promoted)."""
    return [v for v in verdicts if v.clears and not any(v.config.get(k) is True for k in tainted)]


def _choose(verification: VerificationReport, runs: _Runs, base: Mapping[str, Value],
            evidence: Mapping[tuple[str, Value], _Evidence], cleared: list[Verdict], margin: float,
            steps: float | None) -> tuple[Verdict | None, Verdict | None, str]:
    """(the fastest of the ``cleared`` arms by ``gains``, the promoted one, why); ``cleared``:
    the ``promotable`` arms, the same the grounds of ``_contributions`` count."""
    if not cleared:
        return None, None, "nothing cleared verification: the baseline stands"
    plan = verification.plan or VerificationPlan(arms=(), changes={}, margin=margin)
    gain = gains(verification.verdicts, cleared, plan, runs, steps)
    best = max(cleared, key=lambda v: (gain[v.arm], v.speedup))
    fastest = f"{best.arm}, the fastest arm that cleared"
    quick = max(cleared, key=lambda v: v.speedup)
    if quick is not best:
        fastest += (f" by its pairs and the time model together (the pairs alone put {quick.arm} first, "
                    f"{quick.speedup:.3f}x against {best.speedup:.3f}x; together they put it at "
                    f"{math.exp(gain[quick.arm]):.3f}x the leader's speed, {best.arm} at "
                    f"{math.exp(gain[best.arm]):.3f}x)")
    ok = [(v, why) for v in cleared if v is not best
          for why in [_acceptable(v, best, runs, base, evidence, margin, steps)] if why]
    if not ok:
        return best, best, f"{fastest}: no smaller arm has the evidence to replace it"
    chosen, why = min(ok, key=lambda w: (_changes(w[0].config, base), -w[0].speedup))
    if _changes(chosen.config, base) >= _changes(best.config, base):
        return best, best, f"{fastest}, is as small as any arm that could replace it"
    return best, chosen, why


def _contributions(evidence: list[_Evidence], chosen: Verdict, best: Verdict,
                   cleared: list[Mapping[str, Value]]) -> list[Contribution]:
    """Each change's contribution with the ground it was kept or dropped on (``cleared``:
    the configs of the arms that cleared verification and may be promoted: ``promotable``)."""
    out = []
    for e in evidence:
        kept = chosen.config.get(e.change.knob) == e.change.value
        if kept:
            ground = Ground.NO_ARM if e.drop else e.keep
        elif e.drop or chosen is not best:
            ground = e.drop or Ground.SET_EQUIVALENT
        else:  # the fastest cleared arm leaves it out: was there a cleared arm with it at all?
            with_it = any(c.get(e.change.knob) == e.change.value for c in cleared)
            ground = Ground.FASTEST_WITHOUT if with_it else Ground.NOT_CLEARED
        out.append(replace(e.contribution, kept=kept, ground=ground))
    return out


def _final(verification: VerificationReport, promoted: Verdict | None, why: str) -> VerificationReport:
    verdicts = []
    for v in verification.verdicts:
        if v is promoted:
            v = replace(v, promoted=True, reason=v.reason.split("; a smaller config")[0] + f"; promoted: {why}")
        elif v.promoted:
            v = replace(v, promoted=False, reason=v.reason + f"; superseded by {promoted.arm}: {why}")
        verdicts.append(v)
    return replace(verification, verdicts=tuple(verdicts))


def _single(c: ChangeEvidence, chosen: Verdict) -> Contribution:
    """The one change of a one-change winner: its contribution is the verified speedup."""
    return Contribution(knob=c.knob, baseline_value=c.baseline_value, value=c.value, contribution=chosen.speedup,
                        ci_low=chosen.ci_low, ci_high=chosen.ci_high, step_contribution=chosen.step_speedup,
                        pairs=chosen.pairs, ground=Ground.ONLY_CHANGE,
                        note="one change: its contribution is the verified speedup")


def run_minimize(rt: CampaignRuntime, doctor: DoctorReport, verification: VerificationReport) -> VerificationReport:
    """The verification report with the smallest arm the evidence allows promoted."""
    done = read_minimize(rt.cdir)
    if done is not None:
        return done.final
    margin = rt.spec.budget.practical_margin
    plan = verification.plan or VerificationPlan(arms=(), changes={}, margin=margin)
    steps = job_steps(rt.spec.objective, doctor.step_time_s, doctor.startup_s)
    base, runs, trials = full_baseline(rt, doctor), _Runs(rt, verification), rt.ledger.trials()
    paid, inert = must_pay(rt), inert_knobs(doctor, trials, margin)
    leader = plan.leader.key if plan.arms else None
    measure = rt.spec.budget.minimize_pairs > 0
    # Every finalist's changes, by (knob, value): the leader's first (its leave-one-out arms
    # measured them), then each runner-up's, which only the time model predicts.
    evidence: dict[tuple[str, Value], _Evidence] = {}
    for key in sorted(plan.changes, key=lambda k: k != leader):
        for c in plan.changes[key]:
            evidence.setdefault((c.knob, c.value), _evidence(
                c, plan, runs, c.knob in paid, inert.get(c.knob) == c.value, margin, steps, measure and key == leader))
    cleared = promotable(verification.verdicts, tainted_patches(trials))
    best, chosen, why = _choose(verification, runs, base, evidence, cleared, margin, steps)
    final = _final(verification, chosen, why) if chosen is not None else verification
    family = plan.family(chosen.arm) if chosen is not None and plan.arms else None
    family_changes = plan.changes.get(family, ()) if family else ()
    contributions: list[Contribution] = []
    if len(family_changes) == 1:
        contributions = [_single(family_changes[0], chosen)]
    elif family_changes:
        contributions = _contributions([evidence[(c.knob, c.value)] for c in family_changes], chosen, best,
                                       [v.config for v in cleared])
    dropped = tuple(c.knob for c in contributions if not c.kept)
    note = why if chosen is not None else "nothing was promoted: nothing to minimize"
    if len(family_changes) > 1 and not measure:
        note += "; budget.minimize_pairs = 0: no change was measured by leaving it out"
    num = sum(1 for t in trials if t.role is Role.MINIMIZE and not t.extra.get("retried"))
    winner = dict(best.config) if best is not None else {}
    report = MinimizeReport(winner=winner, contributions=tuple(contributions),
                            promoted=dict(final.promoted.config) if final.promoted else None, dropped=dropped,
                            margin=margin, job_steps=steps, num_trials=num, note=note, final=final)
    write(rt.cdir, rt.cdir.minimize, report)
    return final

