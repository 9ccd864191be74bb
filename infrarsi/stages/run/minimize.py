"""run (minimization, after verification): promote the smallest change that pays.

The verified winner usually changes several knobs; some do nothing for the user (a
precision knob a CPU job ignores, a compile whose start-up a short job never repays).
No trial runs here: verification already measured the plan's arms side by side
(``stages.evidence`` plans them, ``stages.verify`` runs them): the finalists, the leader
less the changes the time model expects not to pay (the *smaller* config), and that
config less each change the model could not call (*leave-one-out*). Among the arms that
cleared verification the best is the fastest; promoted is the one with the fewest
changes that the rounds it shared with the best do not show slower than the best by more
than the noise floor (the paired test a candidate passes against the baseline, at its last
look; ties: the faster): a change is promoted over a config without it only where it is
shown to pay. A change the smaller config reverts is dropped only because a config without
it was measured; a change the model expects to pay is kept without a trial.

Each of the leader's changes is reported with its contribution (the objective without it
over with it; > 1: it pays) and where that figure comes from: the time model's
prediction with its 90% interval, or the pairs of its leave-one-out arm.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Any, Mapping

from infrarsi.core.knobs import Value
from infrarsi.core.objective import job_steps, run_time_s
from infrarsi.core.trial import Outcome, Role, TrialResult
from infrarsi.stages.doctor import DoctorReport
from infrarsi.stages.run.evidence import (
    COUPLED,
    IDLE,
    LEAVE_ONE_OUT,
    NEEDED,
    PAYS,
    UNCERTAIN,
    ChangeEvidence,
    VerificationPlan,
    full_baseline,
)
from infrarsi.stages.run.sequential import Decision, Look, SequentialRule, log_ratios, look
from infrarsi.stages.run.verify import Verdict, VerificationReport
from infrarsi.stages.runtime import CampaignRuntime


@dataclass(frozen=True, kw_only=True)
class Contribution:
    """One change of the leader: how much slower it is without it (>1: it pays)."""

    knob: str
    baseline_value: Value
    value: Value
    contribution: float | None  # objective without the change / with it
    ci_low: float | None
    ci_high: float | None
    step_contribution: float | None  # the same on step time alone
    pairs: tuple[tuple[str, str], ...] = ()  # (run with it, run without it), where measured
    inert: bool = False  # doctor's calibration saw it move neither the loss nor the speed
    kept: bool = True
    source: str = "measured"  # "measured" (leave-one-out pairs) or "predicted" (the time model)
    note: str = ""


@dataclass(frozen=True, kw_only=True)
class MinimizeReport:
    winner: Mapping[str, Value]
    promoted: Mapping[str, Value] | None
    contributions: tuple[Contribution, ...]
    dropped: tuple[str, ...]
    noise_floor: float
    job_steps: float | None
    num_trials: int  # runs of the smaller configs (their baselines are verification's)
    note: str
    final: VerificationReport  # what is promoted after minimization

    def to_json(self) -> dict[str, Any]:
        d = {k: v for k, v in asdict(self).items() if k != "final"}
        return {**d, "final": self.final.to_json()}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "MinimizeReport":
        contributions = tuple(Contribution(**{**c, "pairs": tuple(tuple(p) for p in c["pairs"])})
                              for c in d["contributions"])
        return cls(**{**d, "contributions": contributions, "dropped": tuple(d["dropped"]),
                      "final": VerificationReport.from_json(d["final"])})


# A calibration variant's one run is held to doctor's median within this many noise
# widths, and never less than INERT_MIN: at one width a variant that does nothing read as
# moving the speed about a third of the time (the noise is one run's spread, the run is one
# draw of it), and on a machine as quiet as 0.08% a sleep-timed job's no-op variant ran
# 0.23% off the median, a drift five back-to-back runs had not shown.
INERT_WIDTHS = 3.0
INERT_MIN = 0.005


def inert_knobs(rt: CampaignRuntime, doctor: DoctorReport) -> dict[str, Value]:
    """Single-knob calibration variants that moved the loss no more than baseline repeats
    do and the step time no more than the noise (``INERT_WIDTHS`` of it, at least
    ``INERT_MIN``): {knob: value}."""
    repeats = max((abs(r.get("deviation") or 0.0) for r in doctor.calibration
                   if r.get("config") == "baseline repeats"), default=0.0)
    times = {t.trial_id: t.step_time_s for t in rt.ledger.trials() if t.role is Role.CALIBRATE}
    out = {}
    for row in doctor.calibration:
        cfg, t = row.get("config"), times.get(row.get("trial_id"))
        if not isinstance(cfg, dict) or len(cfg) != 1 or row.get("deviation") is None or t is None:
            continue
        moved = abs(t / doctor.step_time_s - 1)
        if abs(row["deviation"]) <= repeats and moved <= max(INERT_WIDTHS * doctor.noise_cv, INERT_MIN):
            out.update(cfg)
    return out


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


def _ratio(pairs: list[tuple[TrialResult, TrialResult]], steps: float | None) -> float | None:
    """Geometric mean of a's objective over b's, pair by pair."""
    if not pairs:
        return None
    logs = log_ratios([run_time_s(a, steps) for a, _ in pairs], [run_time_s(b, steps) for _, b in pairs])
    return math.exp(sum(logs) / len(logs))


def _paired_look(pairs: list[tuple[TrialResult, TrialResult]], floor: float, steps: float | None) -> Look:
    """The sequential test's last look at ``pairs`` (a's run, b's run): does b beat a by
    more than the floor, at the level a candidate clears the baseline at?"""
    logs = log_ratios([run_time_s(a, steps) for a, _ in pairs], [run_time_s(b, steps) for _, b in pairs])
    return look(SequentialRule(max_pairs=max(len(logs), 2)), logs, floor)


def _shown_slower(pairs: list[tuple[TrialResult, TrialResult]], floor: float, steps: float | None) -> bool:
    """Whether a's runs are shown slower than b's by more than the floor: by the paired test
    from two pairs on (the same a candidate must pass against the baseline), by the ratio
    of a single pair."""
    if len(pairs) < 2:
        return _ratio(pairs, steps) > 1.0 + floor
    return _paired_look(pairs, floor, steps).decision is Decision.CLEARS


def _choose(verification: VerificationReport, runs: _Runs, base: Mapping[str, Value], floor: float,
            steps: float | None) -> tuple[Verdict | None, Verdict | None, str]:
    """(the best cleared arm, the promoted one, why)."""
    cleared = [v for v in verification.verdicts if v.clears]
    if not cleared:
        return None, None, "nothing cleared verification: the baseline stands"
    best = max(cleared, key=lambda v: v.speedup)
    within = []
    for v in cleared:
        shared = runs.shared(v.arm, best.arm)
        if v is best or (shared and not _shown_slower(shared, floor, steps)):
            ratio = 1.0 if v is best else _ratio(shared, steps)
            within.append((sum(1 for k, x in v.config.items() if base.get(k) != x), -v.speedup, v, ratio))
    *_, chosen, ratio = min(within, key=lambda w: w[:2])
    if chosen is best:
        return best, chosen, f"{best.arm}, the fastest arm that cleared, is the smallest within noise of itself"
    return best, chosen, (f"{chosen.arm} is the smallest arm within noise of the fastest ({best.arm}): "
                          f"its objective is {ratio:.3f}x the fastest's in the rounds they shared, not "
                          f"shown slower by more than the floor {floor:.3f}")


def _contribution(c: ChangeEvidence, plan: VerificationPlan | None, runs: _Runs, promoted: Mapping[str, Value] | None,
                  inert: Mapping[str, Value], steps: float | None, floor: float) -> Contribution:
    kept = promoted is None or promoted.get(c.knob) == c.value
    common = dict(knob=c.knob, baseline_value=c.baseline_value, value=c.value, inert=inert.get(c.knob) == c.value,
                  kept=kept)
    predicted = dict(contribution=c.predicted, ci_low=c.predicted_low, ci_high=c.predicted_high,
                     step_contribution=c.predicted, source="predicted")
    arm = next((a for a in plan.arms if a.kind == LEAVE_ONE_OUT and a.reverts[-1] == c.knob), None) if plan else None
    if c.call != UNCERTAIN or arm is None:
        note = {PAYS: "predicted to pay: kept without a trial", NEEDED: f"needed: {c.reason}",
                COUPLED: c.reason, IDLE: "predicted not to pay",
                UNCERTAIN: "the model could not call it"}[c.call]
        if c.call in (IDLE, UNCERTAIN):
            note += ("; dropped: a config without it cleared within noise of the fastest" if not kept
                     else "; kept: no config without it cleared within noise of the fastest" if plan
                     else "; kept: measured configs without it are the leader's, not this finalist's")
        return Contribution(**common, **predicted, note=note)
    pairs = runs.shared(arm.key, arm.parent)  # (without it, with it)
    failed = runs.failed_without(arm.parent, arm.key)
    ids = tuple((w.trial_id, o.trial_id) for o, w in pairs)
    if len(pairs) < 2:
        why = (f"without it {failed.trial_id} ended {failed.outcome.value} ({failed.reason[:120]})" if failed
               else "too few pairs to measure it")
        return Contribution(**common, contribution=None, ci_low=None, ci_high=None, step_contribution=None,
                            pairs=ids, note=why)
    job, step = _paired_look(pairs, floor, steps), _paired_look(pairs, floor, None)
    pays = job.decision is Decision.CLEARS
    note = ("pays" if pays else f"kept: {failed.trial_id} without it ended {failed.outcome.value}" if failed
            else f"costs more than it saves: without it {math.exp(-job.mean):.3f}x faster" if job.high < -job.threshold
            else f"not shown to pay beyond the noise floor {job.floor:.3f}")
    if not pays and kept and not failed:
        note += "; kept: the config without it was not the one promoted"
    return Contribution(**common, contribution=math.exp(job.mean), ci_low=math.exp(job.low),
                        ci_high=math.exp(job.high), step_contribution=math.exp(step.mean), pairs=ids, note=note)


def _final(verification: VerificationReport, promoted: Verdict | None, why: str) -> VerificationReport:
    verdicts = []
    for v in verification.verdicts:
        if v is promoted:
            v = replace(v, promoted=True, reason=v.reason.split("; a smaller config")[0] + f"; promoted: {why}")
        elif v.promoted:
            v = replace(v, promoted=False, reason=v.reason + f"; superseded by {promoted.arm}: {why}")
        verdicts.append(v)
    return replace(verification, verdicts=tuple(verdicts))


def run_minimize(rt: CampaignRuntime, doctor: DoctorReport, verification: VerificationReport) -> VerificationReport:
    """The verification report with the smallest arm within noise of the best promoted."""
    path = rt.cdir.minimize
    if path.exists():
        return MinimizeReport.from_json(rt.cdir.read_json(path)).final
    plan = VerificationPlan.from_json(verification.plan) if verification.plan else VerificationPlan(
        arms=(), changes={}, noise_floor=doctor.noise_cv)
    floor, steps = verification.noise_floor, job_steps(rt.spec.objective, doctor.step_time_s, doctor.startup_s)
    base, runs = full_baseline(rt, doctor), _Runs(rt, verification)
    best, chosen, why = _choose(verification, runs, base, floor, steps)
    final = _final(verification, chosen, why) if chosen is not None else verification
    family = plan.family(chosen.arm) if chosen is not None and plan.arms else None
    changes = plan.changes.get(family, ()) if family else ()
    contributions: list[Contribution] = []
    if len(changes) == 1:
        c = changes[0]
        contributions = [Contribution(knob=c.knob, baseline_value=c.baseline_value, value=c.value,
                                      contribution=chosen.speedup, ci_low=chosen.ci_low, ci_high=chosen.ci_high,
                                      step_contribution=chosen.step_speedup, pairs=chosen.pairs,
                                      note="one change: its contribution is the verified speedup")]
    elif changes:
        inert = inert_knobs(rt, doctor)
        measured = family == plan.leader.key and rt.spec.budget.minimize_pairs > 0
        contributions = [_contribution(c, plan if measured else None, runs, chosen.config, inert, steps, floor)
                         for c in changes]
    dropped = tuple(c.knob for c in contributions if not c.kept)
    note = why if chosen is not None else "nothing was promoted: nothing to minimize"
    if len(changes) > 1 and rt.spec.budget.minimize_pairs == 0:
        note += "; budget.minimize_pairs = 0: the winner is promoted as verified"
    num = sum(1 for t in rt.ledger.trials() if t.role is Role.MINIMIZE and not t.extra.get("retried"))
    winner = next((dict(a.config) for a in plan.arms if a.key == family), {})
    report = MinimizeReport(winner=winner, contributions=tuple(contributions),
                            promoted=dict(final.promoted.config) if final.promoted else None, dropped=dropped,
                            noise_floor=floor, job_steps=steps, num_trials=num, note=note, final=final)
    rt.cdir.write_json(path, report.to_json())
    return final
