"""A verdict from an arm's rounds (stages/run/verify.py), on hand-made runs: what decided
it, what may still undo it, and which cleared arm minimization promotes (and on what ground)."""

import pytest

from infrarsi.core.trial import Outcome, Role, TrialResult
from infrarsi.stages.run.evidence import (
    FINALIST,
    IDLE,
    LEAVE_ONE_OUT,
    PAYS,
    UNCERTAIN,
    Arm,
    ChangeEvidence,
    VerificationPlan,
)
from infrarsi.stages.run.minimize import Ground, _choose, _contributions, _Runs, promotable
from infrarsi.stages.run.minimize import _evidence as _evidence_of
from infrarsi.stages.run.sequential import SequentialRule
from infrarsi.stages.run.verify import Verdict, VerificationReport, _Arm, _verdict


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


def test_a_leave_one_out_arm_whose_change_does_not_pay_runs_until_it_clears_on_its_own():
    """Two pairs show the change left out does not pay (the arm runs as fast as its parent),
    but two pairs whose baselines differed cannot clear the baseline at an early look: the
    arm, which may be promoted in its parent's place, runs another round instead of stopping
    with a verdict that could never promote it."""
    from infrarsi.stages.run.evidence import LEAVE_ONE_OUT
    from infrarsi.stages.run.verify import _decide

    parent = _Arm(arm=Arm(key="finalist 1", kind=FINALIST, config={"x": 1}, source_trial_id="t0009", max_pairs=3),
                  rule=SequentialRule(max_pairs=3))
    child = _Arm(arm=Arm(key="finalist 1 less x", kind=LEAVE_ONE_OUT, config={"x": 0}, source_trial_id="t0009",
                         max_pairs=3, parent="finalist 1", reverts=("x",)), rule=SequentialRule(max_pairs=3))
    for i, (base, fast) in enumerate(((1.0, 0.5), (1.3, 0.5))):  # the baseline's time moved 30% between rounds
        a = _run(f"a{i}", base, Role.VERIFY_BASELINE)
        parent.pairs.append((a, _run(f"p{i}", fast, Role.VERIFY)))
        child.pairs.append((a, _run(f"c{i}", fast * 1.0001, Role.MINIMIZE)))
    states = {s.arm.key: s for s in (parent, child)}
    _decide(child, states, 0.05, None)
    assert child.open  # its change does not pay, yet it has not cleared the baseline
    third = _run("a2", 1.1, Role.VERIFY_BASELINE)
    parent.pairs.append((third, _run("p2", 0.5, Role.VERIFY)))
    child.pairs.append((third, _run("c2", 0.5 * 1.0001, Role.MINIMIZE)))
    _decide(child, states, 0.05, None)
    assert child.decided == "its change does not pay" or child.decided == "measured to its last pair"
    assert _verdict(child, 0.05, None).clears


def _cleared(arm: str, config: dict, speedup: float) -> Verdict:
    return Verdict(config=config, source_trial_id="t0009", pairs=(), baseline_times_s=(), candidate_times_s=(),
                   speedup=speedup, ci_low=speedup * 0.99, ci_high=speedup * 1.01, promoted=arm == "finalist 1",
                   reason="", arm=arm, clears=True)


def _rounds(leader_s: list[float], smaller_s: list[float]) -> _Runs:
    runs = _Runs.__new__(_Runs)  # the runs by round, as _Runs reads them from verification and the ledger
    runs.by_arm = {"finalist 1": {i: _run(f"f{i}", t, Role.VERIFY) for i, t in enumerate(leader_s)},
                   "finalist 1 less noop": {i: _run(f"s{i}", t, Role.VERIFY) for i, t in enumerate(smaller_s)}}
    return runs


def _evidence(call: str, low: float, high: float, *, paid: bool = False, inert: bool = False) -> dict:
    """The leader's noop change as minimization sees it: the time model's call and interval."""
    change = ChangeEvidence(knob="noop", baseline_value="a", value="b", call=call, predicted=(low + high) / 2,
                            predicted_low=low, predicted_high=high)
    plan = VerificationPlan(arms=(), changes={}, margin=MARGIN)
    return {("noop", "b"): _evidence_of(change, plan, _rounds([], []), paid, inert, MARGIN, None, True)}


MARGIN = 0.01
BASE = {"sleep": 0.3, "noop": "a"}


