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
