"""Tracker against a real SQLite MLflow store: runs, statuses, history, spool and catch-up."""

from __future__ import annotations

import json
import logging
import shutil
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from mlflow import MlflowClient
from mlflow.entities import ViewType
from mlflow.exceptions import MlflowException

from infrarsi.adapters.tracking import Tracker
from infrarsi.core.trial import Outcome, Role, TrialResult

EXPERIMENT = "infrarsi-test"
OOM_TEXT = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"


def ok_trial(trial_id: str = "t0001", attempt: int = 1) -> TrialResult:
    return TrialResult(
        trial_id=trial_id, config={"micro_batch": 4, "compile": True, "zero": "z2"},
        role=Role.SEARCH, outcome=Outcome.OK, step_time_s=0.25,
        step_times_s=(0.3, 0.26, 0.25, 0.24), losses=(10.5, 9.75, 9.0, 8.5),
        peak_memory_bytes=3_000_000_000, tokens_per_step=8192, wall_time_s=12.5,
        device_seconds=12.0, attempt=attempt, patches=("fused_adamw",),
        phases_s={"forward": 0.1},
    )


def oom_trial(trial_id: str = "t0002") -> TrialResult:
    return TrialResult(
        trial_id=trial_id, config={"micro_batch": 32, "compile": False, "zero": "z0"},
        role=Role.SEARCH, outcome=Outcome.OOM, peak_memory_bytes=80_000_000_000,
        memory_capacity_bytes=80_000_000_000, wall_time_s=3.0, device_seconds=3.0,
        reason=OOM_TEXT + " x" * 2000,
    )


def children(client: MlflowClient, parent_id: str) -> list:
    experiment = client.get_experiment_by_name(EXPERIMENT)
    return client.search_runs(
        [experiment.experiment_id], filter_string=f"tags.`mlflow.parentRunId` = '{parent_id}'",
        run_view_type=ViewType.ACTIVE_ONLY)


