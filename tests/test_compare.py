"""infrarsi compare over one MLflow store holding campaigns of two jobs and two proposers."""

import json

import pytest
from mlflow import MlflowClient

from infrarsi.cli.main import main
from infrarsi.core.ledger import Ledger
from infrarsi.stages.report.summary import summarize


@pytest.fixture(scope="module")
def store(staged_campaigns):
    return staged_campaigns


def test_compare_tables_every_campaign_and_plots_them(store, tmp_path, capsys):
    uri, cdirs = store
    plot = tmp_path / "cmp.png"
    assert main(["compare", "--tracking-uri", uri, "--plot", str(plot), "--json"]) == 0
    out, err = capsys.readouterr()
    rows = json.loads(out)["campaigns"]
    assert err.startswith("campaign ") and f"plot: {plot}" in err  # the table, for people, on stderr
    assert plot.stat().st_size > 10_000
    assert [r["campaign_id"] for r in rows] == [c.root.name for c in cdirs]
    for row, cdir in zip(rows, cdirs):
        s = summarize(cdir)
        assert row["baseline_step_time_s"] == pytest.approx(s["baseline_step_time_s"])
        assert row["best_step_time_s"] == pytest.approx(s["best_step_time_s"])
        assert row["trials_by_outcome"] == s["trials_by_outcome"]
        assert row["failed_trial_seconds"] == pytest.approx(s["failed_trial_seconds"])
        if s["verified_speedup"]:
            assert row["verified_speedup"] == pytest.approx(s["verified_speedup"])
            assert row["speedup_ci"] == pytest.approx(s["speedup_ci"])
        assert len(row["best_so_far_s"]) == 6 and min(v for v in row["best_so_far_s"] if v) == pytest.approx(
            s["best_step_time_s"])
        assert row["status"] == "FINISHED" and row["hardware"]
    assert [r["proposer"] for r in rows] == ["random", "engine"]

    assert main(["compare", "--tracking-uri", uri, "--plot", str(plot), "--job", "sim-moe"]) == 0
    table = capsys.readouterr().out
    assert table.splitlines()[0].split()[:4] == ["campaign", "job", "hardware", "proposer"]
    assert cdirs[1].root.name in table and cdirs[0].root.name not in table
    assert main(["compare", "--tracking-uri", uri, "--hardware", "no-such-machine", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["campaigns"] == []


def test_trial_runs_carry_knobs_metrics_outcome_and_the_simulated_tag(store):
    uri, cdirs = store
    client = MlflowClient(uri)
    cdir = cdirs[0]
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()],
                              f"tags.`infrarsi.campaign_id` = '{cdir.root.name}' and tags.`infrarsi.kind` = 'trial'")
    trials = {(t.trial_id, t.attempt): t for t in Ledger(cdir.ledger).trials()}
    assert len(runs) == len(trials)
    for run in runs:
        t = trials[(run.data.tags["infrarsi.trial_id"], int(run.data.tags["infrarsi.attempt"]))]
        assert {k: run.data.params[k] for k in t.config} == {k: str(v) for k, v in t.config.items()}
        assert run.data.tags["infrarsi.outcome"] == t.outcome.value and run.data.tags["infrarsi.simulated"] == "true"
        if t.step_time_s is not None:
            assert run.data.metrics["step_time_s"] == pytest.approx(t.step_time_s)
        if t.peak_memory_bytes is not None:
            assert run.data.metrics["peak_memory_bytes"] == t.peak_memory_bytes


def test_compare_without_a_store_says_what_to_do(tmp_path, capsys):
    assert main(["compare", "--tracking-uri", f"sqlite:///{tmp_path / 'none.db'}"]) == 2
    assert "run a campaign first" in capsys.readouterr().err
    assert not (tmp_path / "none.db").exists()


def test_a_campaigns_mfu_metrics_reach_its_row():
    from infrarsi.cli.compare import _fmt, campaign_row

    run = {"run_id": "r1", "run_name": "c1", "status": "FINISHED", "params": {"proposer": "engine"},
           "tags": {"infrarsi.campaign_id": "c1"},
           "metrics": {"baseline_mfu": 0.029, "promoted_mfu": 0.378, "verified_speedup": 13.0}}
    row = campaign_row(run)
    assert row["mfu"] == {"baseline_mfu": 0.029, "promoted_mfu": 0.378}
    assert _fmt("mfu", row["mfu"]) == "baseline_mfu 2.9%, promoted_mfu 37.8%"
