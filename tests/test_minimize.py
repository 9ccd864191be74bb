"""Promote only what pays, counted the way the user pays: real processes of the fake
workload (tests/fake_workload.py) on real Ray, through doctor, a search trial of the
winner, the evidence plan, verification and minimization. Step times are sleeps (0.3 s,
halved by the fast knob), long enough that a loaded machine does not blur a 2x difference."""

from pathlib import Path

import pytest
from helpers.fake_spec import fake_spec

from infrarsi.bank.campaign import campaign_record
from infrarsi.contract.checks import enforce
from infrarsi.core.trial import Outcome, Role
from infrarsi.record.campaign import read_minimize
from infrarsi.stages.apply import commit_message
from infrarsi.stages.doctor import run_doctor
from infrarsi.stages.init import init_campaign
from infrarsi.stages.report.report import render_markdown
from infrarsi.stages.report.summary import summarize
from infrarsi.stages.run.evidence import plan_verification
from infrarsi.stages.run.minimize import MinimizeReport, run_minimize
from infrarsi.stages.run.search import contract_seed_history
from infrarsi.stages.run.verify import VerificationReport, run_verification
from infrarsi.stages.runtime import CampaignRuntime, RuntimeSettings


def _campaign(tmp: Path, spec: Path, winner: dict, after_doctor=None):
    """doctor -> a search trial of ``winner`` -> the evidence plan -> verification ->
    minimization; the runtime and its reports. ``after_doctor(rt)`` runs between doctor
    and the search trial (e.g. to grow the space)."""
    contract, cdir = init_campaign(spec, tmp / "out")
    rt = CampaignRuntime(contract, cdir, RuntimeSettings())
    try:
        doctor = run_doctor(rt)
        if after_doctor:
            after_doctor(rt)
        rt.run_one(winner, Role.SEARCH, check=lambda r: enforce(r, rt.spec.contract, doctor.loss_reference))
        plan = plan_verification(rt, doctor, contract_seed_history(rt, doctor))
        verification = run_verification(rt, doctor, plan)
        final = run_minimize(rt, doctor, verification)
    finally:
        rt.close()
    return rt, doctor, verification, final


@pytest.fixture(scope="module")
def noop_campaign(tmp_path_factory, ray_session):
    tmp = tmp_path_factory.mktemp("noop")
    spec = fake_spec(tmp, knobs={"sleep": [0.3, 0.15], "noop": ["a", "b"]}, baseline={"sleep": 0.3, "noop": "a"},
                 calibration='[{ noop = "b" }]')
    return _campaign(tmp, spec, {"sleep": 0.15, "noop": "b"})


def test_the_no_op_change_is_dropped_and_each_kept_change_has_its_contribution(noop_campaign):
    rt, doctor, verification, final = noop_campaign
    assert final.promoted.config == {"sleep": 0.15, "noop": "a"}
    report = MinimizeReport.from_json(rt.cdir.read_json(rt.cdir.minimize))
    assert report.dropped == ("noop",)
    by_knob = {c.knob: c for c in report.contributions}
    assert by_knob["sleep"].kept and by_knob["sleep"].ground == "pays (predicted)"
    assert by_knob["sleep"].contribution > 1.6 and by_knob["sleep"].ci_low > 1.3
    # The calibration ran noop alone: the same losses as the baseline and its speed: inert, a
    # ground to drop it. The leader less noop (the smaller config) runs beside the leader in
    # rounds whose baseline run serves both, and the rounds do not show it slower.
    assert not by_knob["noop"].kept and by_knob["noop"].ground == "inert"
    assert by_knob["noop"].inert and not by_knob["sleep"].inert
    assert by_knob["sleep"].source == "predicted" and by_knob["noop"].source == "measured"
    minimize_runs = [t for t in rt.ledger.trials() if t.role is Role.MINIMIZE]
    assert {tuple(sorted(t.config.items())) for t in minimize_runs} == {(("noop", "a"), ("sleep", 0.15))}
    assert report.num_trials == len(minimize_runs) <= rt.spec.budget.verify_pairs
    rounds = verification.rounds
    assert all(set(r["runs"]) <= {"finalist 1", "leader less noop"} for r in rounds)
    assert final.promoted.speedup > 1.6 and final.promoted.arm == "leader less noop"
    md = render_markdown(rt.cdir)
    assert "## Promoted changes" in md and "| noop | a -> b | dropped | inert |" in md
    # The experience bank records what minimization left promoted, not verification's winner.
    assert campaign_record(rt.cdir).promoted == {"sleep": 0.15, "noop": "a"}


def test_minimization_resumes_from_the_ledger_without_running_again(noop_campaign):
    rt, doctor, verification, final = noop_campaign
    (rt.cdir.minimize).unlink()
    before = len(rt.ledger.trials())
    rt2 = CampaignRuntime(rt.contract, rt.cdir, RuntimeSettings())
    # as a resumed campaign does: the verdicts read back from verification.json
    reloaded = VerificationReport.from_json(rt.cdir.read_json(rt.cdir.verification))
    try:
        again = run_minimize(rt2, doctor, reloaded)
    finally:
        rt2.close()
    assert len(rt2.ledger.trials()) == before
    assert again.promoted.config == final.promoted.config


