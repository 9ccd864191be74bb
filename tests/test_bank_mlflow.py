"""The experience bank in a real MLflow tracking store: a SQLite-backed tracking URI, and a
real ``mlflow server`` on loopback. A campaign written by one process is the nearest
experience another process reads; ``forget`` removes it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import requests
from prefect_server import free_port, stop

from infrarsi.bank.records import CampaignRecord
from infrarsi.bank.sqlite import Bank
from infrarsi.bank.store import open_bank
from infrarsi.cli.main import main
from infrarsi.core.trial import Outcome, Role, TrialResult

REPO = Path(__file__).resolve().parents[1]
H100 = {"gpu": "h100-sxm-80gb", "num_devices": 8, "memory_bytes": 80 * 2**30, "cpu": None}
A100 = {**H100, "gpu": "a100-80gb"}
DENSE = {"num_params": 9e9, "num_layers": 32, "seq_len": 4096, "moe": False, "tokens_per_step": 262144}
BASE = {"tp": 1, "dp": 4}

# Another process: the nearest past campaigns for an H100 dense job, as the search stage reads them.
READER = textwrap.dedent("""
    import json, sys
    from infrarsi.bank.similarity import nearest_records
    from infrarsi.bank.store import open_bank
    store = open_bank(sys.argv[1])
    hw, wl = json.loads(sys.argv[2]), json.loads(sys.argv[3])
    past = nearest_records(store, hardware=hw, workload=wl)
    print(json.dumps([{"id": r.id, "best": r.best.config, "effects": list(r.effects)} for r in past]))
""")


def env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p),
            "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0"}


def record(cid: str, hw: dict, best_tp: int, effect: float) -> CampaignRecord:
    trials = (TrialResult(trial_id="t1", config={"tp": best_tp, "dp": 4 // best_tp}, role=Role.SEARCH,
                          outcome=Outcome.OK, step_time_s=0.5, peak_memory_bytes=1001, reason=""),
              TrialResult(trial_id="t2", config={"tp": 4, "dp": 1}, role=Role.SEARCH, outcome=Outcome.OOM,
                          peak_memory_bytes=2**40, reason="boom"))
    return CampaignRecord(id=cid, name=cid, backend="sim", proposer="engine", hardware=hw, workload=DENSE,
                          baseline=BASE, baseline_step_time_s=2.0, trials=trials,
                          effects=({"knob": "tp", "value": 2, "log_time_effect": effect, "log_time_sd": 0.1,
                                    "log_memory_effect": -0.3, "log_memory_sd": 0.1},),
                          patches=({"name": "p", "source": "builtin", "accepted": True, "reason": None,
                                    "log_time_effect": -0.03, "patch": {"name": "p"}},),
                          promoted={"tp": best_tp, "dp": 4 // best_tp}, prior_revision=[{"knob": "tp"}])


def read_nearest(setting: str) -> list[dict]:
    out = subprocess.run([sys.executable, "-c", READER, setting, json.dumps(H100), json.dumps(DENSE)],
                         env=env(), cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "infrarsi.cli", "bank", *args], env=env(), cwd=REPO,
                          capture_output=True, text=True, timeout=120)


def write_read_forget(setting: str, tmp_path: Path) -> None:
    """Written here, read as the nearest experience and forgotten by other processes."""
    store = open_bank(setting)
    assert store.location == setting
    near, far = record("near", H100, 2, -0.4), record("far", A100, 1, -1.0)
    store.add(far)
    store.add(near)
    store.add(near)  # recorded again (a resumed campaign): replaced, not doubled
    rows = store.list()
    assert [r["id"] for r in rows] == ["near", "far"]  # newest first
    assert rows[0]["hardware"] == H100 and rows[0]["workload"] == DENSE
    assert rows[0]["num_trials"] == 2 and rows[0]["best_step_time_s"] == 0.5 and rows[0]["baseline_step_time_s"] == 2.0
    # the same record as the SQLite store gives back
    sqlite = Bank(tmp_path / "bank.sqlite")
    sqlite.add(near)
    assert store.get("near") == sqlite.get("near")

    found = read_nearest(setting)
    assert [f["id"] for f in found] == ["near", "far"]
    assert found[0]["best"] == {"tp": 2, "dp": 2} and found[0]["effects"][0]["log_time_effect"] == -0.4

    out = cli("--path", setting, "forget", "near")
    assert out.returncode == 0 and "forgot near" in out.stdout, out.stderr
    assert [r["id"] for r in store.list()] == ["far"] and store.get("near") is None and not store.forget("near")
    assert [r.id for r in store.records()] == ["far"]


def test_the_bank_in_an_mlflow_sqlite_store(tmp_path, capsys):
    setting = f"mlflow+sqlite:///{tmp_path / 'mlflow.db'}"
    write_read_forget(setting, tmp_path)
    capsys.readouterr()
    assert main(["bank", "--path", setting, "--json", "list"]) == 0
    assert [r["id"] for r in json.loads(capsys.readouterr().out)] == ["far"]
    assert main(["bank", "--path", setting, "show", "far"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["best"]["config"] == {"tp": 1, "dp": 4} and shown["outcomes"] == {"ok": 1, "oom": 1}
    assert main(["bank", "--path", setting, "show", "near"]) == 2 and "no campaign 'near'" in capsys.readouterr().err
    assert (tmp_path / "mlartifacts").is_dir()  # artifacts next to the database, not in the cwd


def test_mlflow_plus_nothing_is_a_clear_error():
    from infrarsi.core.errors import InfrarsiError

    with pytest.raises(InfrarsiError, match="tracking URI"):
        open_bank("mlflow+")


@pytest.fixture
def mlflow_server(tmp_path):
    port = free_port()
    log = tmp_path / "server.log"
    server = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port), "-w", "1",
         "--backend-store-uri", f"sqlite:///{tmp_path / 'server.db'}",
         "--artifacts-destination", str(tmp_path / "server-artifacts")],
        env={**env(), "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}, cwd=tmp_path,
        stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 90
        while True:
            assert server.poll() is None, log.read_text()
            try:
                if requests.get(url + "/health", timeout=2).status_code == 200:
                    break
            except requests.RequestException:
                pass
            assert time.time() < deadline, log.read_text()
            time.sleep(0.3)
        yield url
    finally:
        stop(server)


def test_the_bank_on_an_mlflow_server(mlflow_server, tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    write_read_forget(f"mlflow+{mlflow_server}", tmp_path)
    assert any((tmp_path / "server-artifacts").rglob("bank_record.json"))  # the server kept the artifact
