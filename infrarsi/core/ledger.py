"""The append-only JSON-lines ledger: the campaign's source of truth.

One line per event, flushed and fsynced as it is written, so a campaign killed at any
moment loses at most the trial that was running. A resumed campaign reads it back;
MLflow is a view for people, the ledger is what counts.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, Iterator

from infrarsi.core.trial import TrialResult


class Ledger:
    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def append(self, kind: str, payload: dict[str, Any]) -> None:
        line = json.dumps({"kind": kind, "recorded_at": time.time(), **payload}, sort_keys=True, default=str)
        with open(self.path, "a") as f:
            f.write(line + "\n")
            f.flush()
            os.fsync(f.fileno())

    def append_trial(self, result: TrialResult) -> None:
        self.append("trial", result.to_json())

    def events(self) -> Iterator[dict[str, Any]]:
        if not self.path.exists():
            return
        with open(self.path) as f:
            for line in f:
                line = line.strip()
                if not line:
                    continue
                try:
                    yield json.loads(line)
                except json.JSONDecodeError:
                    # A line cut by a kill mid-write: everything before it is intact.
                    continue

    def trials(self) -> list[TrialResult]:
        return [TrialResult.from_json(e) for e in self.events() if e["kind"] == "trial"]
