"""Every outside system's failure, given on purpose: one clear paragraph, early, and exit
status 2; or, where the campaign can run without the system, a warning on the console
and in the report. The rows of issue 35's table and the test that covers each:

- an unreachable MLflow tracking server: test_an_unreachable_tracking_server_is_asked_once_then_spooled,
  test_a_degraded_campaign_finishes_and_says_why (console and report)
- infrarsi compare against it: test_compare_against_a_server_that_does_not_answer
- infrarsi report on a folder that is not a campaign: test_report_on_a_folder_that_is_not_a_campaign
- a wrong --ray-address: test_a_ray_address_nothing_answers_at_stops_the_campaign_at_start,
  test_a_cluster_without_token_auth_is_joined_as_ray_joins_it
- an LLM's 200 that is not a chat completion: test_llm_adapter.py::test_a_200_that_is_not_a_chat_completion_falls_back
- an LLM answer malformed, refused or 5xx: test_an_llm_fallback_is_a_campaign_warning,
  test_a_degraded_campaign_finishes_and_says_why
- the bank unreachable when the campaign ends: test_a_bank_that_fails_at_the_end_keeps_the_record_for_the_next,
  test_a_degraded_campaign_finishes_and_says_why
- --budget beyond budget.max_trials: test_a_degraded_campaign_finishes_and_says_why
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import psutil
import pytest
from dead_ends import closed_port, hang_up_server

from infrarsi.adapters.tracking import Tracker
from infrarsi.bank.store import open_bank
from infrarsi.cli.main import main
from infrarsi.core import progress
from infrarsi.core.errors import InfrarsiError
from infrarsi.core.workspace import CampaignDir
from infrarsi.stages.init import init_campaign
from infrarsi.stages.report.summary import summarize
from infrarsi.stages.runtime import CampaignRuntime, RuntimeSettings
from tests.llm_server import Reply, running_server

# What this change adds is imported in the tests that use it, so that on the code before
# it each test fails on its own row, not the whole module on an import.

pytestmark = pytest.mark.fault


def sim_spec(tmp_path: Path, *, extra: str = "", name: str = "sim-faults") -> Path:
    spec = tmp_path / f"{name}.toml"
    spec.write_text(f'name = "{name}"\nbackend = "sim"\nsim_workload = "moe-26b-a4b-h200"\n'
                    '[budget]\nnum_trials = 12\n[search]\nproposer = "engine"\npatch_rounds = 0\n' + extra)
    return spec


def llm_section(server, **kw) -> str:
    fields = {"base_url": server.base_url, "model": "test-model", "max_retries": 0, "timeout_s": 5, **kw}
    return "[llm]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in fields.items())


def error_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("infrarsi: error: "), err  # one paragraph, no traceback
    return lines[0]


def test_an_unreachable_tracking_server_is_asked_once_then_spooled(tmp_path, monkeypatch):
    # The user's environment: MLflow's own defaults (seven retries, minutes per call).
    monkeypatch.delenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", raising=False)
    monkeypatch.delenv("MLFLOW_HTTP_REQUEST_TIMEOUT", raising=False)
    warnings: list[str] = []
    with hang_up_server() as server:
        tracker = Tracker(server.url, "infrarsi-test", tmp_path / "spool.jsonl", on_warning=warnings.append)
        tracker.start_campaign("c1", {"budget": 4}, {})
        tracker.log_params({"num_trials": 4})
        assert server.connections == 1  # the probe; nothing more until retry_interval_s has passed
    assert tracker.num_spooled == 2
    [warning] = warnings
    assert warning.startswith(f"MLflow at {server.url} is unreachable") and "spooled to" in warning


def test_compare_against_a_server_that_does_not_answer(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", raising=False)
    refused = f"http://127.0.0.1:{closed_port()}"
    assert main(["compare", "--tracking-uri", refused, "--plot", str(tmp_path / "c.png")]) == 2
    line = error_line(capsys.readouterr().err)
    assert f"no MLflow tracking server answers at {refused}" in line and "--tracking-uri" in line
    with hang_up_server() as server:
        assert main(["compare", "--tracking-uri", server.url, "--plot", str(tmp_path / "c.png")]) == 2
        assert server.connections == 1
    assert server.url in error_line(capsys.readouterr().err)


@pytest.mark.parametrize("folder", ["empty", "missing", "a-file"])
def test_report_on_a_folder_that_is_not_a_campaign(tmp_path, capsys, folder):
    path = tmp_path / folder
    if folder == "empty":
        path.mkdir()
    elif folder == "a-file":
        path.write_text("not a campaign\n")
    assert main(["report", str(path), "--json"]) == 2
    line = error_line(capsys.readouterr().err)
    assert str(path) in line
    assert ("does not exist" if folder == "missing" else "is not a campaign folder") in line


def test_bank_commands_on_a_bank_that_does_not_answer(capsys):
    bank = f"mlflow+http://127.0.0.1:{closed_port()}"
    for command in (["list", "--json"], ["show", "c1"], ["forget", "c1"]):
        assert main(["bank", "--path", bank, *command]) == 2
        line = error_line(capsys.readouterr().err)
        assert f"experience bank {bank}" in line and "--bank" in line


@pytest.mark.parametrize("argv,says", [
    (["campaign", "{tmp}/nope.toml"], "no such spec file"),
    (["campaign", "--resume", "{tmp}"], "it is not a campaign folder"),
    (["campaign", "--out", "{tmp}/a-file/out"], "Not a directory"),
    (["bank", "--path", "{tmp}", "list"], "experience bank {tmp}"),
    (["init", "-o", "{tmp}/c.toml", "--no-dry-run", "--", "python", "{tmp}/nope.py"], "not found"),
], ids=["spec_missing", "resume_not_a_campaign", "out_under_a_file", "bank_path_a_folder", "init_script_missing"])
def test_a_bad_folder_or_file_is_one_error_line(tmp_path, capsys, argv, says):
    (tmp_path / "a-file").write_text("")
    assert main([a.format(tmp=tmp_path) for a in argv]) == 2
    assert says.format(tmp=tmp_path) in error_line(capsys.readouterr().err)


def test_bank_list_takes_json_after_the_subcommand_too(tmp_path, capsys):
    path = str(tmp_path / "bank.sqlite")
    for argv in (["bank", "--path", path, "list", "--json"], ["bank", "--path", path, "--json", "list"]):
        assert main(argv) == 0
        assert json.loads(capsys.readouterr().out) == []


def test_a_ray_address_nothing_answers_at_stops_the_campaign_at_start(tmp_path, capsys, prefect_harness):
    address = f"127.0.0.1:{closed_port()}"
    argv = ["campaign", str(sim_spec(tmp_path)), "--out", str(tmp_path / "out"), "--campaign-id", "c1", "--no-progress"]
    assert main([*argv, "--ray-address", address]) == 2
    line = error_line(capsys.readouterr().err)
    assert f"no Ray cluster answers at {address}" in line and "--ray-address" in line
    assert not (tmp_path / "out" / "c1" / "contract.json").exists()  # stopped before init made the campaign
    assert main([*argv, "--ray-address", "no-port-here"]) == 2
    assert "expected host:port" in error_line(capsys.readouterr().err)


def test_a_bank_that_does_not_answer_at_start_stops_the_campaign(tmp_path, capsys, prefect_harness):
    bank = f"mlflow+http://127.0.0.1:{closed_port()}"
    assert main(["campaign", str(sim_spec(tmp_path)), "--out", str(tmp_path / "out"), "--campaign-id", "c1",
                 "--no-progress", "--bank", bank]) == 2
    line = error_line(capsys.readouterr().err)
    assert f"experience bank {bank}" in line and "--bank" in line
    assert not (tmp_path / "out" / "c1" / "contract.json").exists()


def test_a_cluster_without_token_auth_is_joined_as_ray_joins_it(tmp_path):
    """A cluster started without token auth, joined by a driver whose environment says
    nothing about auth (a user's shell): Ray's own default for an explicit address."""
    import ray.util

    port = closed_port()
    address = f"{ray.util.get_node_ip_address()}:{port}"  # where a head listens (its node's address)
    # A user's shell: no RAY_* setting, no token file (~/.ray/auth_token) in its home.
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("RAY_")}, "HOME": str(tmp_path)}
    # Ray's socket paths must stay short (108 bytes): its folder cannot live in tmp_path.
    ray_dir = tempfile.mkdtemp(prefix="ray-", dir="/tmp")
    log = (tmp_path / "head.log").open("w")
    head = subprocess.Popen([sys.executable, "-m", "ray.scripts.scripts", "start", "--head", "--block",
                             f"--port={port}", "--num-cpus=1", "--include-dashboard=false", f"--temp-dir={ray_dir}"],
                            env={**env, "RAY_AUTH_MODE": "disabled"}, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        driver = ("import sys; from infrarsi.adapters.ray_pool import ensure_ray, probe_ray_address\n"
                  "import time\n"
                  "for _ in range(600):\n"
                  "    try:\n        probe_ray_address(sys.argv[1], 1.0); break\n"
                  "    except Exception:\n        time.sleep(0.1)\n"
                  "print('CPUS', ensure_ray(sys.argv[1]).cluster_resources().get('CPU'))\n")
        out = subprocess.run([sys.executable, "-c", driver, address], env=env, capture_output=True,
                             text=True, timeout=240)
        assert out.returncode == 0, out.stderr[-2000:] + (tmp_path / "head.log").read_text()[-2000:]
        assert "CPUS 1.0" in out.stdout
    finally:
        os.killpg(head.pid, signal.SIGKILL)  # the head's processes share its session
        head.wait()
        log.close()
        # a zombie has ended (the head, killed too, never reaped it): only live processes count
        left = [p for p in psutil.process_iter(["cmdline", "status"])
                if ray_dir in " ".join(p.info["cmdline"] or ()) and p.info["status"] != psutil.STATUS_ZOMBIE]
        shutil.rmtree(ray_dir, ignore_errors=True)
    assert left == []


@pytest.mark.parametrize("reply", [Reply.error(500), Reply.refused("no."), Reply.text("{not json")],
                         ids=["5xx", "refused", "malformed"])
def test_an_llm_fallback_is_a_campaign_warning(tmp_path, reply):
    from infrarsi.stages.run.search import search_priors

    with running_server() as server:
        server.reply = reply
        contract, cdir = init_campaign(sim_spec(tmp_path, extra=llm_section(server)), tmp_path / "out")
        rt = CampaignRuntime(contract, cdir, RuntimeSettings(tracking_uri="none"))
        heard: list[tuple[str, str]] = []
        subscribe = getattr(progress, "subscribe_warnings", None)  # absent before this change: nothing heard
        stop = subscribe(lambda source, message: heard.append((source, message))) if subscribe else (lambda: None)
        try:
            priors = search_priors(rt)
        finally:
            stop()
    assert priors.source == "builtin"
    assert summarize(cdir)["warnings"] == [m for _, m in heard]  # what the report carries, as the console heard it
    [(source, message)] = heard
    assert source == "llm" and "using the builtin priors instead" in message


def test_a_bank_that_fails_at_the_end_keeps_the_record_for_the_next(tmp_path, monkeypatch):
    from infrarsi.bank.pending import deliver, pending_path, record_or_hold
    from infrarsi.contract.spec_load import load_spec
    from infrarsi.stages.probes import probe_outside_systems

    monkeypatch.setenv("INFRARSI_DATA_DIR", str(tmp_path / "data"))
    _, cdir = init_campaign(sim_spec(tmp_path), tmp_path / "out", campaign_id="c1")
    bank_dir = tmp_path / "share"
    bank = str(bank_dir / "bank.sqlite")
    bank_dir.write_text("")  # the share is gone: a file where its folder was
    assert record_or_hold(bank, cdir) is None
    [warning] = [w for w in cdir.read_warnings() if w["source"] == "bank"]
    assert f"experience bank {bank}" in warning["message"] and str(pending_path()) in warning["message"]
    [entry] = [json.loads(line) for line in pending_path().read_text().splitlines()]
    assert entry["bank"] == bank and entry["record"]["id"] == "c1"

    bank_dir.unlink()  # the share is back; the next campaign's start delivers the record
    bank_dir.mkdir()
    assert probe_outside_systems(load_spec(sim_spec(tmp_path)), {"bank": bank}) == []
    assert open_bank(bank).get("c1") is not None
    assert pending_path().read_text() == "" and deliver(open_bank(bank)) == []


def test_a_degraded_campaign_finishes_and_says_why(tmp_path, capsys, monkeypatch, ray_session, prefect_harness):
    """MLflow down from the start, the LLM answering 500, --budget beyond the cap, and the
    bank's folder gone when the campaign ends (removed by a git hook when apply commits):
    the campaign finishes, exit 0, the summary and branch printed, each problem said once
    on the console and carried in the summary the report shows."""
    monkeypatch.setenv("INFRARSI_DATA_DIR", str(tmp_path / "data"))
    tracking = f"http://127.0.0.1:{closed_port()}"
    bank_dir = tmp_path / "share"
    bank = str(bank_dir / "bank.sqlite")
    cdir = CampaignDir(tmp_path / "out" / "c1")
    hook = f'#!/bin/sh\nrm -rf "{bank_dir}" && touch "{bank_dir}"\n'

    def install_hook(result) -> None:  # the snapshot repository exists once trials run
        path = cdir.root / "sim-repo" / ".git" / "hooks" / "post-commit"
        if not path.exists():
            path.write_text(hook)
            path.chmod(0o755)

    with running_server() as server:
        server.reply = Reply.error(500)
        spec = sim_spec(tmp_path, extra=llm_section(server))
        spec.write_text(spec.read_text().replace("[budget]\n", "[budget]\nmax_trials = 20\n"))
        stop = progress.subscribe(install_hook)
        try:
            code = main(["campaign", str(spec), "--out", str(tmp_path / "out"), "--campaign-id", "c1", "--budget", "40",
                         "--tracking-uri", tracking, "--bank", bank, "--json"])
        finally:
            stop()
    out, err = capsys.readouterr()
    assert code == 0, err[-3000:]
    summary = json.loads(out)  # --json: stdout is the summary; every line for people is on stderr
    assert summary["branch"] == "infrarsi/c1" and "branch infrarsi/c1" in err
    printed = [line.removeprefix("infrarsi: warning: ") for line in err.splitlines()
               if line.startswith("infrarsi: warning: ")]
    assert printed == summary["warnings"] == [w["message"] for w in cdir.read_warnings()]
    sources = [w["source"] for w in cdir.read_warnings()]
    assert sorted(sources) == ["bank", "budget", "llm", "mlflow"]
    [budget] = [w["message"] for w in cdir.read_warnings() if w["source"] == "budget"]
    assert f"the search runs {summary['num_search_trials']} of the 40 trials asked" in budget
    assert "4 warning(s)" in err
    # MLflow's calls wait in the spool: the parent run says the budget asked and the trials run.
    spooled = [json.loads(line) for line in cdir.mlflow_spool.read_text().splitlines()]
    assert spooled[0]["op"] == "start_campaign" and spooled[0]["params"]["budget"] == "40"
    assert {"num_trials": str(summary["num_search_trials"])} in [r["params"] for r in spooled
                                                                if r["op"] == "log_params"]
    pending = tmp_path / "data" / "bank-pending.jsonl"
    [entry] = [json.loads(line) for line in pending.read_text().splitlines()]
    assert entry["bank"] == bank and entry["record"]["id"] == "c1"
    with pytest.raises(InfrarsiError, match="experience bank"):
        open_bank(bank)