def test_a_job_that_ignores_the_seed_gets_no_canary_check(noop_campaign):
    rt, doctor, verification, final = noop_campaign
    assert verification.canary_effective is False and "canary ineffective" in verification.canary_note
    s = summarize(rt.cdir)
    assert s["canary_effective"] is False
    assert "canary ineffective" in render_markdown(rt.cdir)
    message = commit_message(rt.contract, doctor, final, read_minimize(rt.cdir))
    assert "canary ineffective" in message and "canary seeds of the pairs" not in message


def test_doctor_adds_repeats_while_its_noise_estimate_is_weak(noop_campaign):
    rt, doctor, _, _ = noop_campaign
    assert len(doctor.trial_ids) == 5 and not doctor.noise.weak  # the spec asked for 3
    assert doctor.noise_cv >= doctor.noise.within_run_median_cv


# 8 steps, not 10: at 10 compile loses by 0.25 s in 1.75 s, which a loaded machine's start-up
# spread covered once (compile promoted); at 8 it loses by 0.4 s and still beats the baseline.
@pytest.mark.parametrize("job_steps,compile_kept", [(8, False), (1000, True)])
def test_a_compile_like_change_is_promoted_only_when_its_start_up_is_repaid(tmp_path, ray_session, job_steps,
                                                                             compile_kept):
    """compile=on sleeps 1 s at start, then halves every step: at the fast config's 0.15 s it
    saves 0.075 s a step and repays its start-up after about 13 steps, so an 8-step job is
    better off without it (and with it still beats the 0.3 s baseline)."""
    spec = fake_spec(tmp_path, knobs={"sleep": [0.3, 0.15], "compile": ["off", "on"]},
                 baseline={"sleep": 0.3, "compile": "off"}, objective=f"[objective]\njob_steps = {job_steps}",
                 seed_mode="use", minimize_pairs=3, doctor_max_repeats=3)
    rt, doctor, verification, final = _campaign(tmp_path, spec, {"sleep": 0.15, "compile": "on"})
    winner = verification.promoted
    assert winner.step_speedup > 3  # per step, compile on wins either way
    assert winner.job_steps == job_steps
    assert final.promoted.config["compile"] == ("on" if compile_kept else "off")
    assert final.promoted.config["sleep"] == 0.15
    assert verification.canary_effective is True  # this job honours the seed
    assert doctor.noise.weak  # 3 runs allowed, 5 wanted
    trials = rt.ledger.trials()
    compiled = [t for t in trials if t.outcome is Outcome.OK and t.config["compile"] == "on"]
    assert min(t.startup_s for t in compiled) > 0.8
    md = render_markdown(rt.cdir)
    assert "end to end" in md and "start-up" in md and "weak" in md


def test_a_per_step_winner_that_loses_end_to_end_is_not_promoted(tmp_path, ray_session):
    spec = fake_spec(tmp_path, knobs={"compile": ["off", "on"]}, baseline={"compile": "off"},
                 objective="[objective]\njob_steps = 2", minimize_pairs=2, doctor_max_repeats=3)
    rt, _, verification, final = _campaign(tmp_path, spec, {"compile": "on"})
    (verdict,) = verification.verdicts
    assert verdict.step_speedup > 1.5 and verdict.speedup < 1 and not verdict.promoted
    assert "start-up is not repaid" in verdict.reason
    assert final.promoted is None


def test_a_patch_proposed_during_the_run_must_pay_its_way(tmp_path, ray_session):
    """A patch accepted after doctor is a knob doctor's baseline never had; the winner
    carries it. A patch is code the user would carry, so it is promoted only where shown to
    pay: the model never saw it without the sleep change (both arrived in one trial), so the
    smaller config leaves it out, and the leader against the smaller config measures it. This
    patch only adds a comment: it does not pay, and it goes."""
    from infrarsi.patches.patch import Patch, make_diff
    from infrarsi.stages.run.patching import grown

    spec = fake_spec(tmp_path, knobs={"sleep": [0.3, 0.15]}, baseline={"sleep": 0.3}, minimize_pairs=2,
                 doctor_max_repeats=3)

    def propose_patch(rt):
        source = (Path(rt.contract.workdir) / "fake_workload.py").read_text()
        rt.adopt(grown(rt.contract, add=Patch(name="comment", title="a comment", files_touched=("fake_workload.py",),
                                              diff=make_diff("fake_workload.py", source, "# a comment\n" + source))))

    winner = {"sleep": 0.15, "patch_comment": True}
    rt, _, verification, final = _campaign(tmp_path, spec, winner, after_doctor=propose_patch)
    report = MinimizeReport.from_json(rt.cdir.read_json(rt.cdir.minimize))
    by_knob = {c.knob: c for c in report.contributions}
    assert by_knob["patch_comment"].baseline_value is False and not by_knob["patch_comment"].kept
    assert by_knob["patch_comment"].source == "measured"  # the leader against the config without it
    assert by_knob["patch_comment"].ground in ("not shown to pay", "equivalent (measured)", "costs (measured)")
    assert by_knob["sleep"].kept and report.dropped == ("patch_comment",)
    assert final.promoted.config == {"sleep": 0.15, "patch_comment": False}
