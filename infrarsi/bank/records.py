"""A campaign as the experience bank keeps it: the record, its JSON form, and the interface
every store implements (``BankStore``)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Mapping, Protocol

from infrarsi.core.knobs import Config
from infrarsi.core.trial import Outcome, TrialResult


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
        trials=tuple(TrialResult.from_json(t) for t in d["trials"]),  # a None reason reads as ""
        patches=tuple(dict(p) for p in d["patches"]))
