"""The plan verification runs, from the trials already in hand: which changes of the
leader the time model can call, which it cannot, and the arms that follow. Hand-made
trial results on the fake workload's space (tests/fake_workload.py); nothing runs."""


import pytest
from test_minimize import _spec

from infrarsi.core.trial import Outcome, Role, TrialResult
from infrarsi.stages.doctor import DoctorReport
from infrarsi.stages.init import init_campaign
from infrarsi.stages.run.evidence import (
    FINALIST,
    IDLE,
    LEAVE_ONE_OUT,
    NEEDED,
    PAYS,
    SMALLER,
    UNCERTAIN,
    ChangeEvidence,
    VerificationPlan,
    leave_one_out_order,
    plan_verification,
)
from infrarsi.stages.runtime import CampaignRuntime, RuntimeSettings

KNOBS = {"sleep": [0.3, 0.15], "noop": ["a", "b"], "cap": ["off", "on"]}
BASELINE = {"sleep": 0.3, "noop": "a", "cap": "off"}


def _run(i: int, config: dict, step_time_s: float | None, outcome: Outcome = Outcome.OK,
         role: Role = Role.SEARCH) -> TrialResult:
    return TrialResult(trial_id=f"t{i:04d}", config={**BASELINE, **config}, role=role, outcome=outcome,
                       step_time_s=step_time_s, peak_memory_bytes=2**28, memory_capacity_bytes=2**31,
                       reason="" if outcome is Outcome.OK else "torch.OutOfMemoryError: planted")


def _doctor(noise_cv: float) -> DoctorReport:
    return DoctorReport(baseline=BASELINE, trial_ids=("t0001",), step_time_s=0.3, run_step_times_s=(0.3,),
                        noise_cv=noise_cv, within_run_cv=0.0, reference_losses=(), loss_tolerance=1e-5,
                        loss_tolerance_source="test", calibration=(), peak_memory_bytes=2**28, phases_s={},
                        tokens_per_step=None)


@pytest.fixture
def runtime(tmp_path):
    spec = _spec(tmp_path, knobs=KNOBS, baseline=BASELINE)
    contract, cdir = init_campaign(spec, tmp_path / "out")
    rt = CampaignRuntime(contract, cdir, RuntimeSettings(tracking_uri="none", in_process=True))
    yield rt
    rt.close()


def _history(noop_runs: int, cap_s: float = 0.140) -> list[TrialResult]:
    runs = [_run(i, {}, 0.3 * (1 + 0.002 * (-1) ** i), role=Role.DOCTOR) for i in range(1, 6)]
    # noop does nothing, measured as often as asked; sleep 0.15 halves the step time
    runs += [_run(10 + i, {"noop": "b"}, 0.3 * (1 + 0.002 * (-1) ** i)) for i in range(noop_runs)]
    runs += [_run(30, {"sleep": 0.15}, 0.150), _run(31, {"sleep": 0.15, "noop": "b"}, 0.149),
             _run(32, {"sleep": 0.15, "cap": "on", "noop": "b"}, cap_s)]
    return runs


def test_a_change_one_run_puts_well_above_the_floor_is_kept_without_a_trial(runtime):
    # one run of cap, 6% faster: its interval straddles the 3% floor, but the model leans
    # far to "it pays", so it is kept; noop, eight runs of nothing, is reverted in the smaller
    # config, which verification measures; no leave-one-out arm
    plan = plan_verification(runtime, _doctor(0.03), _history(noop_runs=8))
    calls = {c.knob: c for c in plan.changes[plan.leader.key]}
    cap = calls["cap"]
    assert cap.call == PAYS and cap.predicted_low < 1.03 < cap.predicted and "likely to pay" in cap.reason
    assert [a.kind for a in plan.arms] == [FINALIST, SMALLER]
    assert plan.arms[1].config == {"sleep": 0.15, "noop": "a", "cap": "on"}


def test_a_change_measured_often_enough_is_called_and_the_rest_are_measured(runtime):
    # cap's one run sits at the 3% floor: the model cannot lean either way, so it is measured
    plan = plan_verification(runtime, _doctor(0.03), _history(noop_runs=8, cap_s=0.149 / 1.03))
    leader = plan.leader
    assert leader.kind == FINALIST and leader.config == {"sleep": 0.15, "noop": "b", "cap": "on"}
    calls = {c.knob: c for c in plan.changes[leader.key]}
    assert calls["sleep"].call == PAYS and calls["sleep"].predicted_low > 1.5  # halves the step: no trial
    assert calls["noop"].call == IDLE and calls["noop"].predicted_high < 1.03  # eight runs show it does nothing
    assert calls["cap"].call == UNCERTAIN and "cannot call" in calls["cap"].reason
    smaller = next(a for a in plan.arms if a.kind == SMALLER)
    assert smaller.config == {"sleep": 0.15, "noop": "a", "cap": "on"} and smaller.reverts == ("noop",)
    [alone] = [a for a in plan.arms if a.kind == LEAVE_ONE_OUT]
    assert alone.config == {"sleep": 0.15, "noop": "a", "cap": "off"} and alone.parent == smaller.key
    assert alone.max_pairs == runtime.spec.budget.minimize_pairs
    # written before any round runs, and read back as it was
    assert VerificationPlan.from_json(runtime.cdir.read_json(runtime.cdir.plan)) == plan


