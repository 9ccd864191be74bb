"""doctor: measure the baseline before anything is compared with it.

Runs the baseline config several times (the noise of a run's step time, more runs while
that estimate is weak; the reference loss trajectory, peak memory, the phase profile), then the spec's legitimate variants
(precision, micro-batch split, process count) to calibrate how far an honest change
moves the loss. A baseline that fails here stops the campaign: nothing can be measured
against it.
"""

from __future__ import annotations

import statistics

from infrarsi.contract import reproduce
from infrarsi.contract.checks import enforce
from infrarsi.contract.loss_contract import LossContract
from infrarsi.contract.noise import NoiseEstimate, estimate_noise
from infrarsi.core.errors import ContractError
from infrarsi.core.trial import Outcome, Role, TrialResult
from infrarsi.harness.command import render_command
from infrarsi.harness.metrics_events import explain_baseline_failure
from infrarsi.record.campaign import read_doctor, write
from infrarsi.record.doctor import DoctorReport
from infrarsi.stages.calibration import TOLERANCE_MARGIN, calibrate_loss
from infrarsi.stages.runtime import CampaignRuntime


def _recorded(rt: CampaignRuntime, role: Role) -> list[TrialResult]:
    """Final attempts of ``role`` a killed campaign already recorded: a resumed doctor keeps them."""
    return [r for r in rt.ledger.trials() if r.role is role and not r.extra.get("retried")]


def _baseline_run(rt: CampaignRuntime, *, first: bool = False) -> TrialResult:
    spec = rt.spec
    r = rt.run_one(rt.space.validate(spec.baseline), Role.DOCTOR, check=lambda t: enforce(t, spec.contract, None))
    if first:  # a run that does not reproduce the typed command says so first: that is the cause
        _check_reproduces(rt, r)
    if r.outcome is not Outcome.OK:
        raise ContractError(explain_baseline_failure(r))
    return r


def _check_reproduces(rt: CampaignRuntime, run: TrialResult) -> None:
    """Stop before any search where the first baseline run does not print what the user's
    own command printed (``infrarsi.contract.reproduce``)."""
    problems = reproduce.differences(rt.spec, run)
    if problems:
        argv, _ = render_command(rt.spec, rt.space, rt.space.validate(rt.spec.baseline))
        raise ContractError(reproduce.explain(rt.spec, argv, problems))


def _clean(runs: list[TrialResult]) -> list[TrialResult]:
    """The runs that measure the machine as the campaign's trials will find it. The first
    run is cold (file cache, allocator, compile caches: a default campaign's first run once
    took 1071 ms a step against ~875 ms after) and goes while two others remain; so does a
    run still contaminated after its re-measurements, which says nothing about this
    machine's own noise."""
    warm = runs[1:] if len(runs) > 2 else runs
    clean = [r for r in warm if not r.extra.get("contaminated")]
    return clean if len(clean) >= 2 else warm


def _baseline_runs(rt: CampaignRuntime) -> tuple[list[TrialResult], NoiseEstimate]:
    """The spec's repeats, then more (up to ``budget.doctor_max_repeats``) while the noise
    estimate rests on too few clean runs to be trusted; runs a killed campaign recorded count."""
    budget = rt.spec.budget
    most = max(budget.doctor_max_repeats, budget.doctor_repeats)
    runs = [r for r in _recorded(rt, Role.DOCTOR) if r.outcome is Outcome.OK][:most]
    while len(runs) < budget.doctor_repeats:
        runs.append(_baseline_run(rt, first=not runs))
    while True:
        used = _clean(runs)
        noise = estimate_noise([r.step_time_s for r in used], [r.step_times_s for r in used])
        if not noise.weak or len(runs) >= most:
            return runs, noise
        runs.append(_baseline_run(rt))


def _calibrate(rt: CampaignRuntime, runs: list[TrialResult]) -> tuple[float, str, list, LossContract]:
    # A resumed doctor keeps the calibration runs a killed campaign recorded.
    recorded = {tuple(sorted(r.config.items())): r for r in _recorded(rt, Role.CALIBRATE)
                if r.extra.get("job_seed") is None}  # not an honest split run at a canary seed
    loss_contract, rows = calibrate_loss(rt, runs, recorded)
    if rt.spec.contract.loss_tolerance is not None:
        return rt.spec.contract.loss_tolerance, "spec", rows, loss_contract
    warnings = "".join(f"; warning: {w}" for w in loss_contract.warnings)
    resolution = loss_contract.resolution()
    if resolution:
        rt.cdir.add_warning("doctor", resolution)
    source = (f"calibrated: {TOLERANCE_MARGIN:g} x the largest honest {loss_contract.signal} deviation in the "
              f"baseline's numerics, at least {rt.spec.contract.min_loss_tolerance:g}; numerics-changing configs "
              f"are held to their own class's reference (loss_contract)"
              f"{f'; {resolution}, and one unit of its last digit is no deviation' if resolution else ''}{warnings}")
    return loss_contract.tolerance, source, rows, loss_contract


def run_doctor(rt: CampaignRuntime) -> DoctorReport:
    done = read_doctor(rt.cdir)  # resumed campaign: doctor already done
    if done is not None:
        return done
    runs, noise = _baseline_runs(rt)
    used = _clean(runs)
    medians = [r.step_time_s for r in used]
    reference = runs[0].losses
    tol, source, rows, loss_contract = _calibrate(rt, runs)
    phase_keys = sorted({k for r in runs for k in r.phases_s})
    report = DoctorReport(
        baseline=dict(runs[0].config), trial_ids=tuple(r.trial_id for r in runs),
        step_time_s=statistics.median(medians), run_step_times_s=tuple(medians), noise_cv=noise.noise_cv,
        within_run_cv=noise.within_run_cv, noise=noise, startup_s=statistics.median(
            r.startup_s or 0.0 for r in used), reference_losses=tuple(reference), loss_tolerance=tol,
        loss_tolerance_source=source,
        calibration=tuple(rows), peak_memory_bytes=max(r.peak_memory_bytes or 0 for r in runs),
        phases_s={k: statistics.median(r.phases_s.get(k, 0.0) for r in runs) for k in phase_keys},
        tokens_per_step=runs[0].tokens_per_step, loss_contract=loss_contract)
    write(rt.cdir, rt.cdir.doctor, report)
    return report


def adopt_doctor(rt: CampaignRuntime, report: DoctorReport) -> None:
    """Make ``report`` this campaign's doctor report. When it came from the cache (another
    campaign measured the same locked workload on this machine), say so in the ledger."""
    if rt.cdir.doctor.exists():
        return
    write(rt.cdir, rt.cdir.doctor, report)
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
