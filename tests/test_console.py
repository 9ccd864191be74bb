"""What the infrarsi command shows people and where: --json's one document on stdout, warnings
as they are raised, and progress as a bar on a terminal or a line per trial in a log."""

import io
import json
from pathlib import Path

from prefect import flow

from infrarsi.cli.console import CampaignConsole
from infrarsi.cli.main import main
from infrarsi.core import progress
from infrarsi.core.trial import Outcome, Role, TrialResult
from infrarsi.core.workspace import CampaignDir


class Terminal(io.StringIO):
    """A stream that says it is a terminal, as stderr does in a shell."""

    def isatty(self) -> bool:
        return True


def _results() -> list[TrialResult]:
    ok = TrialResult(trial_id="t0001", config={"micro_batch": 4}, role=Role.SEARCH, outcome=Outcome.OK,
                     step_time_s=0.41, wall_time_s=3.0)
    remeasured = ok.replace(trial_id="t0002", extra={"retried": True})  # superseded: the same trial again
    oom = TrialResult(trial_id="t0002", config={"micro_batch": 64}, role=Role.SEARCH, outcome=Outcome.OOM,
                      wall_time_s=1.0, attempt=2)
    return [ok, remeasured, oom]


def test_out_of_a_terminal_each_trial_is_one_plain_line():
    stream = io.StringIO()
    with CampaignConsole(stream).progress(45, 11):
        for result in _results():
            progress.publish(result)
    assert stream.getvalue().splitlines() == ["trial 12/45 search ok 0.41 s/step", "trial 13/45 search oom"]


def test_on_a_terminal_the_bar_counts_trials_and_warnings_print_above_it():
    stream = Terminal()
    console = CampaignConsole(stream)
    with console.warnings(), console.progress(45, 11):
        for result in _results():
            progress.publish(result)
        progress.warn("mlflow", "MLflow at http://127.0.0.1:9 is unreachable")
    frames = stream.getvalue().split("\r")
    assert any("infrarsi: warning: MLflow at http://127.0.0.1:9 is unreachable\n" in f for f in frames)
    assert "13/13" in frames[-1]  # closed at the count that ran
    assert "trial 12/45" not in stream.getvalue()


@flow(log_prints=True)
def _warns_inside_a_flow(folder: str) -> None:
    CampaignDir(Path(folder)).add_warning("mlflow", "MLflow at http://127.0.0.1:9 is unreachable; spooled")


def test_a_warning_raised_inside_the_flow_reaches_the_console(tmp_path, capsys, prefect_harness):
    # The flow logs its prints (log_prints): a warning printed with print() would go to
    # prefect.log, not the console.
    with CampaignConsole().warnings():
        _warns_inside_a_flow(str(tmp_path))
    assert "infrarsi: warning: MLflow at http://127.0.0.1:9 is unreachable; spooled\n" in capsys.readouterr().err


def test_report_json_is_one_document_on_stdout(staged_campaigns, capfd):
    _, cdirs = staged_campaigns
    assert main(["report", str(cdirs[0].root), "--json"]) == 0
    out, err = capfd.readouterr()
    assert json.loads(out)["campaign_id"] == cdirs[0].root.name
    assert f"report: {cdirs[0].report_html}" in err
