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
    def default_tracking_uri(self) -> str:
        return f"sqlite:///{(self.root / 'mlflow.db').resolve()}"

    def write_json(self, path: Path, data: Any) -> None:
        """Atomic: a campaign killed mid-write leaves the old file or the new one."""
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text(json.dumps(data, indent=2, sort_keys=True, default=str))
        os.replace(tmp, path)

    def read_json(self, path: Path) -> Any:
        return json.loads(path.read_text())
