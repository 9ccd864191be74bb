"""The campaign folder: where every stage writes what it produced.

Each stage's output is one file here, written once; a resumed campaign finds what is
already done by looking at these files and the ledger.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DATA_DIR_ENV = "INFRARSI_DATA_DIR"


def data_dir() -> Path:
    """Where campaigns and the shared MLflow store live by default: ``$INFRARSI_DATA_DIR``,
    else ``$XDG_DATA_HOME/infrarsi``, else ``~/.local/share/infrarsi``."""
    if os.environ.get(DATA_DIR_ENV):
        return Path(os.environ[DATA_DIR_ENV]).expanduser().resolve()
    xdg = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(xdg).expanduser().resolve() / "infrarsi"


def default_campaigns_dir() -> Path:
    return data_dir() / "campaigns"


def default_tracking_uri() -> str:
    """``$MLFLOW_TRACKING_URI``, else one SQLite store per machine in the data folder, so
    every campaign run here can be compared with every other."""
    if os.environ.get("MLFLOW_TRACKING_URI"):
        return os.environ["MLFLOW_TRACKING_URI"]
    return f"sqlite:///{data_dir() / 'mlflow.db'}"


@dataclass(frozen=True)
class CampaignDir:
    root: Path

    @property
    def contract(self) -> Path:
        return self.root / "contract.json"

    @property
    def doctor(self) -> Path:
        return self.root / "doctor.json"

    @property
    def search(self) -> Path:
        return self.root / "search.json"

    @property
    def plan(self) -> Path:
        return self.root / "verify_plan.json"

    @property
    def verification(self) -> Path:
        return self.root / "verification.json"

    @property
    def minimize(self) -> Path:
        return self.root / "minimize.json"

    @property
    def summary(self) -> Path:
        return self.root / "summary.json"

    @property
    def ledger(self) -> Path:
        return self.root / "ledger.jsonl"

    @property
    def trials(self) -> Path:
        return self.root / "trials"

    @property
    def snapshot(self) -> Path:
        return self.root / "repo"

    @property
    def report_md(self) -> Path:
        return self.root / "report.md"

    @property
    def report_html(self) -> Path:
        return self.root / "report.html"

    @property
    def plots(self) -> Path:
        return self.root / "plots"

    @property
    def mlflow_spool(self) -> Path:
        return self.root / "mlflow-spool.jsonl"

    @property
    def options(self) -> Path:
        """The campaign's options as resolved at init (proposer, budget, tracking URI ...)."""
        return self.root / "options.json"

    @property
    def priors(self) -> Path:
        """The search priors as first obtained (an LLM is never asked twice)."""
        return self.root / "priors.json"

    @property
    def processes(self) -> Path:
        """The processes this campaign's process started, as its watchdog last saw them
        (``infrarsi.harness.process_guard``): what a resume ends if they outlived it."""
        return self.root / "processes.json"

    @property
    def warnings(self) -> Path:
        """Things the user must know that are not a trial's result (an LLM fallback, MLflow
        spooling, a clipped budget): one JSON line each, shown on the console and in the report."""
        return self.root / "warnings.jsonl"

    def add_warning(self, source: str, message: str) -> None:
        """Append one warning (``source``: the system or stage it comes from) and tell the
        console (``infrarsi.core.progress.warn``); a message already recorded is not repeated."""
        from infrarsi.core import progress

        if any(w["message"] == message for w in self.read_warnings()):
            return
        with self.warnings.open("a") as fh:
            fh.write(json.dumps({"source": source, "message": message}) + "\n")
        progress.warn(source, message)

    def read_warnings(self) -> list[dict[str, str]]:
        if not self.warnings.exists():
            return []
        return [json.loads(line) for line in self.warnings.read_text().splitlines() if line.strip()]

    @property
    def tracking_uri(self) -> str:
        """The MLflow store this campaign logs to: the one fixed at init, else the machine's."""
        return self.remembered_options().get("tracking_uri") or default_tracking_uri()

    def remembered_options(self) -> dict[str, Any]:
        """The options this campaign runs with, as resolved at init or the last resume
        (``CampaignOptions.resumed``); none for a folder from before options.json."""
        return self.read_json(self.options) if self.options.exists() else {}

    def write_json(self, path: Path, data: Any) -> None:
        """Atomic: a campaign killed mid-write leaves the old file or the new one."""
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text(json.dumps(data, indent=2, sort_keys=True, default=str))
        os.replace(tmp, path)

    def read_json(self, path: Path) -> Any:
        return json.loads(path.read_text())
