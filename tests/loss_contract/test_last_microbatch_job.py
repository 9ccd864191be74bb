"""The loss contract on a job whose printed loss is its last micro-batch's (``job/``).

Its per-step loss depends on the split of the global batch (3% apart between honest
splits), its eval loss does not. Doctor refuses the claim that the per-step loss is a
function of the global batch; with ``loss_signal = "eval"`` every honest split is
accepted at a near-exact tolerance and the cheats aimed at the eval loss are caught; with
``loss_signal = "window"`` doctor warns how loose the check is, and still accepts honest
splits and catches a job that trains fewer steps than it reports.
"""

from __future__ import annotations

import pytest
from last_microbatch import BASELINE, CHEATS, HONEST, cheat_patch, runtime

from infrarsi.contract.checks import enforce
from infrarsi.core.errors import ContractError
from infrarsi.core.trial import Outcome, Role
from infrarsi.stages.doctor import run_doctor


def _run(rt, doctor, config):
    r = rt.run_one({**BASELINE, **config}, Role.SEARCH, check=lambda t: enforce(t, rt.spec.contract,
                                                                                 doctor.loss_reference))
    return r


def test_doctor_refuses_a_per_step_claim_that_an_honest_split_refutes(tmp_path):
    rt = runtime(tmp_path, "step")
    with pytest.raises(ContractError, match=r"not a deterministic function of the global batch") as err:
        run_doctor(rt)
    assert "loss_signal = \"window\"" in str(err.value) and "\"eval\"" in str(err.value)
    rt.close()


@pytest.fixture(scope="module")
def eval_campaign(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("eval")
    rt = runtime(tmp, "eval", [cheat_patch(tmp / "cheats", name) for name in CHEATS])
    yield rt, run_doctor(rt)
    rt.close()


def test_the_eval_signal_is_near_exact_where_the_step_loss_is_not(eval_campaign):
    rt, doctor = eval_campaign
    contract = doctor.loss_reference
    assert contract.signal == "eval" and not contract.warnings
    assert contract.tolerance == rt.spec.contract.min_loss_tolerance  # honest splits: ~2e-8
    split = next(row for row in doctor.calibration if row["config"] == {"micro_batch": 8})
    assert split["score"] < 1e-6 and abs(split["deviation"]) > 0.01  # eval agrees, step loss does not


@pytest.mark.parametrize("config", HONEST, ids=lambda c: "-".join(f"{k}{v}" for k, v in c.items()))
def test_honest_splits_are_accepted_on_the_eval_signal(eval_campaign, config):
    rt, doctor = eval_campaign
    r = _run(rt, doctor, config)
    assert r.outcome is Outcome.OK, r.reason


@pytest.mark.parametrize("cheat,reason", [
    ("fake_eval", "eval loss is"), ("fewer_steps", "eval loss is"), ("smaller_model", "eval loss is")])
def test_cheats_aimed_at_the_eval_signal_are_caught(eval_campaign, cheat, reason):
    rt, doctor = eval_campaign
    r = _run(rt, doctor, {f"patch_{cheat}": True})
    assert r.outcome is Outcome.CONTRACT_VIOLATION, (r.outcome, r.reason)
    assert reason in r.reason


def test_the_window_signal_warns_how_loose_it_is_and_still_catches_fewer_steps(tmp_path):
    rt = runtime(tmp_path, "window", [cheat_patch(tmp_path / "cheats", "fewer_steps")])
    doctor = run_doctor(rt)
    contract = doctor.loss_reference
    assert contract.warnings and "cannot tell changes of that size" in contract.warnings[0]
    assert "warning:" in doctor.loss_tolerance_source
    r = _run(rt, doctor, {"micro_batch": 32})
    assert r.outcome is Outcome.OK, r.reason
    cheat = _run(rt, doctor, {"patch_fewer_steps": True})
    assert cheat.outcome is Outcome.CONTRACT_VIOLATION and "8-step mean loss is" in cheat.reason, cheat.reason
    rt.close()
