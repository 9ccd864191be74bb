"""The plan verification runs, from the trials already in hand: which changes of the
leader the time model can call, which it cannot, and the arms that follow. Hand-made
trial results on the fake workload's space (tests/fake_workload.py); nothing runs."""


import pytest
from helpers.fake_spec import fake_spec

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
    spec = fake_spec(tmp_path, knobs=KNOBS, baseline=BASELINE)
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


def _plan(work, history: list[TrialResult], noise_cv: float, *, numerics_knob: str | None = None) -> VerificationPlan:
    """The plan from ``history`` for the fake workload in a fresh folder ``work``, doctor's
    noise ``noise_cv``; ``numerics_knob`` declared as changing the numerics."""
    work.mkdir()
    spec = fake_spec(work, knobs=KNOBS, baseline=BASELINE)
    if numerics_knob:
        flag = f'flag = "--{numerics_knob}"'
        spec.write_text(spec.read_text().replace(flag, flag + '\nnumerics = "changes"'))
    contract, cdir = init_campaign(spec, work / "out")
    rt = CampaignRuntime(contract, cdir, RuntimeSettings(tracking_uri="none", in_process=True))
    try:
        return plan_verification(rt, _doctor(noise_cv), history)
    finally:
        rt.close()


def test_a_change_one_run_puts_clearly_above_1_is_kept_and_one_without_evidence_is_measured(runtime):
    # one run of cap, 6% faster: its interval lies above 1, so it is kept without a trial. Eight
    # runs of noop doing nothing still leave its interval (about +-1.8%) wider than the 1%
    # margin: that is no evidence it may go, so the leader less noop is measured beside it
    plan = plan_verification(runtime, _doctor(0.03), _history(noop_runs=8))
    calls = {c.knob: c for c in plan.changes[plan.leader.key]}
    assert calls["cap"].call == PAYS and 1.0 < calls["cap"].predicted_low < 1.03 < calls["cap"].predicted
    assert calls["noop"].call == UNCERTAIN and calls["noop"].predicted_low < 0.99 < 1.01 < calls["noop"].predicted_high
    assert [a.kind for a in plan.arms] == [FINALIST, LEAVE_ONE_OUT]
    assert plan.arms[1].config == {"sleep": 0.15, "noop": "a", "cap": "on"}


@pytest.fixture
def wide_margin(tmp_path):
    """The fake workload with a 3% practical margin: eight runs can show noop within it."""
    spec = fake_spec(tmp_path, knobs=KNOBS, baseline=BASELINE, practical_margin=0.03)
    contract, cdir = init_campaign(spec, tmp_path / "out")
    rt = CampaignRuntime(contract, cdir, RuntimeSettings(tracking_uri="none", in_process=True))
    yield rt
    rt.close()


def test_a_change_predicted_within_the_margin_is_left_out_and_the_rest_are_measured(wide_margin):
    # cap's one run sits at 1.03x: the model cannot call it, so it is measured
    plan = plan_verification(wide_margin, _doctor(0.03), _history(noop_runs=8, cap_s=0.149 / 1.03))
    leader = plan.leader
    assert leader.kind == FINALIST and leader.config == {"sleep": 0.15, "noop": "b", "cap": "on"}
    calls = {c.knob: c for c in plan.changes[leader.key]}
    assert calls["sleep"].call == PAYS and calls["sleep"].predicted_low > 1.5  # halves the step: no trial
    assert calls["noop"].call == IDLE and calls["noop"].predicted_high < 1.03  # eight runs show it does nothing
    assert "equivalent" in calls["noop"].reason
    assert calls["cap"].call == UNCERTAIN and "cannot call" in calls["cap"].reason
    smaller = next(a for a in plan.arms if a.kind == SMALLER)
    assert smaller.config == {"sleep": 0.15, "noop": "a", "cap": "on"} and smaller.reverts == ("noop",)
    [alone] = [a for a in plan.arms if a.kind == LEAVE_ONE_OUT]
    assert alone.config == {"sleep": 0.15, "noop": "a", "cap": "off"} and alone.parent == smaller.key
    assert alone.max_pairs == wide_margin.spec.budget.minimize_pairs
    # written before any round runs, and read back as it was
    assert VerificationPlan.from_json(wide_margin.cdir.read_json(wide_margin.cdir.plan)) == plan


