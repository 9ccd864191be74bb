"""A campaign SIGKILLed in each stage in turn (doctor, search, verification, apply) and
resumed each time: every completed trial is kept and none is run again; the options given
at the start (proposer, budget, tracking URI) hold on every resume."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers.resume_spec import SPEC
from mlflow import MlflowClient

from infrarsi.core.ledger import Ledger

# Run once, before apply's commit moves the branch: the first time, it holds the commit
# long enough to be killed there.
HOOK = """#!/bin/sh
[ -e "$MARKER" ] && exit 0
touch "$MARKER"
sleep 120
"""


def _start(env, *args):
    return subprocess.Popen([sys.executable, "-m", "infrarsi.cli", "campaign", *args, "--no-progress", "--json"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)


def _kill_when(proc, ready, what: str, timeout_s: float = 240) -> None:
    deadline = time.time() + timeout_s
    while not ready():
        if proc.poll() is not None:
            raise AssertionError(f"the campaign ended before {what}:\n{proc.stdout.read()}")
        assert time.time() < deadline, f"the campaign never reached {what}"
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def _final(cdir: Path, *roles: str) -> list:
    """Final attempts (a contaminated measurement is recorded, then measured again)."""
    return [t for t in Ledger(cdir / "ledger.jsonl").trials() if t.role.value in roles and not t.extra.get("retried")]


def _count(cdir: Path, *roles: str) -> int:
    return len(_final(cdir, *roles))


@pytest.mark.slow
def test_killed_in_every_stage_and_resumed_keeps_every_trial(tmp_path, prefect_server):
    spec = tmp_path / "resume.toml"
    spec.write_text(SPEC)
    store = f"sqlite:///{tmp_path / 'store' / 'mlflow.db'}"
    marker = tmp_path / "apply-reached"
    env = {**prefect_server.env, "PREFECT_HOME": str(tmp_path / "prefect-home"), "MARKER": str(marker),
           "RAY_AUTH_MODE": "disabled"}
    # Options given only at the start; every resume must keep them.
    proc = _start(env, str(spec), "--out", str(tmp_path / "out"), "--campaign-id", "c1", "--proposer", "random",
                  "--budget", "5", "--concurrency", "1", "--tracking-uri", store)
    cdir = tmp_path / "out" / "c1"
    history = []

    def killed(ready, what):
        _kill_when(proc, ready, what)
        history.append((what, Ledger(cdir / "ledger.jsonl").trials()))

    def resume():
        return _start(env, "--resume", str(cdir))

    hooks = lambda: cdir / "repo" / "resume_job" / ".git" / "hooks"  # noqa: E731
    killed(lambda: hooks().is_dir() and _count(cdir, "doctor") >= 1, "doctor")
    assert not (cdir / "doctor.json").exists()
    (hooks() / "post-commit").write_text(HOOK)
    (hooks() / "post-commit").chmod(0o755)

    proc = resume()
    killed(lambda: _count(cdir, "search") >= 2, "search")
    assert not (cdir / "search.json").exists()
    proc = resume()
    killed(lambda: _count(cdir, "verify", "verify_baseline") >= 1, "verification")
    assert not (cdir / "verification.json").exists()
    proc = resume()
    killed(lambda: marker.exists(), "apply")
    assert not (cdir / "apply.json").exists()

    proc = resume()
    output, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, output
    summary = json.loads(output.strip().splitlines()[-1])
    final = Ledger(cdir / "ledger.jsonl").trials()
    for what, before in history:  # nothing recorded was lost or rewritten
        assert final[:len(before)] == before, f"the resume after the kill in {what} changed recorded trials"
    assert len({(t.trial_id, t.attempt) for t in final}) == len(final)
    assert _count(cdir, "doctor") == 3  # the doctor run before the kill counts; none run again
    search = _final(cdir, "search")
    assert len(search) == 5 == summary["num_search_trials"]  # the budget given at the start, not the spec's 24
    assert len({tuple(sorted(t.config.items())) for t in search}) == 5
    # rounds resumed, not restarted: one baseline run per recorded round and one run of the
    # finalist per round it ran (a leave-one-out arm of pad may keep it running to its third)
    rounds = json.loads((cdir / "verification.json").read_text())["rounds"]
    assert 2 <= len(rounds) <= 3 and _count(cdir, "verify_baseline") == len(rounds)
    assert _count(cdir, "verify") == sum("finalist 1" in r["runs"] for r in rounds)
    assert summary["branch"] == "infrarsi/c1" and summary["verified_speedup"] > 1
    assert Path(summary["report"]).exists()

    options = json.loads((cdir / "options.json").read_text())
    assert options == {"proposer": "random", "budget": 5, "concurrency": 1, "tracking_uri": store}
    client = MlflowClient(store)
    [parent] = client.search_runs([e.experiment_id for e in client.search_experiments()],
                                  "tags.`infrarsi.kind` = 'campaign'")
    assert parent.info.status == "FINISHED"
    assert parent.data.params["proposer"] == "random" and parent.data.params["num_trials"] == "5"
