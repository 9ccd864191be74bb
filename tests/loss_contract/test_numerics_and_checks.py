"""The loss contract's parts without running a job: numerics classes, the trajectory
statistics, the signals and the class-aware choice of reference."""

from __future__ import annotations

import pytest
from tiny_gpt import knob_space

from infrarsi.contract.checks import contract_problems
from infrarsi.contract.loss_contract import ClassReference, LossContract
from infrarsi.contract.loss_reference import Deviation, LossReference
from infrarsi.contract.numerics import changing_knobs, class_of, default_numerics, feasible_classes
from infrarsi.core.spec import ContractSpec, KnobSpec
from infrarsi.core.trial import Outcome, Role, TrialResult

CONTRACT = ContractSpec(seq_len=8, global_batch_tokens=64, num_steps=6, warmup_steps=1, editable=["*"],
                        locked=["*"])
REF = (4.0, 3.5, 3.2, 3.0, 2.9, 2.8)


def _result(losses, config=None, eval_losses=()):
    return TrialResult(trial_id="t", config=config or {}, role=Role.SEARCH, outcome=Outcome.OK, step_time_s=0.1,
                       losses=tuple(losses), eval_losses=tuple(eval_losses), tokens_per_step=64)


@pytest.mark.parametrize("name,kind,expected", [
    ("precision", None, "changes"), ("dtype", None, "changes"), ("use_amp", None, "changes"),
    ("micro_batch", None, "keeps"), ("compile", None, "keeps"), ("attention", None, "keeps"),
    ("batch_size", "precision", "changes"), ("precision", "threads", "keeps")])
def test_default_numerics_by_kind_then_name(name, kind, expected):
    assert default_numerics(name, kind) == expected


def test_declared_numerics_win_and_classes_come_from_the_feasible_space():
    knobs = {"micro_batch": KnobSpec(values=[1, 2]), "precision": KnobSpec(values=["fp32", "bf16"]),
             "compile": KnobSpec(values=["off", "on"], numerics="changes")}
    assert changing_knobs(knobs) == ("precision", "compile")
    space = knob_space({"micro_batch": [1, 2], "precision": ["fp32", "bf16"], "compile": ["off", "on"]})
    base = {"micro_batch": 1, "precision": "fp32", "compile": "off"}
    classes = feasible_classes(space, base, ("precision", "compile"))
    assert classes == [(), (("compile", "on"),), (("precision", "bf16"),), (("compile", "on"), ("precision", "bf16"))]
    assert class_of({**base, "micro_batch": 2}, base, ("precision",)) == ()


def test_one_steps_excess_does_not_decide_a_drift_does():
    ref = LossReference(losses=REF, tolerance=0.01)
    spike = [r * (1.05 if i == 2 else 1.0) for i, r in enumerate(REF)]  # 5% at one step only
    assert Deviation.of([0, 0, 0.05, 0, 0, 0]).score < 0.01
    assert ref.problems(_result(spike)) == []
    drift = [r * (1 + 0.006 * i) for i, r in enumerate(REF)]  # never above 3%, trending up
    problems = ref.problems(_result(drift))
    assert problems and "above the baseline" in problems[0] and "trend at the last point +3.00%" in problems[0]
    lower = [r * 0.98 for r in REF]
    assert "below the baseline" in ref.problems(_result(lower))[0]


def test_the_window_and_eval_signals_compare_what_they_say():
    noisy = [r * (1 + (0.04 if i % 2 else -0.04)) for i, r in enumerate(REF)]  # +-4% per step, no drift
    assert LossReference(losses=REF, tolerance=0.01).problems(_result(noisy))  # one step's view: noise
    assert not LossReference(losses=REF, tolerance=0.01, signal="window", window=2).problems(_result(noisy))
    ev = LossReference(losses=REF, eval_losses=(3.0, 2.5), tolerance=1e-4, signal="eval")
    assert not ev.problems(_result(noisy, eval_losses=(3.0, 2.5)))
    assert "eval loss is" in ev.problems(_result(REF, eval_losses=(3.0, 2.51)))[0]
    assert "reported 1 eval losses" in ev.problems(_result(REF, eval_losses=(3.0,)))[0]


def test_a_config_is_held_to_the_reference_and_tolerance_of_its_own_numerics():
    bf16 = tuple(r * 1.01 for r in REF)
    contract = LossContract(signal="step", window=2, baseline={"precision": "fp32", "micro_batch": 1},
                            changing_knobs=("precision",), classes=(
                                ClassReference(settings=(), losses=REF, tolerance=1e-5),
                                ClassReference(settings=(("precision", "bf16"),), losses=bf16, tolerance=2e-3)))
    fp32 = {"precision": "fp32", "micro_batch": 2}
    half = {"precision": "bf16", "micro_batch": 2}
    assert contract_problems(_result(REF, fp32), CONTRACT, contract) == []
    assert "above the baseline" in contract_problems(_result(bf16, fp32), CONTRACT, contract)[0]  # bf16 in fp32
    assert contract_problems(_result([b * 1.001 for b in bf16], half), CONTRACT, contract) == []
    assert "precision=bf16 reference" in contract_problems(_result(REF, half), CONTRACT, contract)[0]
    assert LossContract.from_json(contract.to_json()) == contract
    unknown = {"precision": "fp8", "micro_batch": 1}
    assert "no reference run in its numerics (precision=fp8)" in contract_problems(_result(REF, unknown), CONTRACT,
                                                                                      contract)[0]
