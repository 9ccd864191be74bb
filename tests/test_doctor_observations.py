"""A cached doctor report still tells the proposer what its runs measured."""

from infrarsi.stages.doctor import DoctorReport, doctor_observations
from infrarsi.trial import Outcome, Role

BASELINE = {"micro_batch": 2, "attention": "naive"}


def _report(calibration):
    return DoctorReport(baseline=BASELINE, trial_ids=("d1", "d2", "d3"), step_time_s=1.0, run_step_times_s=(1.0,) * 3,
                        noise_cv=0.01, within_run_cv=0.01, reference_losses=(5.0, 4.9), loss_tolerance=0.01,
                        loss_tolerance_source="spec", calibration=calibration, peak_memory_bytes=400 << 20,
                        phases_s={}, tokens_per_step=1024)


def test_calibration_variants_become_full_config_observations():
    rows = ({"config": "baseline repeats", "deviation": 0.0},
            {"config": {"micro_batch": 4}, "outcome": "ok", "deviation": 0.001, "trial_id": "c1",
             "step_time_s": 0.8, "peak_memory_bytes": 450 << 20},
            {"config": {"attention": "sdpa"}, "outcome": "oom", "deviation": None, "trial_id": "c2",
             "step_time_s": None, "peak_memory_bytes": 600 << 20})
    # Round-trip through JSON, as the cache stores it.
    obs = doctor_observations(DoctorReport.from_json(_report(rows).to_json()), 600 << 20)
    assert [(o.role, o.outcome) for o in obs] == [(Role.DOCTOR, Outcome.OK), (Role.CALIBRATE, Outcome.OK),
                                                  (Role.CALIBRATE, Outcome.OOM)]
    assert obs[1].config == {"micro_batch": 4, "attention": "naive"} and obs[1].step_time_s == 0.8
    assert obs[2].config == {"micro_batch": 2, "attention": "sdpa"} and obs[2].memory_capacity_bytes == 600 << 20


def test_a_report_cached_before_variants_kept_their_measurements_gives_the_baseline_only():
    rows = ({"config": "baseline repeats", "deviation": 0.0},
            {"config": {"micro_batch": 4}, "outcome": "ok", "deviation": 0.001, "trial_id": "c1"})
    obs = doctor_observations(_report(rows), 600 << 20)
    assert [o.role for o in obs] == [Role.DOCTOR] and obs[0].step_time_s == 1.0
