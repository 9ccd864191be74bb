"""The campaign folder's records, written and read back through ``infrarsi.record.campaign``:
every record type comes back equal (tuples of tuples as tuples, NaN and infinities as
floats), and a folder an older version wrote (fields since renamed, keys since dropped)
still loads. A real campaign folder from ``init``; nothing runs."""

import json
import math
from dataclasses import asdict, replace

import numpy as np
import pytest
from helpers.fake_spec import fake_spec

from infrarsi.contract.loss_contract import ClassReference, LossContract
from infrarsi.contract.noise import estimate_noise
from infrarsi.core.trial import Outcome, Role, TrialResult
from infrarsi.record.campaign import (
    final_verification,
    promoted,
    read_contract,
    read_doctor,
    read_minimize,
    read_plan,
    read_verification,
    write,
)
from infrarsi.record.doctor import DoctorReport
from infrarsi.record.minimize import Contribution, MinimizeReport
from infrarsi.record.verification import (
    LEAVE_ONE_OUT,
    Arm,
    ChangeEvidence,
    Verdict,
    VerificationPlan,
    VerificationReport,
)
from infrarsi.stages.init import init_campaign

BASELINE = {"sleep": 0.3, "noop": "a", "cap": False}


@pytest.fixture
def folder(tmp_path):
    spec = fake_spec(tmp_path, knobs={"sleep": [0.3, 0.15], "noop": ["a", "b"], "cap": [False, True]}, baseline=BASELINE)
    return init_campaign(spec, tmp_path / "out")


def _doctor(losses: tuple[float, ...]) -> DoctorReport:
    bf16 = ClassReference(settings=(("noop", "b"),), losses=losses, tolerance=0.02, trial_ids=("t0004",),
                          honest_score=None, failure="")
    contract = LossContract(signal="step", window=1, baseline=BASELINE, changing_knobs=("noop",),
                            classes=(ClassReference(settings=(), losses=(2.5, 2.4), tolerance=1e-5), bf16),
                            splits=({"sleep": 0.15},))
    return DoctorReport(baseline=BASELINE, trial_ids=("t0001", "t0002"), step_time_s=0.3, run_step_times_s=(0.3, 0.31),
                        noise_cv=0.01, within_run_cv=0.02, reference_losses=(2.5, 2.4), loss_tolerance=1e-5,
                        loss_tolerance_source="calibrated",
                        calibration=({"config": {"sleep": 0.15}, "deviation": None},),
                        peak_memory_bytes=2**28, phases_s={"forward_s": 0.1}, tokens_per_step=2048,
                        noise=estimate_noise([0.3, 0.31], [[0.3, 0.29, 0.31]]), startup_s=1.5,
                        loss_contract=contract)


def _verdict(config: dict, speedup: float, promoted: bool, **kw) -> Verdict:
    return Verdict(config=config, source_trial_id="t0010", pairs=(("t0020", "t0021"), ("t0022", "t0023")),
                   baseline_times_s=(0.3, 0.3), candidate_times_s=(0.15, 0.16), speedup=speedup, ci_low=speedup - 0.1,
                   ci_high=math.inf, promoted=promoted, reason="cleared", canary_seeds=(1042, 1043), **kw)


def _plan() -> VerificationPlan:
    leader = {**BASELINE, "sleep": 0.15, "cap": True}
    arms = (Arm(key="finalist 1", kind="finalist", config=leader, source_trial_id="t0010", max_pairs=4),
            Arm(key="leader less cap", kind=LEAVE_ONE_OUT, config={**leader, "cap": False}, source_trial_id="t0010",
                max_pairs=4, parent="finalist 1", reverts=("cap",)))
    changes = {"finalist 1": (ChangeEvidence(knob="sleep", baseline_value=0.3, value=0.15, call="pays", predicted=2.0,
                                             predicted_low=1.8, predicted_high=2.2),
                              ChangeEvidence(knob="cap", baseline_value=False, value=True, call="uncertain"))}
    return VerificationPlan(arms=arms, changes=changes, margin=0.01, note="two arms")


