"""One trial cap for the whole campaign: every stage keeps within it, and the progress bar's
total is the most trials a campaign can run (real stages on the simulator, without Ray)."""

import json

import pytest

from infrarsi.cli.main import _prepared
from infrarsi.contract.spec_load import load_spec
from infrarsi.core.errors import SpecError
from infrarsi.core.ledger import Ledger
from infrarsi.core.options import CampaignOptions
from infrarsi.core.trial import Outcome, Role, TrialResult
from infrarsi.stages.budget import TrialBudgetExhausted, doctor_trials, stage_of, trial_cap, trials_by_stage
from infrarsi.stages.doctor import run_doctor
from infrarsi.stages.init import builtin_spec_path, init_campaign
from infrarsi.stages.report.summary import summarize
from infrarsi.stages.run.evidence import plan_verification
from infrarsi.stages.run.minimize import run_minimize
from infrarsi.stages.run.reserve import search_trials, verification_reserve
from infrarsi.stages.run.search import run_search
from infrarsi.stages.run.verify import run_verification
from infrarsi.stages.runtime import CampaignRuntime, RuntimeSettings


def test_the_built_in_campaign_plans_each_stage_at_most():
    spec = load_spec(builtin_spec_path())
    # doctor: 5 baseline runs, 3 calibration variants, and for the bf16 class its reference
    # and the two honest splits (micro-batch 4; 2 processes x 1 thread) run in bf16
    assert doctor_trials(spec) == 5 + 3 + 1 * (1 + 2)
    assert verification_reserve(spec) == 2 * (1 + 1 + 1)  # two pairs of the leader, with a bf16 reference
    # the spec caps the campaign at 45: doctor's 10 runs (the bf16 variant is the class's
    # reference) leave the search its 20 trials and verification 15
    assert trial_cap(spec, 20) == 45 and search_trials(spec, 20, doctor_used=10) == 20
    # unset, the cap is the protocol's plan at its longest: 7 rounds of the baseline, the
    # bf16 reference, 2 finalists, a smaller config and a leave-one-out, plus one round of
    # bf16 splits
    spec = spec.model_copy(update={"budget": spec.budget.model_copy(update={"max_trials": None})})
    assert trial_cap(spec, 20) == doctor_trials(spec) + 20 + 7 * (1 + 1 + 2 + 2) + 1 * 2
    assert trial_cap(spec, 4) == trial_cap(spec, 20) - 16


def _sim_spec(tmp_path, budget: str):
    spec = tmp_path / "sim.toml"
    spec.write_text('name = "sim-cap"\nbackend = "sim"\nsim_workload = "dense-9b-h100"\n'
                    f'[budget]\n{budget}\n[search]\nproposer = "random"\n')
    return spec


def test_every_stage_keeps_within_max_trials(tmp_path):
    spec = _sim_spec(tmp_path, "num_trials = 12\nmax_trials = 20")
    contract, cdir = init_campaign(spec, tmp_path / "out")
    rt = CampaignRuntime(contract, cdir, RuntimeSettings(tracking_uri="none", in_process=True, bank="off"))
    try:
        doctor = run_doctor(rt)
        search = run_search(rt, doctor, proposer_name="random", num_trials=12)
        plan = plan_verification(rt, doctor, search.history, search.priors)
        verification = run_verification(rt, doctor, plan)
        run_minimize(rt, doctor, verification)
        with pytest.raises(TrialBudgetExhausted, match="budget.max_trials = 20"):
            rt.request(doctor.baseline, Role.SEARCH)
    finally:
        rt.close()
    trials = Ledger(cdir.ledger).trials()
    used = trials_by_stage(trials)
    # doctor 5; the search leaves verification its reserve (two pairs of the leader: 4)
    assert used["doctor"] == 5 and used["search"] == search_trials(rt.spec, 12, 5) == 20 - 5 - 4
    assert len({t.trial_id for t in trials}) == sum(used.values()) == 20
    # what was left fitted two rounds of the baseline and the leader; the other arms stayed out
    assert [set(r["runs"]) for r in verification.rounds] == [{"finalist 1"}] * 2
    assert all("trial cap" in v.reason or v.arm == "finalist 1" for v in verification.verdicts)


def test_a_cap_that_leaves_no_search_trial_is_refused_before_anything_runs(tmp_path):
    with pytest.raises(SpecError, match="budget.max_trials = 8 leaves no search trial: doctor runs up to 5"):
        init_campaign(_sim_spec(tmp_path, "num_trials = 12\nmax_trials = 8"), tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_the_runtime_the_progress_bar_and_the_report_take_the_budget_the_campaign_remembers(tmp_path):
    contract, cdir = init_campaign(_sim_spec(tmp_path, "num_trials = 12"), tmp_path / "out",
                                   options=CampaignOptions(budget=5))
    cap = trial_cap(contract.spec, 5)
    assert cap < trial_cap(contract.spec, 12)  # no max_trials: the cap follows the search budget
    rt = CampaignRuntime(contract, cdir, RuntimeSettings(tracking_uri="none", in_process=True, bank="off"))
    rt.close()
    assert rt.max_trials == cap and summarize(cdir)["max_trials"] == cap
    assert _prepared(CampaignOptions(resume=str(cdir.root)))[1:] == (cap, 0)
    # a budget given again on resume wins over the remembered one
    assert _prepared(CampaignOptions(resume=str(cdir.root), budget=8))[1:] == (trial_cap(contract.spec, 8), 0)


def test_a_ledger_from_before_minimization_stopped_measuring_baselines_still_reads(tmp_path):
    """Older ledgers name the baseline half of minimization's rounds "minimize_baseline": the
    report and a resume must still read them, as minimization runs."""

    result = TrialResult(trial_id="t1", role=Role.MINIMIZE, config={}, outcome=Outcome.OK, step_time_s=0.1)
    old = {**result.to_json(), "role": "minimize_baseline"}
    (tmp_path / "ledger.jsonl").write_text(json.dumps({"kind": "trial", **old}) + "\n")
    [read] = Ledger(tmp_path / "ledger.jsonl").trials()
    assert read.role is Role.MINIMIZE and stage_of(read.role, 1) == "minimization"
    with pytest.raises(ValueError):
        Role("no_such_role")
