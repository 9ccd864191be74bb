"""The report's first screen says whether the change is safe (one line on the loss contract:
runs checked, their tolerance, configs rejected, the canary, what the printed digits hide)
and what the campaign cost against what the change saves."""

from infrarsi.contract.loss_contract import ClassReference, LossContract
from infrarsi.core.trial import Outcome, Role, TrialResult
from infrarsi.record.doctor import DoctorReport
from infrarsi.record.verification import Verdict
from infrarsi.stages.report.headline import headline, safety
from infrarsi.stages.report.summary import cost_by_outcome, payback

LOSSES = (5.158, 5.101, 5.047, 4.998)


def _trial(i, outcome, config):
    return TrialResult(trial_id=f"t{i}", config=config, role=Role.SEARCH, outcome=outcome,
                       step_time_s=0.1 if outcome is Outcome.OK else None, losses=LOSSES)


def _doctor(quantum):
    contract = LossContract(signal="step", window=4, baseline={"bf16": False}, changing_knobs=("bf16",),
                            loss_quantum=quantum, classes=(
                                ClassReference(settings=(), losses=LOSSES, tolerance=3e-6),
                                ClassReference(settings=(("bf16", True),), losses=LOSSES, tolerance=0.004)))
    return DoctorReport(baseline={"bf16": False}, trial_ids=("t0",), step_time_s=0.2, run_step_times_s=(0.2,),
                        noise_cv=0.01, within_run_cv=0.01, reference_losses=LOSSES, loss_tolerance=3e-6,
                        loss_tolerance_source="calibrated", calibration=(), peak_memory_bytes=1, phases_s={},
                        tokens_per_step=64, loss_contract=contract)


def test_the_safety_line_counts_the_checked_runs_the_rejected_configs_and_the_printed_precision():
    trials = [_trial(1, Outcome.OK, {"bf16": False}), _trial(2, Outcome.CONTRACT_VIOLATION, {"bf16": True}),
              _trial(3, Outcome.CONTRACT_VIOLATION, {"bf16": True}), _trial(4, Outcome.OOM, {"bf16": False})]
    line = safety({"canary_effective": True}, trials, _doctor(quantum=0.001))
    assert line.startswith("loss contract: 3 runs checked on the step signal, tolerance 0.0003% in the baseline's "
                           "numerics (1 other numerics class against their own reference); 1 config rejected; "
                           "canary seeds: the job honours them; the job prints its loss to 4 significant digits")
    assert safety({}, trials, _doctor(quantum=0.0)).endswith("1 config rejected")  # whole losses: nothing hidden
    assert safety({}, trials, None) is None
    summary = {"verified_speedup": None, "baseline_step_time_s": 0.2, "best_step_time_s": 0.1, "num_trials": 4,
               "trials_by_outcome": {"ok": 1, "contract_violation": 2, "oom": 1}}
    facts = headline(summary, trials=trials, promoted=None, baseline={}, repository=None, warning_lines=[],
                     num_verified=0, safety_line=line)["facts"]
    assert line in facts


def test_the_campaign_pays_back_after_its_device_seconds_over_the_saving_per_step():
    # doctor's runs hold 2 devices (device seconds over wall seconds); the baseline steps in 0.2 s
    runs = [TrialResult(trial_id=f"d{i}", config={}, role=Role.DOCTOR, outcome=Outcome.OK, step_time_s=0.2,
                        wall_time_s=10.0, device_seconds=20.0) for i in range(3)]
    failed = TrialResult(trial_id="s1", config={}, role=Role.SEARCH, outcome=Outcome.OOM, wall_time_s=5.0,
                         device_seconds=10.0)
    trials = [*runs, failed]
    promoted = Verdict(config={}, source_trial_id="s2", pairs=(("d0", "v1"),), baseline_times_s=(0.2,),
                       candidate_times_s=(0.1, 0.1, 0.12), speedup=2.0, ci_low=1.8, ci_high=2.2, promoted=True,
                       reason="")
    out = payback(cost_by_outcome(trials), trials, _doctor(0.0), promoted, job_steps=1000)
    # 70 device seconds (the OOM's included) over (0.2 - 0.1) s x 2 devices saved a step
    assert out == {"campaign_device_s": 70.0, "payback_steps": 350, "payback_fraction": 0.35}
    assert payback(cost_by_outcome(trials), trials, _doctor(0.0), None, 1000)["payback_steps"] is None
    summary = {"verified_speedup": 2.0, "speedup_ci": [1.8, 2.2], "end_to_end_speedup": None,
               "baseline_step_time_s": 0.2, "num_trials": 4, "trials_by_outcome": {"ok": 3, "oom": 1},
               "job_steps": 1000, **out}
    facts = headline(summary, trials=trials, promoted=promoted, baseline={}, repository=None, warning_lines=[],
                     num_verified=1)["facts"]
    assert "cost: 70 device-seconds, repaid after 350 steps of the job at the promoted config (35.0% of its 1,000)" \
        in facts
