"""run (verification half): re-measure finalists against the baseline, interleaved.

Each round runs the baseline, then every finalist (A B C A B C ...), so each candidate
run is paired with a baseline run taken moments before and slow drifts of a shared
machine cancel in the ratio; one baseline run serves all finalists of its round. The
speedup is the geometric mean of the paired ratios; its interval is a two-sided 90% t
interval on the log ratios, whose lower end is the one-sided 95% lower confidence bound.
A finalist is promoted only if that bound clears 1 + the noise floor (doctor's estimate,
raised to the per-run noise its own pairs show where that is larger) and every one of
its runs keeps the loss trajectory (tests/test_promotion.py measures both error rates).
With a declared job length the ratios are of whole-job times (start-up plus steps x step
time), and the per-step speedup is reported beside them.

Each round runs at its own canary seed (the contract's seed + 1000 + round), and every
candidate run's losses are compared with its paired baseline run's at that seed (a
candidate in another numerics class, e.g. bf16, with a run of the baseline in that class
at that seed, at that class's tolerance: ``infrarsi.loss_calibration.canary_loss_check``). The
search compared losses at the contract's seed, where a job that replays the baseline's
recorded numbers while skipping the work is indistinguishable from an honest one; at a
seed it has not seen, its replayed trajectory no longer matches. A job that ignores the
seed it is given defeats this; ``canary_check`` says so instead of counting it as a check.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass
from typing import Any, Mapping

from scipy import stats

from infrarsi.checks import LossReference, enforce
from infrarsi.knobs import Config
from infrarsi.loss_calibration import canary_loss_check, canary_split_runner
from infrarsi.loss_contract import LossContract
from infrarsi.objective import job_steps, run_time_s
from infrarsi.runtime import CampaignRuntime
from infrarsi.stages.doctor import DoctorReport
from infrarsi.trial import Outcome, Role, TrialResult

CONFIDENCE = 0.90  # two-sided; the lower end is a one-sided 95% bound
# A canary run whose losses sit this close to the reference's did not see its seed.
CANARY_MIN_DEVIATION = 1e-9


@dataclass(frozen=True, kw_only=True)
class Verdict:
    config: Config
    source_trial_id: str
    pairs: tuple[tuple[str, str], ...]  # (baseline trial id, candidate trial id)
    baseline_times_s: tuple[float, ...]
    candidate_times_s: tuple[float, ...]
    speedup: float | None
    ci_low: float | None
    ci_high: float | None
    promoted: bool
    reason: str
    canary_seeds: tuple[int, ...] = ()  # the seed of each pair
    # speedup / ci_* / promoted are on the objective (infrarsi.objective): the step time, or
    # with a declared job length (job_steps), the job's total time; step_* are per step.
    baseline_startups_s: tuple[float, ...] = ()
    candidate_startups_s: tuple[float, ...] = ()
    step_speedup: float | None = None
    step_ci_low: float | None = None
    step_ci_high: float | None = None
    job_steps: float | None = None
    noise_floor: float | None = None  # the floor this verdict was held to
    pair_noise_cv: float | None = None  # per-run noise its own pairs show (pair_noise)


@dataclass(frozen=True, kw_only=True)
class VerificationReport:
    verdicts: tuple[Verdict, ...]
    noise_floor: float  # doctor's estimate, raised to the largest per-run noise the pairs showed
    doctor_noise_cv: float | None = None
    observed_noise_cv: float | None = None  # the largest of the verdicts' pair_noise_cv
    canary_effective: bool | None = None  # None: no baseline run to tell
    canary_note: str = ""

    @property
    def promoted(self) -> Verdict | None:
        winners = [v for v in self.verdicts if v.promoted]
        return max(winners, key=lambda v: v.speedup) if winners else None

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["verdicts"] = [asdict(v) for v in self.verdicts]
        return d

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "VerificationReport":
        return cls(**{**d, "verdicts": tuple(verdict_from_json(v) for v in d["verdicts"])})


def verdict_from_json(d: Mapping[str, Any]) -> Verdict:
    v = dict(d)
    v["pairs"] = tuple(tuple(p) for p in v["pairs"])
    for k in ("baseline_times_s", "candidate_times_s", "canary_seeds", "baseline_startups_s", "candidate_startups_s"):
        v[k] = tuple(v.get(k, ()))
    return Verdict(**v)


def paired_speedup(baseline_s: list[float], candidate_s: list[float]) -> tuple[float, float, float]:
    """Geometric-mean speedup of paired runs and its t confidence interval."""
    logs = [math.log(b / c) for b, c in zip(baseline_s, candidate_s)]
    mean = statistics.fmean(logs)
    if len(logs) < 2 or statistics.stdev(logs) == 0:
        return math.exp(mean), math.exp(mean), math.exp(mean)
    low, high = stats.t.interval(CONFIDENCE, len(logs) - 1, loc=mean, scale=stats.sem(logs))
    return math.exp(mean), math.exp(low), math.exp(high)


def pair_noise(baseline_s: list[float], candidate_s: list[float]) -> float | None:
    """The per-run noise a set of pairs shows: the spread of their log ratios over sqrt(2)
    (each ratio carries the noise of two runs); slow drift, shared within a pair, cancels."""
    if len(baseline_s) < 2:
        return None
    return statistics.stdev(math.log(b / c) for b, c in zip(baseline_s, candidate_s)) / math.sqrt(2)


def decide(baseline_s: list[float], candidate_s: list[float], noise_floor: float) -> tuple[float, float, float, bool]:
    speedup, low, high = paired_speedup(baseline_s, candidate_s)
    return speedup, low, high, low > 1.0 + noise_floor


def _verdict(finalist: TrialResult, rounds: list[tuple[TrialResult, TrialResult]], noise_floor: float,
             contract_seed: int = 0, *, job_steps: float | None = None) -> Verdict:
    problems = [f"{r.trial_id} ({r.role.value}) {r.outcome.value}: {r.reason}"
                for pair in rounds for r in pair if r.outcome is not Outcome.OK]
    ok = [a.outcome is Outcome.OK and b.outcome is Outcome.OK for a, b in rounds]
    good = [pair for pair, keep in zip(rounds, ok) if keep]
    return paired_verdict(finalist.config, finalist.trial_id, good, noise_floor, job_steps=job_steps,
                          seeds=tuple(canary_seed(contract_seed, i) for i, keep in enumerate(ok) if keep),
                          problems=problems)


def paired_verdict(config: Mapping, source_trial_id: str, good: list[tuple[TrialResult, TrialResult]],
                   noise_floor: float, *, job_steps: float | None, seeds: tuple[int, ...],
                   problems: list[str]) -> Verdict:
    """The verdict on ``config`` from its ok (baseline run, candidate run) pairs: promoted
    when the objective's lower bound clears 1 + the floor (``noise_floor``, raised to the
    noise these pairs show where that is larger) and nothing failed."""
    seen = pair_noise([a.step_time_s for a, _ in good], [b.step_time_s for _, b in good])
    noise_floor = max(noise_floor, seen or 0.0)
    common = dict(config=dict(config), source_trial_id=source_trial_id, canary_seeds=seeds,
                  pairs=tuple((a.trial_id, b.trial_id) for a, b in good),
                  baseline_times_s=tuple(a.step_time_s for a, _ in good),
                  candidate_times_s=tuple(b.step_time_s for _, b in good),
                  baseline_startups_s=tuple(a.startup_s or 0.0 for a, _ in good),
                  candidate_startups_s=tuple(b.startup_s or 0.0 for _, b in good),
                  job_steps=job_steps, noise_floor=noise_floor, pair_noise_cv=seen)
    if problems or len(good) < 2:
        return Verdict(**common, speedup=None, ci_low=None, ci_high=None, promoted=False,
                       reason="a verification run failed: " + "; ".join(problems) if problems
                       else f"only {len(good)} ok pair(s): too few to decide")
    step = paired_speedup(list(common["baseline_times_s"]), list(common["candidate_times_s"]))
    speedup, low, high, ok = decide([run_time_s(a, job_steps) for a, _ in good],
                                    [run_time_s(b, job_steps) for _, b in good], noise_floor)
    what = "per step" if job_steps is None else f"end to end over {job_steps:,.0f} steps"
    reason = (f"95% lower bound {low:.3f} ({what}) {'clears' if ok else 'does not clear'} "
              f"1 + noise floor {noise_floor:.3f}")
    if job_steps is not None and step[1] > 1.0 + noise_floor and not ok:
        reason += f"; faster per step ({step[0]:.3f}x) but its start-up is not repaid within the job"
    return Verdict(**common, speedup=speedup, ci_low=low, ci_high=high, promoted=ok, reason=reason,
                   step_speedup=step[0], step_ci_low=step[1], step_ci_high=step[2])


def canary_seed(contract_seed: int, round_index: int) -> int:
    return contract_seed + 1000 + round_index


def _recorded_rounds(rt: CampaignRuntime, candidates: list[TrialResult]) -> list[tuple[TrialResult, dict]]:
    """The rounds a killed campaign already ran, from its ledger: each round's baseline run
    and its candidate runs by finalist index (final attempts only)."""
    index = {tuple(sorted(c.config.items())): i for i, c in enumerate(candidates)}
    baseline = rt.space.validate(rt.spec.baseline)
    rounds: list[tuple[TrialResult, dict]] = []
    for r in rt.ledger.trials():
        if r.extra.get("retried"):
            continue
        if r.role is Role.VERIFY_BASELINE and dict(r.config) == baseline:  # not a class's canary reference
            rounds.append((r, {}))
        elif r.role is Role.VERIFY and rounds and tuple(sorted(r.config.items())) in index:
            rounds[-1][1][index[tuple(sorted(r.config.items()))]] = r
    return rounds


def _rounds(rt: CampaignRuntime, doctor: DoctorReport, candidates: list[TrialResult]) -> list[list[tuple]]:
    """Per finalist, its (baseline run, candidate run) pairs. A finalist that fails a run
    drops out of later rounds: it cannot be promoted, so its runs would be wasted. A
    resumed campaign keeps the runs its ledger holds and runs only the missing ones."""
    contract = rt.spec.contract
    pairs: list[list[tuple]] = [[] for _ in candidates]
    recorded = _recorded_rounds(rt, candidates)
    for round_index in range(rt.spec.budget.verify_pairs):
        alive = [i for i, ps in enumerate(pairs) if all(b.outcome is Outcome.OK for _, b in ps)]
        if not alive:
            break
        seed = canary_seed(contract.seed, round_index)
        if round_index < len(recorded):
            a, done = recorded[round_index]
        else:
            a, done = rt.run_one(doctor.baseline, Role.VERIFY_BASELINE, seed=seed,
                                 check=lambda r: enforce(r, contract, None)), {}
        check = _canary_check(rt, doctor, a, seed, [candidates[i].config for i in alive if i not in done])
        for i in alive:
            b = done.get(i) or rt.run_one(candidates[i].config, Role.VERIFY, check=check, seed=seed)
            pairs[i].append((a, b))
    return pairs


def _canary_check(rt: CampaignRuntime, doctor: DoctorReport, a: TrialResult, seed: int, configs: list[Config]):
    """Each candidate's loss against a run in its own numerics at the canary seed."""
    contract, losses = rt.spec.contract, doctor.loss_reference
    if isinstance(losses, LossContract):
        return canary_loss_check(contract, losses, a, seed, configs, lambda cfg: rt.run_one(
            cfg, Role.VERIFY_BASELINE, seed=seed, check=lambda r: enforce(r, contract, None)),
            canary_split_runner(rt, seed))
    reference = LossReference(losses=a.losses, tolerance=doctor.loss_tolerance,
                              name=f"the baseline at canary seed {seed} ({a.trial_id})")
    return lambda r: enforce(r, contract, reference if a.outcome is Outcome.OK else None)


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


def run_verification(rt: CampaignRuntime, doctor: DoctorReport, candidates: list[TrialResult]) -> VerificationReport:
    if rt.cdir.verification.exists():
        return VerificationReport.from_json(rt.cdir.read_json(rt.cdir.verification))
    rounds = _rounds(rt, doctor, candidates)
    baselines = list({a.trial_id: a for ps in rounds for a, _ in ps}.values())
    steps = job_steps(rt.spec.objective, doctor.step_time_s, doctor.startup_s)
    effective, note = canary_check(doctor, baselines)
    verdicts = tuple(_verdict(f, ps, doctor.noise_cv, rt.spec.contract.seed, job_steps=steps)
                     for f, ps in zip(candidates, rounds))
    observed = max((v.pair_noise_cv for v in verdicts if v.pair_noise_cv is not None), default=None)
    report = VerificationReport(verdicts=verdicts, noise_floor=max(doctor.noise_cv, observed or 0.0),
                                doctor_noise_cv=doctor.noise_cv, observed_noise_cv=observed,
                                canary_effective=effective, canary_note=note)
    rt.cdir.write_json(rt.cdir.verification, report.to_json())
    return report
