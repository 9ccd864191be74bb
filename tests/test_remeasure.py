"""A timing taken while other processes loaded the machine is recorded, marked as
superseded, and measured again on the same trial id."""

import dataclasses

from tiny_gpt import tiny_spec

from infrarsi.core.trial import Outcome, Role, TrialResult
from infrarsi.stages.init import init_campaign
from infrarsi.stages.runtime import CampaignRuntime, RuntimeSettings


def test_contaminated_ok_trial_is_kept_and_requested_again(tmp_path):
    contract, cdir = init_campaign(tiny_spec(tmp_path, capacity_bytes=2**31, num_trials=2), tmp_path / "out")
    rt = CampaignRuntime(contract, cdir, RuntimeSettings())
    req = rt.request(dict(rt.spec.baseline), Role.SEARCH)
    clean = TrialResult(trial_id=req.trial_id, config=req.config, role=Role.SEARCH, outcome=Outcome.OK,
                        step_time_s=0.1, extra={"foreign_load_cores": 0.1})
    loaded = dataclasses.replace(clean, extra={"foreign_load_cores": 1.3})
    assert not rt.needs_remeasure(clean)
    assert rt.needs_remeasure(loaded)
    flagged, again = rt.remeasure(loaded)
    assert flagged.extra["retried"] and flagged.extra["contaminated"] and "1.30 CPU cores" in flagged.reason
    assert (again.trial_id, again.attempt, again.argv) == (req.trial_id, 2, req.argv)
    last = dataclasses.replace(loaded, attempt=rt.spec.resources.max_remeasures + 1)
    assert not rt.needs_remeasure(last)  # bounded: a busy machine cannot stall the campaign
    assert rt.final(last).extra["contaminated"]  # kept, but flagged for doctor and the report
    assert "contaminated" not in rt.final(clean).extra


def test_a_timing_still_contaminated_is_a_campaign_warning_once(tmp_path):
    contract, cdir = init_campaign(tiny_spec(tmp_path, capacity_bytes=2**31, num_trials=2), tmp_path / "out")
    rt = CampaignRuntime(contract, cdir, RuntimeSettings(tracking_uri="none"))
    last = TrialResult(trial_id="t0001", config=dict(rt.spec.baseline), role=Role.SEARCH, outcome=Outcome.OK,
                       step_time_s=0.1, attempt=rt.spec.resources.max_remeasures + 1,
                       extra={"foreign_load_cores": 1.3})
    rt.final(last)
    rt.final(dataclasses.replace(last, trial_id="t0002"))
    [warning] = cdir.read_warnings()
    assert warning["source"] == "measurement" and "stayed contaminated" in warning["message"]


def test_the_summary_counts_trials_and_the_attempts_beside_them(tmp_path):
    """A re-measured trial and a trial whose Ray actor died once are one trial each; a trial
    cut short by an infrastructure fault (only a superseded attempt) is none."""
    from infrarsi.stages.report.summary import summarize

    contract, cdir = init_campaign(tiny_spec(tmp_path, capacity_bytes=2**31, num_trials=2), tmp_path / "out")
    rt = CampaignRuntime(contract, cdir, RuntimeSettings(tracking_uri="none"))
    config = dict(rt.spec.baseline)

    def attempt(trial_id, n, outcome=Outcome.OK, **extra):
        return TrialResult(trial_id=trial_id, config=config, role=Role.SEARCH, outcome=outcome, step_time_s=0.1,
                           wall_time_s=2.0, attempt=n, extra=extra)

    for r in (attempt("t0001", 1, retried=True, contaminated=True), attempt("t0001", 2),
              attempt("t0002", 1, Outcome.CRASH, actor_died=True, retried=True), attempt("t0002", 2),
              attempt("t0003", 1, Outcome.OOM), attempt("t0004", 1, Outcome.CRASH, actor_died=True, retried=True)):
        rt.record(r)
    s = summarize(cdir)
    assert s["num_trials"] == 3 == sum(s["trials_by_outcome"].values())
    assert s["trials_by_outcome"] == {"ok": 2, "oom": 1}
    assert s["attempts_by_outcome"] == {"crash": 2, "ok": 3, "oom": 1}
    assert s["failed_trial_seconds"] == 6.0  # every failed attempt costs