def _choice(smaller_s: list[float], evidence: dict) -> str:
    leader = _cleared("finalist 1", {"sleep": 0.15, "noop": "b"}, 2.0)
    smaller = _cleared("finalist 1 less noop", {"sleep": 0.15, "noop": "a"}, 1.99)
    report = VerificationReport(verdicts=(leader, smaller), margin=MARGIN)
    best, chosen, why = _choose(report, _rounds([0.15] * 3, smaller_s), BASE, evidence,
                                promotable(report.verdicts, set()), MARGIN, None)
    assert best is leader
    return chosen.arm


# 0.5% slower on average in three pairs that spread 0.3%: neither shown slower nor shown within
# the 1% margin (its upper bound reaches past it).
UNSURE = [0.15075, 0.15030, 0.15120]


def test_a_change_without_evidence_to_drop_it_stays_in_the_promoted_config():
    """Failing to show the arm without it slower is not evidence that the change does nothing."""
    assert _choice(UNSURE, _evidence(UNCERTAIN, 0.97, 1.05)) == "finalist 1"


@pytest.mark.parametrize("evidence", [
    _evidence(IDLE, 0.995, 1.004),  # predicted equivalent: its interval lies below 1 + the margin
    _evidence(IDLE, 0.95, 0.99),  # predicted to cost
    _evidence(UNCERTAIN, 0.9, 1.1, inert=True),  # doctor's calibration saw it do nothing
    _evidence(UNCERTAIN, 0.9, 1.1, paid=True),  # it changes the numerics and was not shown to pay
])
def test_a_change_with_a_ground_to_drop_it_goes_where_the_rounds_do_not_contradict(evidence):
    assert _choice(UNSURE, evidence) == "finalist 1 less noop"
    # 5% slower in every pair: the rounds show that what it leaves out pays, whatever was predicted
    assert _choice([0.1575, 0.1574, 0.1576], evidence) == "finalist 1"


def test_an_arm_shown_within_the_margin_of_the_fastest_replaces_it_without_a_ground_per_change():
    """0.1% slower in three pairs that agree to 0.03%: the upper bound sits under 1 + the margin."""
    assert _choice([0.15015, 0.15012, 0.15018], _evidence(UNCERTAIN, 0.97, 1.05)) == "finalist 1 less noop"


def test_a_change_that_pays_by_prediction_is_never_dropped():
    assert _choice(UNSURE, _evidence(PAYS, 1.02, 1.08)) == "finalist 1"


def _measured(without_s: list[float], with_s: list[float], *, paid: bool = False, inert: bool = False):
    """The leader's noop change measured by its leave-one-out arm, round by round."""
    change = ChangeEvidence(knob="noop", baseline_value="a", value="b", call=UNCERTAIN)
    arm = Arm(key="finalist 1 less noop", kind=LEAVE_ONE_OUT, config=BASE, source_trial_id="t0009", max_pairs=2,
              parent="finalist 1", reverts=("noop",))
    plan = VerificationPlan(arms=(arm,), changes={}, margin=MARGIN)
    return _evidence_of(change, plan, _rounds(with_s, without_s), paid, inert, MARGIN, None, True)


# Two quiet pairs of a sleep job (a suite run's noop campaign): the config without the change
# 4-5 us slower in both, so the interval of its 0.003% gain lies above 1, and below 1 + the margin.
WITH_S, WITHOUT_S = [0.15022430200042436, 0.15024060850009846], [0.15022844550003356, 0.15024597400042694]


def test_a_gain_shown_within_the_margin_keeps_no_change():
    inert = _measured(WITHOUT_S, WITH_S, inert=True)
    assert inert.contribution.ci_low > 1 and inert.contribution.ci_high < 1 + MARGIN
    assert inert.drop == "inert" and not inert.measured_pays
    assert _measured(WITHOUT_S, WITH_S).drop == "equivalent (measured)"
    # a change measured to pay past the margin stays, whatever else is known of it
    pays = _measured([0.1575, 0.1576], [0.15, 0.15], inert=True)
    assert pays.drop is None and pays.measured_pays and pays.keep == "pays (measured)"
    # one the user carries at a cost must clear 1 + the margin: 1.3%, sure above 1 but not
    # above 1.01, is not enough; a change without that cost is kept on it
    paid = _measured([0.151811, 0.152115], [0.15, 0.15], paid=True)
    assert 1 < paid.contribution.ci_low < 1 + MARGIN < paid.contribution.ci_high
    assert paid.drop == "not shown to pay" and not paid.measured_pays
    assert _measured([0.151811, 0.152115], [0.15, 0.15]).measured_pays