@pytest.fixture(scope="module")
def empty_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One migrated, empty store per module: migrations cost seconds, a copy does not."""
    db = tmp_path_factory.mktemp("template") / "mlflow.db"
    MlflowClient(tracking_uri=f"sqlite:///{db}").search_experiments()
    return db


@pytest.fixture
def store(tmp_path: Path, empty_db: Path) -> str:
    (tmp_path / "store").mkdir()
    shutil.copy(empty_db, tmp_path / "store" / "mlflow.db")
    return f"sqlite:///{tmp_path / 'store' / 'mlflow.db'}"


def test_campaign_with_ok_and_oom_children(tmp_path: Path, store: str) -> None:
    tracker = Tracker(store, EXPERIMENT, tmp_path / "spool.jsonl")
    parent_id = tracker.start_campaign("c1", {"workload": "gpt-debug"}, {"hardware": "cpu"})
    log_file = tmp_path / "t0002.log"
    log_file.write_text(OOM_TEXT + "\n")
    tracker.log_trial(ok_trial(), None, "c1")
    tracker.log_trial(oom_trial(), log_file, "c1")

    client = MlflowClient(tracking_uri=store)
    parent = client.get_run(parent_id)
    assert parent.data.params == {"workload": "gpt-debug"}
    assert parent.data.tags["hardware"] == "cpu"
    runs = {r.info.run_name: r for r in children(client, parent_id)}
    assert sorted(runs) == ["t0001", "t0002"]

    ok = runs["t0001"]
    assert ok.info.status == "FINISHED"
    assert ok.data.params == {"micro_batch": "4", "compile": "True", "zero": "z2",
                              "infrarsi.role": "search", "infrarsi.attempt": "1",
                              "infrarsi.patches": "fused_adamw"}
    assert ok.data.metrics["step_time_s"] == 0.25
    assert ok.data.metrics["tokens_per_step"] == 8192
    assert ok.data.metrics["phase/forward_s"] == 0.1
    history = client.get_metric_history(ok.info.run_id, "step/loss")
    assert [(m.step, m.value) for m in history] == [(0, 10.5), (1, 9.75), (2, 9.0), (3, 8.5)]
    assert [m.step for m in client.get_metric_history(ok.info.run_id, "step/step_time_s")] == [
        0, 1, 2, 3]

    oom = runs["t0002"]
    assert oom.info.status == "FAILED"
    assert oom.data.tags["infrarsi.outcome"] == "oom"
    assert oom.data.tags["infrarsi.role"] == "search"
    assert oom.data.tags["infrarsi.reason"].startswith(OOM_TEXT)
    assert len(oom.data.tags["infrarsi.reason"]) == 1000
    assert oom.data.metrics["peak_memory_bytes"] == 80e9
    artifacts = {a.path for a in client.list_artifacts(oom.info.run_id)}
    assert artifacts == {"t0002.log", "trial.json"}
    assert (Path(oom.info.artifact_uri.removeprefix("file://")) / "t0002.log").read_text() == (
        OOM_TEXT + "\n")
    assert oom.info.artifact_uri.startswith((tmp_path / "store" / "mlartifacts").as_uri())


def test_relog_and_resume_do_not_duplicate(tmp_path: Path, store: str) -> None:
    tracker = Tracker(store, EXPERIMENT, tmp_path / "spool.jsonl")
    parent_id = tracker.start_campaign("c1", {"seed": 1}, {})
    tracker.log_trial(ok_trial(), None, "c1")
    tracker.log_trial(ok_trial(), None, "c1")

    resumed = Tracker(store, EXPERIMENT, tmp_path / "spool.jsonl")
    assert resumed.start_campaign("c1", {"seed": 1, "resumed": True}, {}) == parent_id
    resumed.log_trial(ok_trial(), None, "c1")
    resumed.log_trial(ok_trial(attempt=2), None, "c1")  # a retry is a new attempt

    client = MlflowClient(tracking_uri=store)
    names = sorted((r.info.run_name, r.data.tags["infrarsi.attempt"])
                   for r in children(client, parent_id))
    assert names == [("t0001", "1"), ("t0001", "2")]
    experiment = client.get_experiment_by_name(EXPERIMENT)
    parents = client.search_runs([experiment.experiment_id], "tags.`infrarsi.kind` = 'campaign'")
    assert [r.info.run_id for r in parents] == [parent_id]
    assert parents[0].data.params == {"seed": "1", "resumed": "True"}


def test_end_campaign_logs_summary_and_report(tmp_path: Path, store: str) -> None:
    tracker = Tracker(store, EXPERIMENT, tmp_path / "spool.jsonl")
    parent_id = tracker.start_campaign("c1", {}, {})
    report = tmp_path / "report.md"
    report.write_text("# speedup 1.8x\n")
    tracker.end_campaign({"speedup": 1.8, "num_trials": 12}, [report], "FINISHED")

    run = MlflowClient(tracking_uri=store).get_run(parent_id)
    assert run.info.status == "FINISHED"
    assert run.data.metrics == {"speedup": 1.8, "num_trials": 12.0}
    assert [a.path for a in MlflowClient(tracking_uri=store).list_artifacts(parent_id)] == [
        "report.md"]


def test_the_experiment_is_tagged_for_the_ui_new_or_existing(tmp_path: Path, store: str) -> None:
    """MLflow 3's UI picks an experiment's view from ``mlflow.experimentKind``: a campaign's
    experiment is a training one, whether the tracker made it or found it untagged."""
    client = MlflowClient(tracking_uri=store)
    Tracker(store, EXPERIMENT, tmp_path / "spool.jsonl")
    assert client.get_experiment_by_name(EXPERIMENT).tags["mlflow.experimentKind"] == "custom_model_development"

    client.create_experiment("made-before-the-tag")
    Tracker(store, "made-before-the-tag", tmp_path / "spool.jsonl").start_campaign("c1", {}, {})
    tags = client.get_experiment_by_name("made-before-the-tag").tags
    assert tags["mlflow.experimentKind"] == "custom_model_development"


@pytest.mark.fault
def test_unreachable_store_spools_then_catches_up(
    tmp_path: Path, empty_db: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # A regular file where the store's directory should be: unreachable, even for root.
    blocker = tmp_path / "store"
    blocker.write_text("")
    store = f"sqlite:///{blocker / 'mlflow.db'}"
    spool = tmp_path / "spool.jsonl"
    with caplog.at_level(logging.WARNING, logger="infrarsi.adapters.tracking"):
        tracker = Tracker(store, EXPERIMENT, spool, retry_interval_s=0)
        assert tracker.start_campaign("c1", {"seed": 1}, {}) is None
        tracker.log_trial(ok_trial(), None, "c1")
        tracker.log_trial(oom_trial(), None, "c1")
    assert len([r for r in caplog.records if "unreachable" in r.message]) == 1
    assert [json.loads(line)["op"] for line in spool.read_text().splitlines()] == [
        "start_campaign", "log_trial", "log_trial"]

    blocker.unlink()  # the store is back
    blocker.mkdir()
    shutil.copy(empty_db, blocker / "mlflow.db")
    tracker.log_trial(ok_trial("t0003"), None, "c1")  # catches up first, then logs
    assert spool.read_text() == ""
    assert tracker.catch_up() == 0

    client = MlflowClient(tracking_uri=store)
    experiment = client.get_experiment_by_name(EXPERIMENT)
    [parent] = client.search_runs([experiment.experiment_id], "tags.`infrarsi.kind` = 'campaign'")
    runs = children(client, parent.info.run_id)
    assert sorted(r.info.run_name for r in runs) == ["t0001", "t0002", "t0003"]
    assert {r.info.run_name: r.info.status for r in runs}["t0002"] == "FAILED"


@pytest.mark.fault
def test_failure_mid_call_is_replaced_not_duplicated(tmp_path: Path, store: str) -> None:
    tracker = Tracker(store, EXPERIMENT, tmp_path / "spool.jsonl", retry_interval_s=0)
    parent_id = tracker.start_campaign("c1", {}, {})
    client = tracker._connect()
    real_set_terminated = client.set_terminated

    def store_gone(*args, **kwargs):
        raise MlflowException("(sqlite3.OperationalError) database is locked")

    client.set_terminated = store_gone  # the run exists, half logged, still RUNNING
    tracker.log_trial(oom_trial(), None, "c1")
    assert tracker.num_spooled == 1
    client.set_terminated = real_set_terminated

    assert tracker.catch_up() == 1
    assert tracker.catch_up() == 0
    [run] = children(MlflowClient(tracking_uri=store), parent_id)
    assert run.info.status == "FAILED"
    assert run.data.tags["infrarsi.outcome"] == "oom"


@pytest.mark.fault
def test_unreachable_server_fails_fast_and_spools(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "2")
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    spool = tmp_path / "spool.jsonl"
    start = time.monotonic()
    tracker = Tracker(f"http://127.0.0.1:{port}", EXPERIMENT, spool, retry_interval_s=60)
    tracker.start_campaign("c1", {}, {})
    for i in range(5):
        tracker.log_trial(ok_trial(f"t{i}"), None, "c1")
    assert time.monotonic() - start < 10
    assert tracker.num_spooled == 6
    records = [json.loads(line) for line in spool.read_text().splitlines()]
    assert [r["result"]["trial_id"] for r in records[1:]] == [f"t{i}" for i in range(5)]
    assert TrialResult.from_json(records[1]["result"]) == ok_trial("t0")


def test_threads_share_one_tracker(tmp_path: Path, store: str) -> None:
    tracker = Tracker(store, EXPERIMENT, tmp_path / "spool.jsonl")
    parent_id = tracker.start_campaign("c1", {}, {})
    with ThreadPoolExecutor(max_workers=4) as pool:
        list(pool.map(lambda i: tracker.log_trial(ok_trial(f"t{i % 6}"), None, "c1"), range(12)))
    runs = children(MlflowClient(tracking_uri=store), parent_id)
    assert sorted(r.info.run_name for r in runs) == [f"t{i}" for i in range(6)]
