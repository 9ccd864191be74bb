"""How a new campaign reads the bank: past campaigns ranked by how like theirs its hardware
and workload are, their promoted and fastest configs projected onto the new knob space,
and their posterior effects (on step time, memory and a trial's wall time) as priors whose
spread widens as similarity falls."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from infrarsi.bank.records import BankStore, CampaignRecord
from infrarsi.core.knobs import Config, KnobSpace
from infrarsi.core.priors import Priors, SettingPrior
from infrarsi.core.trial import Outcome

# Past campaigns a new one reads, and configs taken from each (its promoted one, then its
# fastest ok ones).
NUM_NEAREST = 3
CONFIGS_PER_CAMPAIGN = 2
# A bank prior's log-scale spread: the past posterior's own, plus this much per unit of
# dissimilarity (distance 1 = another GPU model, or dense vs MoE), plus a floor.
_SPREAD_PER_DISTANCE = 0.25
_SPREAD_FLOOR = 0.05
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
        # The promoted config first: verified against the baseline in pairs and stripped of
        # changes that did not pay, where the fastest search run may owe its place to noise.
        taken = 0
        for cfg in [rec.promoted] * bool(rec.promoted) + [t.config for t in ok]:
            cfg = project(cfg, space, baseline)
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
        # Trial cost: from the campaigns whose records carry it (older records do not).
        costed = [item for item in items if item[1].get("log_cost_effect") is not None]
        cost = {"log_cost_mean": _mean(costed, "log_cost_effect"), "log_cost_std": _spread(costed, "log_cost_sd")} \
            if costed else {}
        out.append(SettingPrior(knob=knob, value=value, log_time_mean=_mean(items, "log_time_effect"),
                                log_time_std=_spread(items, "log_time_sd"),
                                log_memory_mean=_mean(items, "log_memory_effect"),
                                log_memory_std=_spread(items, "log_memory_sd"), **cost, source="bank",
                                rationale=f"posterior of {len(items)} past campaign(s)"))
    return Priors.of(out, "bank") if out else None


def _mean(items: list[tuple[float, dict, float]], key: str) -> float:
    """Similarity-weighted mean of ``key`` over (similarity, effect, distance) items."""
    return sum(w * float(e[key]) for w, e, _ in items) / sum(w for w, _, _ in items)


def _spread(items: list[tuple[float, dict, float]], key: str) -> float:
    """The tightest past posterior sd, widened by the nearest campaign's distance."""
    return math.hypot(min(float(e.get(key) or 0.0) for _, e, _ in items),
                      _SPREAD_PER_DISTANCE * min(d for _, _, d in items), _SPREAD_FLOOR)