def _fastest(smaller_s: list[float], predicted_gain: float | None) -> tuple[str, str]:
    """The fastest cleared arm minimization sees when the arm without the change ran
    ``smaller_s`` beside the leader's three runs of 0.15 s, and the time model, from the runs
    before verification, predicted its gain over the leader (log scale, sd 1%)."""
    leader_arm = Arm(key="finalist 1", kind=FINALIST, config={"sleep": 0.15, "noop": "b"}, source_trial_id="t0009",
                     max_pairs=3)
    smaller_arm = Arm(key="finalist 1 less noop", kind=LEAVE_ONE_OUT, config=BASE, source_trial_id="t0009",
                      max_pairs=3, parent="finalist 1", reverts=("noop",), predicted_gain=predicted_gain,
                      predicted_sd=None if predicted_gain is None else 0.01)
    plan = VerificationPlan(arms=(leader_arm, smaller_arm), changes={}, margin=MARGIN)
    leader = _cleared("finalist 1", dict(leader_arm.config), 2.0)
    smaller = _cleared("finalist 1 less noop", dict(BASE), 2.02)
    report = VerificationReport(verdicts=(leader, smaller), margin=MARGIN, plan=plan)
    best, _, why = _choose(report, _rounds([0.15] * 3, smaller_s), BASE, _evidence(UNCERTAIN, 0.9, 1.1),
                           promotable(report.verdicts, set()), MARGIN, None)
    return best.arm, why


def test_the_fastest_arm_weighs_the_pairs_with_the_model():
    """Three pairs spread 2% put the arm without the change 1% ahead; the model, from every
    search run near both, puts it 3% behind, surely: a few noisy pairs alone would crown it."""
    noisy = [0.1455, 0.1515, 0.1485]
    assert _fastest(noisy, None)[0] == "finalist 1 less noop"
    arm, why = _fastest(noisy, -0.03)
    assert arm == "finalist 1" and "the pairs alone put finalist 1 less noop first" in why, why
    # pairs that agree to 0.03% outweigh the model
    assert _fastest([0.1485, 0.14855, 0.14845], -0.03)[0] == "finalist 1 less noop"


def test_a_change_only_arms_that_did_not_clear_carried_is_dropped_on_that_ground():
    # the leader (with noop) did not clear, its leave-one-out arm did and is promoted: the
    # change goes because no arm with it cleared, not because a faster arm left it out
    evidence = _evidence(UNCERTAIN, 0.97, 1.05)[("noop", "b")]
    smaller = _cleared("finalist 1 less noop", {"sleep": 0.15, "noop": "a"}, 1.99)
    [alone] = _contributions([evidence], smaller, smaller, [smaller.config])
    assert not alone.kept and alone.ground == Ground.NOT_CLEARED
    [beside] = _contributions([evidence], smaller, smaller, [smaller.config, {"sleep": 0.15, "noop": "b"}])
    assert not beside.kept and beside.ground == Ground.FASTEST_WITHOUT


def test_an_arm_with_a_patch_that_broke_the_contract_is_neither_promoted_nor_counted_as_cleared():
    # the leader carries noop and a patch that broke the loss contract in another config's
    # run: it cleared, but is never promoted, so noop, which only it carried, goes because
    # no promotable arm with it cleared, not because a faster arm left it out
    leader = _cleared("finalist 1", {"sleep": 0.15, "noop": "b", "patch_fused": True}, 2.2)
    smaller = _cleared("finalist 1 less noop", {"sleep": 0.15, "noop": "a", "patch_fused": False}, 1.99)
    report = VerificationReport(verdicts=(leader, smaller), margin=MARGIN)
    evidence = _evidence(UNCERTAIN, 0.97, 1.05)
    assert promotable(report.verdicts, set()) == [leader, smaller]
    assert promotable(report.verdicts, {"patch_fused"}) == [smaller]
    best, chosen, _ = _choose(report, _rounds([0.15] * 3, [0.15] * 3), BASE, evidence,
                              promotable(report.verdicts, {"patch_fused"}), MARGIN, None)
    assert best is smaller and chosen is smaller
    [noop] = _contributions([evidence[("noop", "b")]], chosen, best,
                            [v.config for v in promotable(report.verdicts, {"patch_fused"})])
    assert not noop.kept and noop.ground == Ground.NOT_CLEARED