def test_a_change_without_which_a_run_failed_is_needed(runtime):
    history = _history(noop_runs=8) + [_run(40, {"sleep": 0.15, "noop": "b"}, None, Outcome.OOM)]
    history = [r for r in history if r.config != {**BASELINE, "sleep": 0.15, "noop": "b"} or r.outcome.failed]
    plan = plan_verification(runtime, _doctor(0.03), history)
    calls = {c.knob: c for c in plan.changes[plan.leader.key]}
    assert calls["cap"].call == NEEDED and "t0040 ended oom" in calls["cap"].reason


def test_a_change_the_user_pays_for_is_kept_on_the_memory_model_s_word_only_where_it_is_nearly_sure(tmp_path):
    # every run without cap peaked at the memory budget (emulation off: nothing stops it),
    # every run with it at a fifth: the memory model gives the leader without cap about an
    # even chance to fit (0.53). A launch knob is kept on that; a knob that changes the
    # numerics is not (it must pay, or be shown needed) and is called on its time instead.
    # Runs at 1.1x the budget leave P(fit) 0.08: kept either way
    def calls(numerics: bool, peak: float) -> dict:
        history = [r.replace(peak_memory_bytes=int(2**31 * (0.2 if r.config["cap"] == "on" else peak)))
                   for r in _history(noop_runs=4)]
        plan = _plan(tmp_path / f"{numerics}-{peak}", history, 0.03, numerics_knob="cap" if numerics else None)
        return {c.knob: c for c in plan.changes[plan.leader.key]}

    launch, paid, sure = calls(False, 1.0)["cap"], calls(True, 1.0)["cap"], calls(True, 1.1)["cap"]
    assert launch.call == NEEDED and "P(fit) = 0.5" in launch.reason
    assert paid.call == PAYS  # 6% faster in its one run: above 1 + the margin
    assert sure.call == NEEDED and "P(fit) = 0.0" in sure.reason


def test_nothing_that_beats_the_baseline_by_the_margin_means_nothing_to_verify(runtime):
    # 0.7% faster once, under the 1% margin; doctor's 5% noise does not enter
    history = [_run(i, {}, 0.3, role=Role.DOCTOR) for i in range(1, 6)] + [_run(9, {"noop": "b"}, 0.298)]
    plan = plan_verification(runtime, _doctor(0.05), history)
    assert plan.arms == () and "nothing to verify" in plan.note
    # 3.4% faster once: within doctor's noise, but past the margin, so verification decides
    history[-1] = _run(9, {"noop": "b"}, 0.29)
    runtime.cdir.plan.unlink()
    assert [a.kind for a in plan_verification(runtime, _doctor(0.05), history).arms] == [FINALIST]


