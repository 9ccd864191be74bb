"""A verdict from an arm's rounds (stages/run/verify.py), on hand-made runs: what decided
it, and what may still undo it."""

from infrarsi.core.trial import Outcome, Role, TrialResult
from infrarsi.stages.run.evidence import FINALIST, Arm
from infrarsi.stages.run.sequential import SequentialRule
from infrarsi.stages.run.verify import _Arm, _verdict


def _run(trial_id: str, step_time_s: float | None, role: Role, outcome: Outcome = Outcome.OK) -> TrialResult:
    return TrialResult(trial_id=trial_id, config={"x": 1}, role=role, outcome=outcome, step_time_s=step_time_s,
                       reason="" if outcome is Outcome.OK else "loss is 2% above the baseline at canary seed 1002")


def _state(third: Outcome) -> _Arm:
    arm = Arm(key="finalist 1", kind=FINALIST, config={"x": 1}, source_trial_id="t0009", max_pairs=5)
    state = _Arm(arm=arm, rule=SequentialRule(max_pairs=5), seeds=[1000, 1001, 1002])
    for i, t in enumerate((0.5, 0.5, 0.5 if third is Outcome.OK else None)):
        run = _run(f"b{i}", t, Role.VERIFY, Outcome.OK if i < 2 else third)
        state.pairs.append((_run(f"a{i}", 1.0, Role.VERIFY_BASELINE), run))
    state.decided, state.num_decided = "it clears", 2  # two exact 2x pairs decide it
    return state


def test_the_pairs_that_decided_an_arm_make_its_verdict():
    verdict = _verdict(_state(Outcome.OK), 0.05, None)
    assert verdict.promoted and verdict.clears and verdict.pairs == (("a0", "b0"), ("a1", "b1"))
    assert verdict.speedup == 2.0 and verdict.canary_seeds == (1000, 1001)


def test_a_run_that_failed_after_the_decision_still_fails_the_verdict():
    """The arm ran a third round as another arm's parent and broke the loss contract there."""
    verdict = _verdict(_state(Outcome.CONTRACT_VIOLATION), 0.05, None)
    assert not verdict.promoted and not verdict.clears
    assert "b2 (verify) contract_violation" in verdict.reason
