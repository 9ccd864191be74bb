"""The report's pictures and headline from a campaign folder: rebuilt for folders of any
age (a record missing, the picture it feeds is named as missing, nothing crashes), logged
on the MLflow campaign run, configs spelled as changes, and every warning a stage recorded
shown in the headline."""

import json
import shutil

import pytest
from mlflow import MlflowClient

from infrarsi.cli.main import main
from infrarsi.core.ledger import Ledger
from infrarsi.core.workspace import CampaignDir
from infrarsi.stages.report.blocks import config_changes
from infrarsi.stages.report.headline import warnings
from infrarsi.stages.report.promotion import ground
from infrarsi.stages.report.report import build_report, report_context
from infrarsi.stages.report.summary import summarize

ALL = {"contributions", "best_so_far", "time_vs_memory", "verification", "learned"}


@pytest.fixture()
def engine_campaign(staged_campaigns, tmp_path):
    """A copy of the staged engine campaign (minimized, branch staged), safe to cut down."""
    return CampaignDir(shutil.copytree(staged_campaigns[1][1].root, tmp_path / "c", symlinks=True))


def _drawn(cdir):
    return {p.stem for p in cdir.plots.glob("*.png")}


def test_the_finished_campaign_draws_every_picture_and_links_each(engine_campaign):
    cdir = engine_campaign
    ctx = report_context(cdir)
    assert _drawn(cdir) == ALL and ctx["missing_pictures"] == []
    assert [p.path for p in ctx["pictures"]] == [f"plots/{n}.png" for n in
                                                 ("contributions", "best_so_far", "time_vs_memory", "verification",
                                                  "learned")]
    md = cdir.report_md.read_text()
    assert all(f"]({p.path})" in md for p in ctx["pictures"])


@pytest.mark.parametrize(("removed", "lost"), [
    (["minimize.json"], {"contributions"}),
    (["minimize.json", "search.json"], {"contributions", "learned"}),
    (["minimize.json", "search.json", "verification.json", "verify_plan.json", "apply.json"],
     {"contributions", "learned", "verification"}),
])
def test_an_older_folder_rebuilds_with_the_pictures_its_records_allow(engine_campaign, removed, lost, capsys):
    """A folder written before a stage kept its record (or one stopped before that stage):
    ``infrarsi report DIR`` rebuilds it, draws the rest, says which picture is missing and
    why, and leaves no picture from the folder's earlier state behind."""
    cdir = engine_campaign
    assert _drawn(cdir) == ALL
    for name in removed:
        (cdir.root / name).unlink(missing_ok=True)
    assert main(["report", str(cdir.root)]) == 0
    assert f"report: {cdir.report_html}" in capsys.readouterr().out
    assert _drawn(cdir) == ALL - lost
    html = cdir.report_html.read_text()
    for name in lost:
        assert f'src="plots/{name}.png"' not in html
    missing = [line for line in cdir.report_md.read_text().splitlines() if ": not drawn, " in line]
    assert len(missing) == len(lost)


def test_a_folder_stopped_after_doctor_still_has_a_report(engine_campaign):
    cdir = engine_campaign
    for name in ("minimize.json", "search.json", "verification.json", "verify_plan.json", "apply.json"):
        (cdir.root / name).unlink(missing_ok=True)
    kept = [e for e in Ledger(cdir.ledger).events() if e.get("role") in ("doctor", "calibrate")]
    cdir.ledger.write_text("".join(json.dumps(e) + "\n" for e in kept))
    ctx = report_context(cdir)
    assert ctx["headline"]["answer"] == "No verified speedup: the baseline stands"
    assert ctx["pictures"] == [] and len(ctx["missing_pictures"]) == len(ALL)
    assert _drawn(cdir) == set()


def test_the_campaign_run_in_mlflow_carries_the_pictures(staged_campaigns):
    store, cdirs = staged_campaigns
    client = MlflowClient(store)
    for cdir in cdirs:
        [parent] = client.search_runs([e.experiment_id for e in client.search_experiments()],
                                      f"tags.`infrarsi.kind` = 'campaign' and "
                                      f"tags.`infrarsi.campaign_id` = '{cdir.root.name}'")
        logged = {a.path for a in client.list_artifacts(parent.info.run_id, "plots")}
        assert logged == {f"plots/{p.name}" for p in cdir.plots.glob("*.png")} and logged
        assert {"report.html", "report.md"} <= {a.path for a in client.list_artifacts(parent.info.run_id)}


def test_every_config_reads_as_its_changes_from_the_baseline(staged_campaigns):
    for cdir in staged_campaigns[1]:
        baseline = cdir.read_json(cdir.contract)["spec"]["baseline"]
        md = cdir.report_md.read_text()
        rows = {line.split(" | ")[0].lstrip("| "): line for line in md.splitlines() if line.startswith("| t0")}
        for t in Ledger(cdir.ledger).trials():
            changes = config_changes(dict(t.config), baseline)
            row = rows[t.trial_id + (f"#{t.attempt}" if t.attempt > 1 else "")]
            assert ", ".join(changes) in row if changes else "(baseline)" in row
        assert "{'" not in md and '{"' not in md


def test_every_recorded_warning_is_in_the_headline(engine_campaign):
    cdir = engine_campaign
    cdir.add_warning("llm", "the LLM endpoint did not answer; using the builtin priors instead")
    cdir.add_warning("mlflow", "MLflow at http://tracking:5000 is unreachable: 3 calls spooled")
    build_report(cdir.root)
    md = cdir.report_md.read_text()
    headline = md[:md.index("## Pictures")]
    warnings = [line.removeprefix("> **Warning:** ") for line in headline.splitlines() if line.startswith("> **W")]
    assert warnings[-2:] == ["the LLM endpoint did not answer; using the builtin priors instead",
                             "MLflow at http://tracking:5000 is unreachable: 3 calls spooled"]
    assert 'class="warnings"' in cdir.report_html.read_text()


def test_a_change_is_shown_with_its_ground_or_for_an_older_record_the_head_of_its_note():
    assert ground({"ground": "equivalent", "note": "leaving it out costs 0.2%"}) == "equivalent"
    assert ground({"note": "predicted to pay: kept without a trial"}) == "predicted to pay"
    assert ground({"note": "predicted not to pay; dropped: a config without it cleared"}) == "predicted not to pay"
    assert ground({"note": "", "inert": True}) == "inert"


def test_the_headline_warns_of_a_clipped_budget_and_runs_left_contaminated(staged_campaigns):
    cdir = staged_campaigns[1][1]
    s = summarize(cdir)
    trials = Ledger(cdir.ledger).trials()
    assert warnings(s, trials, search_budget=6, asked_budget=6) == []
    dirty = [trials[0].replace(extra={**trials[0].extra, "contaminated": True}), *trials[1:]]
    said = warnings({**s, "warnings": ["MLflow is unreachable"]}, dirty, search_budget=4, asked_budget=6)
    assert said[0].startswith(f"1 run(s) stayed contaminated by other load after their re-measurements "
                              f"({trials[0].trial_id})")
    assert said[1] == (f"budget clipped: the search ran 4 of the 6 trials asked for, so that verification fits the "
                       f"trial cap ({s['max_trials']})")
    assert said[2] == "MLflow is unreachable"
