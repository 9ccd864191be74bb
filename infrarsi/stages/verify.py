"""run (verification half): re-measure finalists against the baseline, interleaved.

Each round runs the baseline, then every finalist (A B C A B C ...), so each candidate
run is paired with a baseline run taken moments before and slow drifts of a shared
machine cancel in the ratio; one baseline run serves all finalists of its round. The
speedup is the geometric mean of the paired ratios; its interval is a two-sided 90% t
interval on the log ratios, whose lower end is the one-sided 95% lower confidence bound.
A finalist is promoted only if that bound clears 1 + doctor's noise floor and every one
of its runs keeps the loss trajectory (tests/test_promotion.py measures both error rates).

Each round runs at its own canary seed (the contract's seed + 1000 + round), and every
candidate run's losses are compared with its paired baseline run's at that seed (a
candidate in another numerics class, e.g. bf16, with a run of the baseline in that class
at that seed, at that class's tolerance: ``infrarsi.loss_calibration.canary_check``). The
search compared losses at the contract's seed, where a job that replays the baseline's
recorded numbers while skipping the work is indistinguishable from an honest one; at a
seed it has not seen, its replayed trajectory no longer matches.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass
from typing import Any, Mapping

from scipy import stats

from infrarsi.checks import LossReference, enforce
from infrarsi.knobs import Config
from infrarsi.loss_calibration import canary_check
from infrarsi.loss_contract import LossContract
from infrarsi.runtime import CampaignRuntime
from infrarsi.stages.doctor import DoctorReport
from infrarsi.trial import Outcome, Role, TrialResult

CONFIDENCE = 0.90  # two-sided; the lower end is a one-sided 95% bound


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


@dataclass(frozen=True, kw_only=True)
class VerificationReport:
    verdicts: tuple[Verdict, ...]
    noise_floor: float

    @property
    def promoted(self) -> Verdict | None:
        winners = [v for v in self.verdicts if v.promoted]
        return max(winners, key=lambda v: v.speedup) if winners else None

    def to_json(self) -> dict[str, Any]:
        return {"verdicts": [asdict(v) for v in self.verdicts], "noise_floor": self.noise_floor}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "VerificationReport":
        verdicts = []
        for v in d["verdicts"]:
            v = dict(v)
            v["pairs"] = tuple(tuple(p) for p in v["pairs"])
            v["baseline_times_s"], v["candidate_times_s"] = tuple(v["baseline_times_s"]), tuple(v["candidate_times_s"])
            v["canary_seeds"] = tuple(v.get("canary_seeds", ()))
            verdicts.append(Verdict(**v))
        return cls(verdicts=tuple(verdicts), noise_floor=d["noise_floor"])


def paired_speedup(baseline_s: list[float], candidate_s: list[float]) -> tuple[float, float, float]:
    """Geometric-mean speedup of paired runs and its t confidence interval."""
    logs = [math.log(b / c) for b, c in zip(baseline_s, candidate_s)]
    mean = statistics.fmean(logs)
    if len(logs) < 2 or statistics.stdev(logs) == 0:
        return math.exp(mean), math.exp(mean), math.exp(mean)
    low, high = stats.t.interval(CONFIDENCE, len(logs) - 1, loc=mean, scale=stats.sem(logs))
    return math.exp(mean), math.exp(low), math.exp(high)


def decide(baseline_s: list[float], candidate_s: list[float], noise_floor: float) -> tuple[float, float, float, bool]:
    speedup, low, high = paired_speedup(baseline_s, candidate_s)
    return speedup, low, high, low > 1.0 + noise_floor


def _verdict(finalist: TrialResult, rounds: list[tuple[TrialResult, TrialResult]], noise_floor: float,
             contract_seed: int = 0) -> Verdict:
    problems = [f"{r.trial_id} ({r.role.value}) {r.outcome.value}: {r.reason}"
                for pair in rounds for r in pair if r.outcome is not Outcome.OK]
    ok = [a.outcome is Outcome.OK and b.outcome is Outcome.OK for a, b in rounds]
    good = [pair for pair, keep in zip(rounds, ok) if keep]
    common = dict(config=dict(finalist.config), source_trial_id=finalist.trial_id,
                  canary_seeds=tuple(canary_seed(contract_seed, i) for i, keep in enumerate(ok) if keep),
                  pairs=tuple((a.trial_id, b.trial_id) for a, b in good),
                  baseline_times_s=tuple(a.step_time_s for a, _ in good),
                  candidate_times_s=tuple(b.step_time_s for _, b in good))
    if problems or len(good) < 2:
        return Verdict(**common, speedup=None, ci_low=None, ci_high=None, promoted=False,
                       reason="a verification run failed: " + "; ".join(problems))
    speedup, low, high, ok = decide(list(common["baseline_times_s"]), list(common["candidate_times_s"]), noise_floor)
    reason = (f"95% lower bound {low:.3f} {'clears' if ok else 'does not clear'} "
              f"1 + noise floor {noise_floor:.3f}")
    return Verdict(**common, speedup=speedup, ci_low=low, ci_high=high, promoted=ok, reason=reason)


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
        return canary_check(rt, losses, a, seed, configs)
    reference = LossReference(losses=a.losses, tolerance=doctor.loss_tolerance,
                              name=f"the baseline at canary seed {seed} ({a.trial_id})")
    return lambda r: enforce(r, contract, reference if a.outcome is Outcome.OK else None)


def run_verification(rt: CampaignRuntime, doctor: DoctorReport, candidates: list[TrialResult]) -> VerificationReport:
    if rt.cdir.verification.exists():
        return VerificationReport.from_json(rt.cdir.read_json(rt.cdir.verification))
    noise_floor = doctor.noise_cv
    rounds = _rounds(rt, doctor, candidates)
    report = VerificationReport(verdicts=tuple(_verdict(f, ps, noise_floor, rt.spec.contract.seed)
                                                for f, ps in zip(candidates, rounds)),
                                noise_floor=noise_floor)
    rt.cdir.write_json(rt.cdir.verification, report.to_json())
    return report
