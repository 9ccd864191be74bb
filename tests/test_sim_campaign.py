"""A campaign at cluster scale on the simulator, end to end through the CLI."""

import json
import re

import git

from infrarsi.cli.main import main
from infrarsi.core.ledger import Ledger
from infrarsi.core.workspace import CampaignDir


def test_sim_campaign_runs_through_the_cli(tmp_path, capsys, ray_session, prefect_harness):
    spec = tmp_path / "sim.toml"
    spec.write_text('name = "sim-moe"\nbackend = "sim"\nsim_workload = "moe-26b-a4b-h200"\n'
                    '[budget]\nnum_trials = 12\n[search]\nproposer = "engine"\n')
    assert main(["campaign", str(spec), "--out", str(tmp_path / "out"), "--json"]) == 0
    captured = capsys.readouterr()
    summary = json.loads(captured.out.strip().splitlines()[-1])
    cdir = CampaignDir(tmp_path / "out" / summary["campaign_id"])
    trials = Ledger(cdir.ledger).trials()
    assert summary["num_search_trials"] == 12
    assert all(t.extra.get("simulated") for t in trials)
    # The progress bar is fed by the runtime's result callback, one tick per trial; its total
    # is the campaign's cap from the first tick to the last, and it ends at the count that ran.
    ticks = [(int(n), int(total)) for n, total in re.findall(r"(\d+)/(\d+) \[", captured.err)]
    assert ticks[-1] == (len({t.trial_id for t in trials}),) * 2 == (summary["num_trials"],) * 2
    totals = [total for _, total in ticks]
    closed = totals.index(summary["num_trials"])  # the first frame drawn once the campaign ended
    assert set(totals[:closed]) == {summary["max_trials"]} and set(totals[closed:]) == {summary["num_trials"]}
    assert all(n <= total for n, total in ticks) and summary["num_trials"] < summary["max_trials"]
    assert sum(summary["trials_by_stage"].values()) == summary["num_trials"]
    # the simulated baseline is the user's config on 8 GPUs; the engine must beat it
    assert summary["verified_speedup"] > 1.2 and summary["speedup_ci"][0] > 1
    repo = git.Repo(cdir.root / "sim-repo")
    assert "[config]" in repo.git.show(f"{summary['branch']}:infrarsi_promoted.toml")
