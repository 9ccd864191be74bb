"""The experience bank: every finished campaign, so the next one starts smarter.

Two stores behind one interface (``BankStore``): ``add``, ``forget``, ``list``, ``get`` and
``records``, and a ``location`` that names the store.

- ``Bank``, a SQLite file (the default: ``bank.sqlite`` in the infrarsi data folder,
  ``$INFRARSI_DATA_DIR``, else ``~/.local/share/infrarsi``). One row per campaign holds the
  hardware fingerprint and the workload's features (parameters, layers, sequence length,
  dense or MoE, tokens per step), the baseline and best configs, the proposer's posterior
  per-setting effects and prior revisions; every trial (config, outcome, step time, peak
  memory) and every patch decision (accepted or refused, with its measured effect) have
  their own tables.
- ``infrarsi.adapters.mlflow_bank.MlflowBank``, an MLflow tracking store a team shares: one
  run per campaign in the experiment ``infrarsi-bank``, the features as tags, the same
  record as a JSON artifact (``record_to_json``).

``open_bank`` picks one from a setting (``--bank`` / ``INFRARSI_BANK``): ``off``, a file
path, or ``mlflow+`` followed by an MLflow tracking URI (``mlflow+http://host:5000``,
``mlflow+sqlite:///path/mlflow.db``).

A new campaign reads it (``nearest_records``, then ``nearest``): past campaigns weighted by
how similar their hardware and workload are (``similarity``) give start configs (their
fastest ok configs, projected onto the new knob space) and per-setting priors (their
posterior effects, with the spread widened as similarity falls). Campaigns are recorded at
the end of the apply stage (``record_campaign``).
"""

from __future__ import annotations

import json
import math
import os
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Protocol

from infrarsi.errors import InfrarsiError
from infrarsi.knobs import Config, KnobSpace
from infrarsi.priors import Priors, SettingPrior
from infrarsi.trial import Outcome, TrialResult

__all__ = ["MLFLOW_PREFIX", "Bank", "BankStore", "CampaignRecord", "default_path", "nearest", "nearest_records",
           "open_bank", "record_from_json", "record_to_json", "similarity"]

OFF = "off"
MLFLOW_PREFIX = "mlflow+"  # "mlflow+<tracking URI>" selects the MLflow store
# Past campaigns a new one reads, and fastest ok configs taken from each.
NUM_NEAREST = 3
CONFIGS_PER_CAMPAIGN = 2
# A bank prior's log-scale spread: the past posterior's own, plus this much per unit of
# dissimilarity (distance 1 = another GPU model, or dense vs MoE), plus a floor.
_SPREAD_PER_DISTANCE = 0.25
_SPREAD_FLOOR = 0.05

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
    from infrarsi.workspace import data_dir

    return data_dir() / "bank.sqlite"


@dataclass(frozen=True, kw_only=True)
class CampaignRecord:
    """One finished campaign as the bank keeps it."""

    id: str
    name: str
    backend: str
    proposer: str
    hardware: Mapping[str, Any]  # gpu (model or None), num_devices, memory_bytes, cpu
    workload: Mapping[str, Any]  # num_params, num_layers, seq_len, moe, tokens_per_step
    baseline: Config
    baseline_step_time_s: float | None
    trials: tuple[TrialResult, ...]
    effects: tuple[Mapping[str, Any], ...] = ()  # knob, value, log_time_effect, log_time_sd, log_memory_...
    prior_revision: Any = None
    promoted: Config | None = None
    patches: tuple[Mapping[str, Any], ...] = ()  # name, source, accepted, reason, log_time_effect, patch

    @property
    def best(self) -> TrialResult | None:
        ok = [r for r in self.trials if r.outcome is Outcome.OK]
        return min(ok, key=lambda r: r.step_time_s) if ok else None


class BankStore(Protocol):
    """What every bank store offers; ``location`` names it (a path or a URI)."""

    @property
    def location(self) -> str: ...

    def add(self, rec: CampaignRecord) -> None:
        """Store (or replace) one campaign."""

    def forget(self, campaign_id: str) -> bool:
        """Remove one campaign; False when it was not there."""

    def list(self) -> list[dict[str, Any]]:
        """One summary row per campaign, newest first: id, recorded_at, name, backend,
        hardware, workload, baseline_step_time_s, best_step_time_s, num_trials."""

    def get(self, campaign_id: str) -> CampaignRecord | None: ...

    def records(self) -> list[CampaignRecord]: ...


