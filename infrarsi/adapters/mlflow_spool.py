"""The tracker's spool: MLflow calls that could not be made yet, one JSON line each, in order."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


class Spool:
    """A JSON-lines file of pending calls; rewritten atomically when replayed."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    def nonempty(self) -> bool:
        try:
            return self.path.stat().st_size > 0
        except FileNotFoundError:
            return False

    def read(self) -> list[dict[str, Any]]:
        if not self.nonempty():
            return []
        with self.path.open() as f:
            return [json.loads(line) for line in f if line.strip()]

    def append(self, record: dict[str, Any]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a") as f:
            f.write(json.dumps(record, default=str) + "\n")

    def write(self, records: list[dict[str, Any]]) -> None:
        tmp = self.path.with_suffix(self.path.suffix + ".tmp")
        tmp.write_text("".join(json.dumps(r, default=str) + "\n" for r in records))
        tmp.replace(self.path)
