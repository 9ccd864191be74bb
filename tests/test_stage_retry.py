"""A Prefect stage task retried for a real infrastructure fault: the job of one search
trial SIGKILLs the Ray actor that runs it, on the pool's own retry too, so the pool
raises ``TrialInfrastructureError``; the search task drops the pool, Prefect retries it
on fresh trial slots, and the search resumes from the ledger. The campaign finishes with
every trial recorded before the fault kept as it was and none run twice."""

import json

import pytest
from helpers.resume_spec import SPEC
from mlflow import MlflowClient
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

from infrarsi.core.ledger import Ledger
from infrarsi.core.options import CampaignOptions

# Doctor runs t0001-t0003 (three repeats, no calibration; measured afresh, not from the
# cache an earlier run of this test filled): the second search trial.
KILLED = "t0005"
RETRY_SPEC = SPEC.replace('"--seed", "{seed}"]', f'"--seed", "{{seed}}", "--kill-actor-in", "{KILLED}"]')


@pytest.mark.fault
def test_a_search_that_loses_its_actor_twice_is_retried_on_a_fresh_pool(tmp_path, ray_session, prefect_harness):
    from flows.campaign import campaign

    assert f'"--kill-actor-in", "{KILLED}"' in RETRY_SPEC
    spec = tmp_path / "retry.toml"
    spec.write_text(RETRY_SPEC)
    state = campaign(CampaignOptions(spec=str(spec), out=str(tmp_path / "out"), campaign_id="c1", budget=4,
                                     proposer="random", concurrency=1, bank="off", fresh_doctor=True,
                                     tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}"), return_state=True)
    summary = state.result()
    with get_client(sync_client=True) as client:
        runs = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[
            state.state_details.flow_run_id])))
    by_name = {r.name.rsplit("-", 1)[0]: r for r in runs}
    assert by_name["search"].run_count == 2 and by_name["search"].state.is_completed()
    assert by_name["doctor"].run_count == 1 and by_name["verify"].run_count == 1

    cdir = tmp_path / "out" / "c1"
    events = [json.loads(line) for line in (cdir / "ledger.jsonl").read_text().splitlines()]
    fault = next(i for i, e in enumerate(events) if e["kind"] == "infrastructure_fault")
    assert KILLED in events[fault]["error"] and "lost its Ray actor 2 times" in events[fault]["error"]
    before = [e for e in events[:fault] if e["kind"] == "trial"]
    # Before the fault: doctor's three runs, the first search trial, and the killed trial's
    # first attempt (superseded: the pool retried it once, and lost that actor too).
    assert [(e["trial_id"], e["role"], e["attempt"]) for e in before] == [
        ("t0001", "doctor", 1), ("t0002", "doctor", 1), ("t0003", "doctor", 1), ("t0004", "search", 1),
        (KILLED, "search", 1)]
    assert before[-1]["extra"]["actor_died"] and before[-1]["extra"]["retried"]
    trials = Ledger(cdir / "ledger.jsonl").trials()
    assert len({(t.trial_id, t.attempt) for t in trials}) == len(trials)  # no attempt recorded twice
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()],
                              "tags.`infrarsi.kind` = 'trial'")
    assert sorted((r.data.tags["infrarsi.trial_id"], int(r.data.tags["infrarsi.attempt"])) for r in runs) == sorted(
        (t.trial_id, t.attempt) for t in trials)
    # After it: nothing recorded again, the killed trial never resumed under its own id,
    # and the search ran its four trials, no config twice.
    final = [t for t in trials if not t.extra.get("retried")]
    assert len({t.trial_id for t in final}) == len(final) == summary["num_trials"]
    assert KILLED not in {t.trial_id for t in final} and [t.trial_id for t in trials].count(KILLED) == 1
    search = [t for t in final if t.role.value == "search"]
    assert len(search) == 4 == summary["num_search_trials"]
    assert len({tuple(sorted(t.config.items())) for t in search}) == 4
    assert sum(summary["trials_by_outcome"].values()) == summary["num_trials"]
    assert any("lost its Ray actor" in w for w in summary["warnings"])
