"""A campaign killed with SIGKILL mid-run is finished by --resume without losing or
re-running a completed trial."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tiny_gpt import oom_capacity, tiny_spec

from infrarsi.core.ledger import Ledger


def _cli(*args, **kw):
    env = {**os.environ, "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "RAY_AUTH_MODE": "disabled"}
    return subprocess.Popen([sys.executable, "-m", "infrarsi.cli", "campaign", *args, "--no-progress", "--json"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True, **kw)


def test_sigkill_then_resume_finishes_without_losing_or_rerunning_trials(tmp_path):
    spec = tiny_spec(tmp_path, capacity_bytes=oom_capacity(), num_trials=6,
                     verify_pairs=2)
    out = tmp_path / "out"
    proc = _cli(str(spec), "--out", str(out))
    deadline = time.time() + 600
    ledger = None
    while time.time() < deadline:
        dirs = list(out.glob("*/ledger.jsonl")) if out.exists() else []
        if dirs and sum(e["role"] == "search" for e in Ledger(dirs[0]).events() if e["kind"] == "trial") >= 2:
            ledger = dirs[0]
            break
        assert proc.poll() is None, proc.stdout.read()
        time.sleep(0.2)
    assert ledger is not None, "the campaign never reached its search stage"
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    before = Ledger(ledger).trials()
    assert not (ledger.parent / "summary.json").exists()

    resumed = _cli("--resume", str(ledger.parent))
    output, _ = resumed.communicate(timeout=900)
    assert resumed.returncode == 0, output
    summary = json.loads(output.strip().splitlines()[-1])
    after = Ledger(ledger).trials()
    assert after[:len(before)] == before  # nothing recorded was lost or rewritten
    # final attempts: a timing taken while another process loaded the machine is re-taken
    search = [t for t in after if t.role.value == "search" and not t.extra.get("retried")]
    assert len(search) == 6 == summary["num_search_trials"]
    keys = [tuple(sorted(t.config.items())) for t in search]
    assert len(set(keys)) == len(keys), "a completed search config was run again"
    assert len({(t.trial_id, t.attempt) for t in after}) == len(after)
    assert Path(summary["report"]).exists()