class Bank:
    """The SQLite store (``BankStore``)."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path).expanduser()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self._connect() as db:
            db.executescript(_SCHEMA)

    @property
    def location(self) -> str:
        return str(self.path)

    def _connect(self) -> sqlite3.Connection:
        try:
            return sqlite3.connect(self.path, timeout=30)
        except sqlite3.Error as exc:
            raise InfrarsiError(f"experience bank {self.path}: {exc}; pass another path or 'off'") from None

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
                                                "reason": t[6] or ""}) for t in trials),
            patches=tuple({"name": p[0], "source": p[1], "accepted": bool(p[2]), "reason": p[3],
                           "log_time_effect": p[4], "patch": json.loads(p[5])} for p in patches))

    def records(self) -> list[CampaignRecord]:
        return [r for r in (self.get(row["id"]) for row in self.list()) if r is not None]


def _j(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)


def record_to_json(rec: CampaignRecord) -> dict[str, Any]:
    """The fields the SQLite store keeps, as plain JSON (what the MLflow store logs)."""
    best = rec.best
    return json.loads(_j({
        "id": rec.id, "name": rec.name, "backend": rec.backend, "proposer": rec.proposer,
        "hardware": dict(rec.hardware), "workload": dict(rec.workload), "baseline": dict(rec.baseline),
        "baseline_step_time_s": rec.baseline_step_time_s, "best_config": best.config if best else None,
        "best_step_time_s": best.step_time_s if best else None, "promoted": rec.promoted,
        "effects": list(rec.effects), "prior_revision": rec.prior_revision,
        "trials": [{"trial_id": r.trial_id, "role": r.role.value, "config": dict(r.config),
                    "outcome": r.outcome.value, "step_time_s": r.step_time_s,
                    "peak_memory_bytes": r.peak_memory_bytes, "reason": r.reason} for r in rec.trials],
        "patches": [{"name": p["name"], "source": p.get("source", ""), "accepted": bool(p.get("accepted")),
                     "reason": p.get("reason"), "log_time_effect": p.get("log_time_effect"),
                     "patch": p.get("patch")} for p in rec.patches]}))


def record_from_json(d: Mapping[str, Any]) -> CampaignRecord:
    return CampaignRecord(
        id=d["id"], name=d["name"], backend=d["backend"], proposer=d["proposer"], hardware=d["hardware"],
        workload=d["workload"], baseline=d["baseline"], baseline_step_time_s=d["baseline_step_time_s"],
        promoted=d["promoted"], effects=tuple(d["effects"] or ()), prior_revision=d["prior_revision"],
        trials=tuple(TrialResult.from_json({**t, "reason": t["reason"] or ""}) for t in d["trials"]),
        patches=tuple(dict(p) for p in d["patches"]))


def open_bank(setting: str | Path | None) -> BankStore | None:
    """The bank ``setting`` names: ``"off"`` (None), ``mlflow+<tracking URI>`` (the MLflow
    store), a SQLite path, or None for ``INFRARSI_BANK`` or else the default path."""
    setting = setting if setting is not None else os.environ.get("INFRARSI_BANK")
    if setting is not None and str(setting).lower() == OFF:
        return None
    if setting is not None and str(setting).startswith(MLFLOW_PREFIX):
        from infrarsi.adapters.mlflow_bank import MlflowBank

        return MlflowBank(str(setting).removeprefix(MLFLOW_PREFIX))
    return Bank(setting if setting is not None else default_path())


# --- similarity ------------------------------------------------------------------------

def _log_ratio(a: Any, b: Any) -> float:
    """|log(a / b)|; 0 when either is unknown (None): no evidence either way."""
    if a is None or b is None:
        return 0.0
    try:
        a, b = float(a), float(b)
    except (TypeError, ValueError):
        return 1.0
    return abs(math.log(a / b)) if a > 0 and b > 0 else 1.0


def distance(hw_a: Mapping[str, Any], wl_a: Mapping[str, Any], hw_b: Mapping[str, Any],
             wl_b: Mapping[str, Any]) -> float:
    """0 for the same job on the same hardware; 1 is about another GPU model, or dense vs
    MoE; size ratios count on the log scale (a 3x larger model adds about 0.5); a feature
    either side does not know adds nothing."""
    d = 0.0 if hw_a.get("gpu") == hw_b.get("gpu") else 1.0
    d += 0.5 * _log_ratio(hw_a.get("memory_bytes"), hw_b.get("memory_bytes"))
    d += 0.3 * _log_ratio(hw_a.get("num_devices"), hw_b.get("num_devices"))
    d += 0.0 if bool(wl_a.get("moe")) == bool(wl_b.get("moe")) else 1.0
    d += 0.5 * _log_ratio(wl_a.get("num_params"), wl_b.get("num_params"))
    d += 0.3 * _log_ratio(wl_a.get("num_layers"), wl_b.get("num_layers"))
    d += 0.3 * _log_ratio(wl_a.get("seq_len"), wl_b.get("seq_len"))
    d += 0.3 * _log_ratio(wl_a.get("tokens_per_step"), wl_b.get("tokens_per_step"))
    return d


def similarity(d: float) -> float:
    return math.exp(-d)


def project(config: Mapping[str, Any], space: KnobSpace, baseline: Config) -> Config | None:
    """``config`` on another knob space: knobs it lacks take the baseline's value, knobs the
    space lacks are dropped; None when a value is outside the domain or it is infeasible."""
    out = {n: config.get(n, baseline[n]) for n in space.names}
    if any(out[k.name] not in k.values for k in space.knobs) or not space.is_feasible(out):
        return None
    return out


@dataclass(frozen=True, kw_only=True)
class Experience:
    configs: tuple[Config, ...]
    priors: Priors | None
    used: tuple[dict, ...]  # the campaigns read: id, name, distance, weight


def nearest_records(store: BankStore, *, hardware: Mapping[str, Any], workload: Mapping[str, Any],
                    exclude: str | None = None) -> list[CampaignRecord]:
    """The ``NUM_NEAREST`` campaigns ``nearest`` would rank first, ranked from ``list`` rows
    so only those are read in full."""
    ranked = sorted(((distance(hardware, workload, r["hardware"], r["workload"]), r["id"]) for r in store.list()
                     if r["id"] != exclude))[:NUM_NEAREST]
    return [r for r in (store.get(cid) for _, cid in ranked) if r is not None]


def nearest(records: Iterable[CampaignRecord], *, hardware: Mapping[str, Any], workload: Mapping[str, Any],
            space: KnobSpace, baseline: Config, exclude: str | None = None) -> Experience:
    """Start configs and priors from the ``NUM_NEAREST`` most similar past campaigns."""
    ranked = sorted(((distance(hardware, workload, r.hardware, r.workload), r) for r in records if r.id != exclude),
                    key=lambda t: (t[0], t[1].id))[:NUM_NEAREST]
    configs: list[Config] = []
    for _, rec in ranked:
        ok = sorted((t for t in rec.trials if t.outcome is Outcome.OK), key=lambda t: t.step_time_s)
        taken = 0
        for t in ok:
            cfg = project(t.config, space, baseline)
            if cfg is not None and cfg not in configs and cfg != baseline:
                configs.append(cfg)
                taken += 1
            if taken == CONFIGS_PER_CAMPAIGN:
                break
    used = tuple({"id": r.id, "name": r.name, "distance": round(d, 3), "weight": round(similarity(d), 4)}
                 for d, r in ranked)
    return Experience(configs=tuple(configs), priors=_bank_priors(ranked, space, baseline), used=used)


def _bank_priors(ranked: list[tuple[float, CampaignRecord]], space: KnobSpace, baseline: Config) -> Priors | None:
    """Similarity-weighted posterior effects of past campaigns, for settings whose
    reference (the past campaign's baseline value) matches this campaign's baseline."""
    sums: dict[tuple[str, Any], list[tuple[float, dict, float]]] = {}
    for d, rec in ranked:
        for e in rec.effects:
            knob, value = e.get("knob"), e.get("value")
            if knob not in space.names or value not in space.knob(knob).values or value == baseline[knob]:
                continue
            if rec.baseline.get(knob) != baseline[knob]:
                continue  # effects are relative to the baseline's setting: a different reference
            sums.setdefault((knob, value), []).append((similarity(d), e, d))
    out = []
    for (knob, value), items in sums.items():
        w = sum(s for s, _, _ in items)
        mean = lambda key: sum(s * float(e[key]) for s, e, _ in items) / w  # noqa: E731
        d_min = min(d for _, _, d in items)
        spread = lambda key: math.hypot(min(float(e.get(key) or 0.0) for _, e, _ in items),  # noqa: E731
                                        _SPREAD_PER_DISTANCE * d_min, _SPREAD_FLOOR)
        out.append(SettingPrior(knob=knob, value=value, log_time_mean=mean("log_time_effect"),
                                log_time_std=spread("log_time_sd"), log_memory_mean=mean("log_memory_effect"),
                                log_memory_std=spread("log_memory_sd"), source="bank",
                                rationale=f"posterior of {len(items)} past campaign(s)"))
    return Priors.of(out, "bank") if out else None