def test_every_record_round_trips_through_the_campaign_folder(folder):
    contract, cdir = folder
    assert read_contract(cdir) == contract
    assert (read_doctor(cdir), read_plan(cdir), read_verification(cdir), read_minimize(cdir)) == (None,) * 4

    doctor = _doctor(losses=(2.5, math.nan, -math.inf))
    write(cdir, cdir.doctor, doctor)
    assert "NaN" in cdir.doctor.read_text()  # as json.dumps writes it
    back = read_doctor(cdir)
    bf16 = back.loss_contract.classes[1]
    assert bf16.settings == (("noop", "b"),) and isinstance(bf16.settings[0], tuple)
    assert math.isnan(bf16.losses[1]) and bf16.losses[2] == -math.inf
    assert back.loss_reference is back.loss_contract  # typed: nothing parsed on use
    doctor = _doctor(losses=(2.6, 2.5))
    write(cdir, cdir.doctor, doctor)
    assert read_doctor(cdir) == doctor

    plan = _plan()
    write(cdir, cdir.plan, plan)
    assert read_plan(cdir) == plan and read_plan(cdir).leader.config["cap"] is True

    verification = VerificationReport(
        verdicts=(_verdict(plan.arms[0].config, 2.0, True, arm="finalist 1"),
                  _verdict(plan.arms[1].config, 1.9, True, arm="leader less cap", kind=LEAVE_ONE_OUT)),
        margin=0.01, canary_effective=True, plan=plan,
        rounds=({"seed": 1042, "baseline": "t0020", "runs": {"finalist 1": "t0021"}},))
    write(cdir, cdir.verification, verification)
    back = read_verification(cdir)
    assert back == verification and back.verdicts[0].pairs[0] == ("t0020", "t0021")
    assert back.verdicts[0].ci_high == math.inf and back.plan == plan
    assert promoted(cdir) == verification.verdicts[0]  # no minimization: verification's choice stands

    final = replace(verification, verdicts=(replace(verification.verdicts[0], promoted=False),
                                            verification.verdicts[1]))
    minimize = MinimizeReport(
        winner=plan.arms[0].config, promoted=plan.arms[1].config, dropped=("cap",), margin=0.01, job_steps=None,
        num_trials=2, note="cap dropped", final=final,
        contributions=(Contribution(knob="cap", baseline_value=False, value=True, contribution=1.0, ci_low=0.98,
                                    ci_high=1.005, step_contribution=1.0, pairs=(("t0021", "t0031"),), kept=False,
                                    ground="equivalent"),))
    write(cdir, cdir.minimize, minimize)
    assert read_minimize(cdir) == minimize
    assert final_verification(cdir) == final
    assert promoted(cdir) == final.verdicts[1]  # minimization's final report decides


def test_a_folder_written_in_an_older_shape_still_loads(folder):
    _, cdir = folder
    doctor = _doctor(losses=(2.6, 2.5)).to_json()
    # before the loss contract and the noise estimate were kept
    cdir.write_json(cdir.doctor, {**doctor, "loss_contract": {}, "noise": {}, "retired_field": 1})
    old = read_doctor(cdir)
    assert old.loss_contract is None and old.noise is None and old.loss_reference.losses == old.reference_losses == (2.5, 2.4)

    verdict = _verdict(BASELINE, 2.0, True).to_json()
    del verdict["margin"], verdict["canary_seeds"]
    cdir.write_json(cdir.verification, {"verdicts": [{**verdict, "noise_floor": 0.03, "old_key": "x"}],
                                        "noise_floor": 0.03, "plan": {}})
    old = read_verification(cdir)
    assert old.margin == 0.03 and old.verdicts[0].margin == 0.03 and old.plan is None
    assert old.verdicts[0].canary_seeds == () and old.promoted == old.verdicts[0]

    plan = _plan().to_json()
    del plan["margin"]
    cdir.write_json(cdir.plan, {**plan, "noise_floor": 0.02})
    assert read_plan(cdir).margin == 0.02

    # a value JSON has no type for is written as its str, as json.dumps(default=str) writes it
    odd = TrialResult(trial_id="t2", config=BASELINE, role=Role.SEARCH, outcome=Outcome.OK, step_time_s=0.1,
                      peak_memory_bytes=np.int64(5), extra={"contaminated": np.bool_(False)})
    assert json.loads(json.dumps(odd.to_json(), default=str)) == json.loads(json.dumps(asdict(odd) | {
        "role": "search", "outcome": "ok"}, default=str))

    # a ledger or bank row that wrote None for an empty reason and sequences
    row = json.loads(json.dumps({"trial_id": "t1", "config": BASELINE, "role": "search", "outcome": "crash",
                                 "reason": None, "losses": None, "patches": None}))
    assert TrialResult.from_json(row) == TrialResult(trial_id="t1", config=BASELINE, role=Role.SEARCH,
                                                     outcome=Outcome.CRASH)
