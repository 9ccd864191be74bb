"""The default experience bank: a SQLite file (``bank.sqlite`` in the infrarsi data folder).

One row per campaign holds the hardware fingerprint and the workload's features, the
baseline and best configs, the proposer's posterior per-setting effects and prior
revisions; every trial and every patch decision have their own tables."""

from __future__ import annotations

import contextlib
import json
import sqlite3
import time
from pathlib import Path
from typing import Any, Iterator

from infrarsi.bank.records import CampaignRecord, _j
from infrarsi.core.errors import BankUnavailableError
from infrarsi.core.trial import TrialResult
from infrarsi.core.workspace import data_dir

_SCHEMA = """
CREATE TABLE IF NOT EXISTS campaigns (
    id TEXT PRIMARY KEY, recorded_at REAL, name TEXT, backend TEXT, proposer TEXT,
    hardware TEXT, workload TEXT, baseline TEXT, baseline_step_time_s REAL,
    best_config TEXT, best_step_time_s REAL, promoted TEXT, effects TEXT, prior_revision TEXT);
CREATE TABLE IF NOT EXISTS trials (
    campaign_id TEXT, trial_id TEXT, role TEXT, config TEXT, outcome TEXT, step_time_s REAL,
    peak_memory_bytes INTEGER, reason TEXT);
CREATE TABLE IF NOT EXISTS patches (
    campaign_id TEXT, name TEXT, source TEXT, accepted INTEGER, reason TEXT, log_time_effect REAL,
    patch TEXT);
"""
def default_path() -> Path:
    return data_dir() / "bank.sqlite"


class Bank:
    """The SQLite store (``BankStore``)."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path).expanduser()
        with self._connect() as db:
            db.executescript(_SCHEMA)

    @property
    def location(self) -> str:
        return str(self.path)

    @contextlib.contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        """One transaction on a connection closed after it; any failure to reach the file
        is a ``BankUnavailableError``."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with contextlib.closing(sqlite3.connect(self.path, timeout=30)) as db, db:
                yield db
        except (sqlite3.Error, OSError) as exc:
            raise BankUnavailableError(f"experience bank {self.path}: {type(exc).__name__}: {exc}; "
                                       "pass another bank (--bank for a campaign, --path for infrarsi bank): a SQLite file, "
                                       "mlflow+URI, or 'off'") from None

    def add(self, rec: CampaignRecord) -> None:
        """Store (or replace) one campaign."""
        best = rec.best
        with self._connect() as db:
            self._delete(db, rec.id)
            db.execute("INSERT INTO campaigns VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)", (
                rec.id, time.time(), rec.name, rec.backend, rec.proposer, _j(rec.hardware), _j(rec.workload),
                _j(rec.baseline), rec.baseline_step_time_s, _j(best.config if best else None),
                best.step_time_s if best else None, _j(rec.promoted), _j(list(rec.effects)), _j(rec.prior_revision)))
            db.executemany("INSERT INTO trials VALUES (?,?,?,?,?,?,?,?)", [
                (rec.id, r.trial_id, r.role.value, _j(dict(r.config)), r.outcome.value, r.step_time_s,
                 r.peak_memory_bytes, r.reason) for r in rec.trials])
            db.executemany("INSERT INTO patches VALUES (?,?,?,?,?,?,?)", [
                (rec.id, p["name"], p.get("source", ""), int(bool(p.get("accepted"))), p.get("reason"),
                 p.get("log_time_effect"), _j(p.get("patch"))) for p in rec.patches])

    @staticmethod
    def _delete(db: sqlite3.Connection, campaign_id: str) -> int:
        n = db.execute("DELETE FROM campaigns WHERE id = ?", (campaign_id,)).rowcount
        db.execute("DELETE FROM trials WHERE campaign_id = ?", (campaign_id,))
        db.execute("DELETE FROM patches WHERE campaign_id = ?", (campaign_id,))
        return n

    def forget(self, campaign_id: str) -> bool:
        with self._connect() as db:
            return self._delete(db, campaign_id) > 0

    def list(self) -> list[dict[str, Any]]:
        """One summary row per campaign, newest first."""
        with self._connect() as db:
            rows = db.execute("SELECT c.id, c.recorded_at, c.name, c.backend, c.hardware, c.workload, "
                              "c.baseline_step_time_s, c.best_step_time_s, "
                              "(SELECT COUNT(*) FROM trials t WHERE t.campaign_id = c.id) "
                              "FROM campaigns c ORDER BY c.recorded_at DESC").fetchall()
        return [{"id": r[0], "recorded_at": r[1], "name": r[2], "backend": r[3], "hardware": json.loads(r[4]),
                 "workload": json.loads(r[5]), "baseline_step_time_s": r[6], "best_step_time_s": r[7],
                 "num_trials": r[8]} for r in rows]

    def get(self, campaign_id: str) -> CampaignRecord | None:
        with self._connect() as db:
            row = db.execute("SELECT id, name, backend, proposer, hardware, workload, baseline, "
                             "baseline_step_time_s, promoted, effects, prior_revision FROM campaigns WHERE id = ?",
                             (campaign_id,)).fetchone()
            if row is None:
                return None
            trials = db.execute("SELECT trial_id, role, config, outcome, step_time_s, peak_memory_bytes, reason "
                                "FROM trials WHERE campaign_id = ? ORDER BY rowid", (campaign_id,)).fetchall()
            patches = db.execute("SELECT name, source, accepted, reason, log_time_effect, patch FROM patches "
                                 "WHERE campaign_id = ? ORDER BY rowid", (campaign_id,)).fetchall()
        return CampaignRecord(
            id=row[0], name=row[1], backend=row[2], proposer=row[3], hardware=json.loads(row[4]),
            workload=json.loads(row[5]), baseline=json.loads(row[6]), baseline_step_time_s=row[7],
            promoted=json.loads(row[8]), effects=tuple(json.loads(row[9]) or ()), prior_revision=json.loads(row[10]),
            trials=tuple(TrialResult.from_json({"trial_id": t[0], "role": t[1], "config": json.loads(t[2]),
                                                "outcome": t[3], "step_time_s": t[4], "peak_memory_bytes": t[5],
                                                "reason": t[6]}) for t in trials),
            patches=tuple({"name": p[0], "source": p[1], "accepted": bool(p[2]), "reason": p[3],
                           "log_time_effect": p[4], "patch": json.loads(p[5])} for p in patches))

    def records(self) -> list[CampaignRecord]:
        return [r for r in (self.get(row["id"]) for row in self.list()) if r is not None]