def test_a_change_without_which_a_run_failed_is_needed(runtime):
    history = _history(noop_runs=8) + [_run(40, {"sleep": 0.15, "noop": "b"}, None, Outcome.OOM)]
    history = [r for r in history if r.config != {**BASELINE, "sleep": 0.15, "noop": "b"} or r.outcome.failed]
    plan = plan_verification(runtime, _doctor(0.03), history)
    calls = {c.knob: c for c in plan.changes[plan.leader.key]}
    assert calls["cap"].call == NEEDED and "t0040 ended oom" in calls["cap"].reason


def test_nothing_that_beats_the_noise_means_nothing_to_verify(runtime):
    history = [_run(i, {}, 0.3, role=Role.DOCTOR) for i in range(1, 6)] + [_run(9, {"noop": "b"}, 0.29)]
    plan = plan_verification(runtime, _doctor(0.05), history)
    assert plan.arms == () and "nothing to verify" in plan.note


def test_a_runner_up_that_cannot_be_a_floor_ahead_of_the_leader_is_not_verified(runtime):
    # cap's one run is 0.3% faster than the config without it: the model gives that config a
    # ~40% chance of being faster than the leader, but under 10% of being faster by more than
    # the 3% floor, the least gap verification could tell apart; a second finalist would be a
    # second run of the same speed
    plan = plan_verification(runtime, _doctor(0.03), _history(noop_runs=8, cap_s=0.1485))
    assert runtime.spec.budget.num_finalists == 2
    assert [a.kind for a in plan.arms if a.kind == FINALIST] == [FINALIST]


def test_under_a_trial_cap_the_arms_run_the_rounds_it_affords_and_the_last_arm_leaves_first(tmp_path):
    # 11 trials left: a round of the baseline, the finalist, the smaller config and cap's
    # leave-one-out costs 4, two rounds only; without the leave-one-out it costs 3, three
    # rounds, and each arm's sequential test ends there (its last look at the third pair)
    spec = _spec(tmp_path, knobs=KNOBS, baseline=BASELINE, verify_pairs=7)
    contract, cdir = init_campaign(spec, tmp_path / "out")
    rt = CampaignRuntime(contract, cdir, RuntimeSettings(tracking_uri="none", in_process=True, max_trials=11))
    try:
        plan = plan_verification(rt, _doctor(0.03), _history(noop_runs=8, cap_s=0.149 / 1.03))
    finally:
        rt.close()
    assert [a.kind for a in plan.arms] == [FINALIST, SMALLER]
    assert [a.max_pairs for a in plan.arms] == [3, 3] and "affords 3 round(s) of 2 arm(s)" in plan.note
    # cap is still uncertain: its leave-one-out arm, not the call, left for the cap
    assert {c.knob: c.call for c in plan.changes[plan.leader.key]}["cap"] == UNCERTAIN


def test_changes_the_runs_cannot_tell_apart_are_measured_patch_first_whatever_the_float_noise():
    # a knob and a patch that only ever ran together: one prediction for both, equal but for
    # the last digits (1.4133667096312519 and 1.413366709631295 in a failing run of
    # test_minimize's patch test: the cap kept the knob's arm, and the patch, a comment,
    # stayed in unmeasured)
    def change(knob: str, predicted: float) -> ChangeEvidence:
        return ChangeEvidence(knob=knob, baseline_value=False, value=True, call=UNCERTAIN, predicted=predicted)

    for knob_noise, patch_noise in ((0.0, 4e-14), (4e-14, 0.0)):
        tied = [change("sleep", 1.4133667096312519 + knob_noise),
                change("patch_comment", 1.4133667096312519 + patch_noise)]
        assert [c.knob for c in sorted(tied, key=leave_one_out_order)] == ["patch_comment", "sleep"]
    # a real difference in the prediction still comes first: the change least likely to pay
    apart = [change("patch_comment", 1.6), change("sleep", 1.2)]
    assert [c.knob for c in sorted(apart, key=leave_one_out_order)] == ["sleep", "patch_comment"]