def test_a_runner_up_is_verified_by_its_chance_of_beating_the_leader_by_the_margin(tmp_path, runtime, wide_margin):
    # cap's one run is 0.3% faster than the config without it: the model gives that config a
    # ~40% chance of being faster than the leader, over 10% of being faster by more than the
    # 1% margin: verified beside the leader, though doctor's 3% noise is more than that
    # (the noise is no bar; minimization weighs the pairs with the model)
    (tmp_path / "two").mkdir()
    spec = fake_spec(tmp_path / "two", knobs=KNOBS, baseline=BASELINE, num_finalists=2)
    contract, cdir = init_campaign(spec, tmp_path / "two" / "out")
    two = CampaignRuntime(contract, cdir, RuntimeSettings(tracking_uri="none", in_process=True))
    try:
        assert two.spec.budget.num_finalists == 2
        plan = plan_verification(two, _doctor(0.03), _history(noop_runs=8, cap_s=0.1485))
    finally:
        two.close()
    assert [a.kind for a in plan.arms if a.kind == FINALIST] == [FINALIST, FINALIST]
    runner_up = [a for a in plan.arms if a.kind == FINALIST][1]
    assert runner_up.predicted_gain is not None and abs(runner_up.predicted_gain) < 0.02
    # at the default (four) the same runner-up comes first, and more may follow
    assert runtime.spec.budget.num_finalists == 4
    plan = plan_verification(runtime, _doctor(0.03), _history(noop_runs=8, cap_s=0.1485))
    finalists = [a for a in plan.arms if a.kind == FINALIST]
    assert 2 <= len(finalists) <= 4 and finalists[1].config == runner_up.config
    # under 10% of being faster by more than a 3% margin: a second finalist would be a
    # second run of the same speed
    plan = plan_verification(wide_margin, _doctor(0.001), _history(noop_runs=8, cap_s=0.1485))
    assert [a.kind for a in plan.arms if a.kind == FINALIST] == [FINALIST]


def test_the_leader_is_the_model_weighed_with_its_own_runs_by_the_machine_s_noise(tmp_path):
    # cap alone is 10% faster, but with sleep 0.15 it measured 5% slower (0.158 s against
    # 0.150): an interaction one run cannot make the model select, so the additive fit
    # predicts that config the fastest. On a quiet machine (0.2% a run) its run says
    # otherwise and decides; on a noisy one (10%) one run cannot, and the model's fit does
    history = [_run(i, {}, 0.3 * (1 + 0.002 * (-1) ** i), role=Role.DOCTOR) for i in range(1, 6)]
    history += [_run(10, {"noop": "b"}, 0.300), _run(11, {"cap": "on"}, 0.270),
                _run(12, {"noop": "b", "cap": "on"}, 0.271), _run(30, {"sleep": 0.15}, 0.150),
                _run(31, {"sleep": 0.15, "noop": "b"}, 0.151), _run(32, {"sleep": 0.15, "cap": "on"}, 0.158)]
    leaders = {noise: dict(_plan(tmp_path / str(noise), history, noise).leader.config) for noise in (0.002, 0.1)}
    assert leaders[0.002] == {"sleep": 0.15, "noop": "a", "cap": "off"}
    assert leaders[0.1] == {"sleep": 0.15, "noop": "a", "cap": "on"}


def test_under_a_trial_cap_the_arms_run_the_rounds_it_affords_and_the_last_arm_leaves_first(tmp_path):
    # 11 trials left: a round of the baseline, the finalist, the smaller config and cap's
    # leave-one-out costs 4, two rounds only; without the leave-one-out it costs 3, three
    # rounds, and each arm's sequential test ends there (its last look at the third pair)
    spec = fake_spec(tmp_path, knobs=KNOBS, baseline=BASELINE, verify_pairs=7, practical_margin=0.03)
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


def test_changes_the_runs_cannot_tell_apart_get_their_arms_in_one_order_whatever_the_float_noise():
    # two knobs that only ever ran together: one prediction for both, equal but for the last
    # digits (1.4133667096312519 and 1.413366709631295 in a failing run of test_minimize: the
    # float noise chose which arm a cap kept)
    def change(knob: str, predicted: float) -> ChangeEvidence:
        return ChangeEvidence(knob=knob, baseline_value=False, value=True, call=UNCERTAIN, predicted=predicted)

    for noise_a, noise_b in ((0.0, 4e-14), (4e-14, 0.0)):
        tied = [change("sleep", 1.4133667096312519 + noise_a), change("compile", 1.4133667096312519 + noise_b)]
        assert [c.knob for c in sorted(tied, key=leave_one_out_order)] == ["compile", "sleep"]
    # a real difference in the prediction still comes first: the change least likely to pay
    apart = [change("compile", 1.6), change("sleep", 1.2)]
    assert [c.knob for c in sorted(apart, key=leave_one_out_order)] == ["sleep", "compile"]
