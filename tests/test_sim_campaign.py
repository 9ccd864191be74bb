"""A campaign at cluster scale on the simulator, end to end through the CLI."""

import json
import re
from pathlib import Path

import git

from infrarsi.cli.main import main
from infrarsi.core.ledger import Ledger
from infrarsi.core.workspace import CampaignDir

SIM_SPEC = Path(__file__).resolve().parents[1] / "workloads" / "sim" / "moe-26b-a4b-h200.toml"


def test_sim_campaign_runs_through_the_cli(tmp_path, capfd, ray_session, prefect_harness):
    # capfd: stdout at the descriptor, where a library or a child process would write too.
    assert main(["campaign", str(SIM_SPEC), "--budget", "12", "--out", str(tmp_path / "out"), "--json"]) == 0
    out, err = capfd.readouterr()
    summary = json.loads(out)  # --json: stdout is the summary and nothing else
    assert f"report: {summary['report']}" in err  # the lines for people are on stderr
    cdir = CampaignDir(tmp_path / "out" / summary["campaign_id"])
    trials = Ledger(cdir.ledger).trials()
    assert summary["num_search_trials"] == 12
    assert all(t.extra.get("simulated") for t in trials)
    # stderr is no terminal here: one plain line per trial, fed by the runtime's result
    # callback, counted against the campaign's cap (fewer ran: verification decided early).
    lines = re.findall(r"^trial (\d+)/(\d+) (\w+) (\w+)( [\d.e+-]+ s/step)?$", err, re.MULTILINE)
    assert [int(n) for n, *_ in lines] == list(range(1, summary["num_trials"] + 1))
    assert {int(total) for _, total, *_ in lines} == {summary["max_trials"]}
    assert summary["num_trials"] < summary["max_trials"]
    assert all(bool(time) == (outcome == "ok") for _, _, _, outcome, time in lines)
    assert sum(role == "search" for _, _, role, *_ in lines) == 12
    assert "\r" not in err  # no bar redraws in a log
    assert sum(summary["trials_by_stage"].values()) == summary["num_trials"]
    # the simulated baseline is the user's config on 8 GPUs; the engine must beat it
    assert summary["verified_speedup"] > 1.2 and summary["speedup_ci"][0] > 1
    repo = git.Repo(cdir.root / "sim-repo")
    assert "[config]" in repo.git.show(f"{summary['branch']}:infrarsi_promoted.toml")
