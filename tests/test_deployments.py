"""The deployments of prefect.yaml on a real Prefect server: a process work pool, a worker,
runs triggered through the API the way the UI's "Run" button triggers them, on a simulated
workload whose spec the worker clones from a git URL."""

import json
import time
from pathlib import Path

import git
import pytest
from mlflow import MlflowClient
from prefect_server import stop

from infrarsi.core.ledger import Ledger

pytestmark = pytest.mark.slow  # a server, a deploy, a worker and two flow-run processes

SIM_SPEC = ('name = "sim-deploy"\nbackend = "sim"\nsim_workload = "dense-9b-h100"\n'
            '[budget]\nnum_trials = 4\nnum_finalists = 1\nverify_pairs = 2\n[search]\nproposer = "engine"\n')
# A job whose baseline crashes: doctor stops the campaign after its MLflow run exists.
BROKEN_SPEC = """name = "broken"
workload_dir = "."
command = ["{python}", "crash.py", "--x", "{x}"]
baseline = { x = 1 }
[knobs.x]
values = [1, 2]
placeholder = true
[contract]
seq_len = 8
global_batch_tokens = 64
num_steps = 3
warmup_steps = 1
editable = ["crash.py"]
locked = ["broken.toml"]
[device]
memory_capacity = "2GiB"
[resources]
cpus_per_trial = 1
"""
TERMINAL = {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"}


def _spec_repo(tmp: Path) -> str:
    """A git repository holding the spec, as the worker would reach a team's repository."""
    repo = git.Repo.init(tmp / "specs", initial_branch="main")
    (tmp / "specs" / "tune").mkdir()
    (tmp / "specs" / "tune" / "sim.toml").write_text(SIM_SPEC)
    (tmp / "specs" / "tune" / "crash.py").write_text("raise SystemExit('the job is broken')\n")
    (tmp / "specs" / "tune" / "broken.toml").write_text(BROKEN_SPEC)
    repo.index.add(["tune/sim.toml", "tune/crash.py", "tune/broken.toml"])
    repo.index.commit("specs")
    return (tmp / "specs").as_uri()


def _run_like_the_ui(server, deployment_id: str, options: dict):
    """POST /deployments/{id}/create_flow_run, as the UI's custom run form does.

    The server answers 503 for errors it calls retryable (a busy SQLite database while the
    worker polls, on a loaded machine); Prefect's own client retries those, and so does this.
    """
    for attempt in range(4):
        response = server.api("POST", f"/deployments/{deployment_id}/create_flow_run", json={
            "parameters": {"options": options}, "enforce_parameter_schema": True,
            "state": {"type": "SCHEDULED", "message": "Run from the Prefect UI"}})
        if response.status_code != 503:
            break
        time.sleep(2**attempt)
    return response


def _wait(server, flow_run_id: str, timeout_s: float = 240) -> dict:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        run = server.api("GET", f"/flow_runs/{flow_run_id}").json()
        if run["state_type"] in TERMINAL:
            return run
        time.sleep(1)
    raise AssertionError(f"flow run {flow_run_id} not finished after {timeout_s} s: {run['state_type']}")


@pytest.fixture(scope="module")
def deployed(prefect_server, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("deploy")
    server = prefect_server
    server.env["INFRARSI_DATA_DIR"] = str(tmp / "data")  # the worker's data folder
    server.cli("work-pool", "create", "infrarsi", "--type", "process")
    server.cli("--no-prompt", "deploy", "--all", timeout=180)
    worker = server.start("worker", "start", "--pool", "infrarsi", "--type", "process", log=tmp / "worker.log")
    ids = {d["name"]: d["id"] for d in server.api("POST", "/deployments/filter", json={}).json()}
    try:
        yield server, ids, tmp, _spec_repo(tmp)
    finally:
        stop(worker)


def test_the_deploy_sets_limits_and_leaves_the_schedule_off(deployed):
    server, ids, _, _ = deployed
    assert set(ids) == {"on-demand", "weekly-retune"}
    assert server.api("GET", "/work_pools/infrarsi").json()["concurrency_limit"] == 1
    weekly = server.api("GET", f"/deployments/{ids['weekly-retune']}").json()
    assert weekly["concurrency_limit"] == 1 or weekly["global_concurrency_limit"]["limit"] == 1
    assert [s["active"] for s in weekly["schedules"]] == [False]
    runs = server.api("POST", "/flow_runs/filter", json={"flow_runs": {"deployment_id": {"any_": [ids["weekly-retune"]]}}})
    assert runs.json() == []  # nothing queued by the deploy
    schema = server.api("GET", f"/deployments/{ids['on-demand']}").json()["parameter_openapi_schema"]
    fields = schema["definitions"]["CampaignOptions"]["properties"]
    assert all(f.get("description") for f in fields.values())
    assert fields["proposer"]["anyOf"][0]["enum"] == ["engine", "gp", "greedy", "random", "tpe"]


def test_a_bad_option_is_refused_before_anything_runs(deployed):
    server, ids, tmp, _ = deployed
    response = _run_like_the_ui(server, ids["on-demand"], {"proposer": "bogus", "budget": 3})
    assert response.status_code in (409, 422), response.text
    assert "proposer" in response.text
    assert not (tmp / "data").exists()


def test_a_run_from_the_ui_tunes_a_job_from_a_git_url(deployed):
    server, ids, tmp, specs = deployed
    response = _run_like_the_ui(server, ids["on-demand"], {"spec": f"{specs}#tune/sim.toml", "proposer": "random",
                                                           "budget": 4})
    assert response.status_code == 201, response.text
    run = _wait(server, response.json()["id"])
    assert run["state_type"] == "COMPLETED", (tmp / "worker.log").read_text()[-5000:]
    cdir = tmp / "data" / "campaigns" / run["name"]  # the flow run is named after the campaign
    assert run["name"].startswith("sim-deploy-") and (cdir / "report.html").is_file()
    trials = Ledger(cdir / "ledger.jsonl").trials()
    assert sum(t.role.value == "search" for t in trials) == 4
    summary = json.loads((cdir / "summary.json").read_text())
    assert summary["trials_by_outcome"] and json.loads((cdir / "options.json").read_text())["proposer"] == "random"

    tasks = server.api("POST", "/task_runs/filter",
                       json={"flow_runs": {"id": {"any_": [run["id"]]}}}).json()
    assert {"init", "doctor", "search", "verify", "report", "apply", "publish"} <= {
        t["name"].rsplit("-", 1)[0] for t in tasks}
    assert all(t["state_type"] == "COMPLETED" for t in tasks)
    artifacts = server.api("POST", "/artifacts/filter",
                           json={"artifacts": {"flow_run_id": {"any_": [run["id"]]}}}).json()
    assert {a["type"] for a in artifacts} == {"markdown", "table"}
    assert any("Verified speedup" in a["data"] or "No candidate" in a["data"] for a in artifacts)

    client = MlflowClient(f"sqlite:///{tmp / 'data' / 'mlflow.db'}")
    [parent] = client.search_runs([e.experiment_id for e in client.search_experiments()],
                                  f"tags.`infrarsi.campaign_id` = '{run['name']}' and tags.`infrarsi.kind` = 'campaign'")
    assert parent.info.status == "FINISHED" and parent.data.params["proposer"] == "random"
    assert parent.data.params["num_trials"] == "4" and parent.data.metrics["trials/ok"] > 0


def test_a_failed_run_closes_its_mlflow_run(deployed):
    server, ids, tmp, specs = deployed
    response = _run_like_the_ui(server, ids["on-demand"], {"spec": f"{specs}#tune/broken.toml"})
    run = _wait(server, response.json()["id"])
    assert run["state_type"] == "FAILED"
    client = MlflowClient(f"sqlite:///{tmp / 'data' / 'mlflow.db'}")
    [parent] = client.search_runs([e.experiment_id for e in client.search_experiments()],
                                  f"tags.`infrarsi.campaign_id` = '{run['name']}' and tags.`infrarsi.kind` = 'campaign'")
    assert parent.info.status == "FAILED"
