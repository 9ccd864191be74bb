"""doctor: measure the baseline before anything is compared with it.

Runs the baseline config several times (noise between runs, the reference loss
trajectory, peak memory, the phase profile), then the spec's legitimate variants
(precision, micro-batch split, process count) to calibrate how far an honest change
moves the loss. A baseline that fails here stops the campaign: nothing can be measured
against it.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping

from infrarsi.checks import LossReference, enforce
from infrarsi.errors import ContractError
from infrarsi.knobs import Config
from infrarsi.metrics_events import explain_baseline_failure
from infrarsi.runtime import CampaignRuntime
from infrarsi.trial import Outcome, Role, TrialResult

# An honest variant's worst loss deviation, times this, is the tolerance: candidates are
# run once, so the bound must sit clearly above what legitimate changes do.
TOLERANCE_MARGIN = 2.0


@dataclass(frozen=True, kw_only=True)
class DoctorReport:
    baseline: Config
    trial_ids: tuple[str, ...]
    step_time_s: float  # median over runs of each run's median step time
    run_step_times_s: tuple[float, ...]
    noise_cv: float  # coefficient of variation of run medians: the between-run noise floor
    within_run_cv: float
    reference_losses: tuple[float, ...]
    loss_tolerance: float
    loss_tolerance_source: str
    calibration: tuple[Mapping[str, Any], ...]
    peak_memory_bytes: int
    phases_s: Mapping[str, float]
    tokens_per_step: int | None
    extra: Mapping[str, Any] = field(default_factory=dict)

    @property
    def loss_reference(self) -> LossReference:
        return LossReference(losses=self.reference_losses, tolerance=self.loss_tolerance)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "DoctorReport":
        kw = dict(d)
        for k in ("trial_ids", "run_step_times_s", "reference_losses", "calibration"):
            kw[k] = tuple(kw[k])
        return cls(**kw)


def _cv(values: list[float]) -> float:
    mean = statistics.mean(values)
    return statistics.stdev(values) / mean if len(values) > 1 and mean > 0 else 0.0


def _recorded(rt: CampaignRuntime, role: Role) -> list[TrialResult]:
    """Final attempts of ``role`` a killed campaign already recorded: a resumed doctor keeps them."""
    return [r for r in rt.ledger.trials() if r.role is role and not r.extra.get("retried")]


def _baseline_runs(rt: CampaignRuntime) -> list[TrialResult]:
    spec = rt.spec
    baseline = rt.space.validate(spec.baseline)
    runs = [r for r in _recorded(rt, Role.DOCTOR) if r.outcome is Outcome.OK][:spec.budget.doctor_repeats]
    for _ in range(spec.budget.doctor_repeats - len(runs)):
        r = rt.run_one(baseline, Role.DOCTOR, check=lambda t: enforce(t, spec.contract, None))
        if r.outcome is not Outcome.OK:
            raise ContractError(explain_baseline_failure(r))
        runs.append(r)
    return runs


def _calibrate(rt: CampaignRuntime, reference: tuple[float, ...], runs: list[TrialResult]) -> tuple[float, str, list]:
    spec = rt.spec
    ref = LossReference(losses=reference, tolerance=float("inf"))
    spread = max(abs(ref.deviation(r.losses)[0]) for r in runs)
    rows: list[dict[str, Any]] = [{"config": "baseline repeats", "deviation": spread}]
    recorded = {tuple(sorted(r.config.items())): r for r in _recorded(rt, Role.CALIBRATE)}
    for variant in spec.calibration:
        cfg = {**spec.baseline, **variant}
        r = recorded.get(tuple(sorted(rt.space.validate(cfg).items()))) or rt.run_one(
            cfg, Role.CALIBRATE, check=lambda t: enforce(t, spec.contract, None))
        dev = ref.deviation(r.losses)[0] if r.outcome is Outcome.OK else None
        rows.append({"config": variant, "outcome": r.outcome.value, "deviation": dev, "trial_id": r.trial_id})
    if spec.contract.loss_tolerance is not None:
        return spec.contract.loss_tolerance, "spec", rows
    worst = max(abs(row["deviation"]) for row in rows if row["deviation"] is not None)
    tol = max(spec.contract.min_loss_tolerance, TOLERANCE_MARGIN * worst)
    return tol, f"calibrated: {TOLERANCE_MARGIN:g} x the largest honest deviation ({worst:.2e})", rows


def run_doctor(rt: CampaignRuntime) -> DoctorReport:
    if rt.cdir.doctor.exists():  # resumed campaign: doctor already done
        return DoctorReport.from_json(rt.cdir.read_json(rt.cdir.doctor))
    runs = _baseline_runs(rt)
    # A run still contaminated after its re-measurements says nothing about this machine's
    # own noise: leave it out while two clean runs remain.
    clean = [r for r in runs if not r.extra.get("contaminated")]
    medians = [r.step_time_s for r in (clean if len(clean) >= 2 else runs)]
    reference = runs[0].losses
    tol, source, rows = _calibrate(rt, reference, runs)
    within = statistics.median(_cv(list(r.step_times_s)) for r in runs)
    phase_keys = sorted({k for r in runs for k in r.phases_s})
    report = DoctorReport(
        baseline=dict(runs[0].config), trial_ids=tuple(r.trial_id for r in runs),
        step_time_s=statistics.median(medians), run_step_times_s=tuple(medians), noise_cv=_cv(medians),
        within_run_cv=within, reference_losses=tuple(reference), loss_tolerance=tol, loss_tolerance_source=source,
        calibration=tuple(rows), peak_memory_bytes=max(r.peak_memory_bytes or 0 for r in runs),
        phases_s={k: statistics.median(r.phases_s.get(k, 0.0) for r in runs) for k in phase_keys},
        tokens_per_step=runs[0].tokens_per_step)
    rt.cdir.write_json(rt.cdir.doctor, report.to_json())
    return report


def adopt_doctor(rt: CampaignRuntime, report: DoctorReport) -> None:
    """Make ``report`` this campaign's doctor report. When it came from the cache (another
    campaign measured the same locked workload on this machine), say so in the ledger."""
    if rt.cdir.doctor.exists():
        return
    rt.cdir.write_json(rt.cdir.doctor, report.to_json())
    rt.ledger.append("doctor_reused", {"trial_ids": list(report.trial_ids), "step_time_s": report.step_time_s})


def baseline_observation(report: DoctorReport, capacity_bytes: int) -> TrialResult:
    """The baseline as one trial result, for proposers of a campaign whose doctor was cached."""
    return TrialResult(trial_id="doctor", config=dict(report.baseline), role=Role.DOCTOR, outcome=Outcome.OK,
                       step_time_s=report.step_time_s, losses=report.reference_losses,
                       peak_memory_bytes=report.peak_memory_bytes, memory_capacity_bytes=capacity_bytes,
                       tokens_per_step=report.tokens_per_step)


def cached_doctor_trials(report: DoctorReport, capacity_bytes: int) -> list[TrialResult]:
    """Doctor's baseline runs as trial results, for a campaign whose doctor came from the
    cache (for MLflow: the runs were measured by the campaign that filled the cache)."""
    return [TrialResult(trial_id=f"doctor-{i}", config=dict(report.baseline), role=Role.DOCTOR, outcome=Outcome.OK,
                        step_time_s=step_time_s, losses=report.reference_losses,
                        peak_memory_bytes=report.peak_memory_bytes, memory_capacity_bytes=capacity_bytes,
                        tokens_per_step=report.tokens_per_step, extra={"cached_from": source})
            for i, (source, step_time_s) in enumerate(zip(report.trial_ids, report.run_step_times_s), 1)]
