"""A campaign folder to and from the experience bank: its features, its record, and the
experience a new campaign reads."""

from __future__ import annotations

import math
from typing import Any

from infrarsi.backends import backend_of
from infrarsi.bank.records import BankStore, CampaignRecord
from infrarsi.bank.similarity import Experience, nearest, nearest_records
from infrarsi.bank.store import open_bank
from infrarsi.contract.freeze import Contract
from infrarsi.core.ledger import Ledger
from infrarsi.core.trial import Outcome, Role, TrialResult
from infrarsi.core.workspace import CampaignDir
from infrarsi.record.campaign import promoted as promoted_verdict
from infrarsi.record.campaign import read_contract, read_doctor

__all__ = ["campaign_experience", "campaign_features", "campaign_record", "experience_for", "record_campaign"]


def campaign_features(contract: Contract, trials: list[TrialResult]) -> tuple[dict, dict]:
    """(hardware, workload) features: the backend's where the spec says them (a simulated
    cluster), else the machine's and the job's. A process job's parameter count and flavour
    come from the start event its trials logged (dense or MoE: whether the flavour's name
    says moe); its layer count is not known (None)."""
    spec = contract.spec
    known = backend_of(spec).known_features(spec)
    if known is not None:  # the simulated cluster's
        return known
    res, fp = spec.resources, dict(contract.hardware)
    gpus = list(fp.get("gpus") or [])
    hw = {"gpu": gpus[0] if gpus and res.gpus_per_trial else None,
          "num_devices": res.gpus_per_trial or res.cpus_per_trial,
          "memory_bytes": int(spec.device.memory_capacity), "cpu": fp.get("cpu")}
    start = next((r.extra.get("start") for r in trials if r.extra.get("start")), None) or {}
    wl = {"num_params": start.get("num_params"), "num_layers": start.get("num_layers"), "seq_len": spec.contract.seq_len,
          "moe": "moe" in str(start.get("flavour", "")).lower(), "tokens_per_step": spec.contract.global_batch_tokens}
    return hw, wl


def experience_for(bank: BankStore, rt: Any) -> Experience:
    """What the bank's nearest past campaigns offer the campaign of runtime ``rt``."""
    hw, wl = campaign_features(rt.contract, rt.ledger.trials())
    past = nearest_records(bank, hardware=hw, workload=wl, exclude=rt.contract.campaign_id)
    return nearest(past, hardware=hw, workload=wl, space=rt.space,
                   baseline=rt.space.validate(rt.spec.baseline), exclude=rt.contract.campaign_id)


def campaign_experience(setting: str | None, rt: Any) -> Experience | None:
    """Start configs and priors from the nearest past campaigns of the bank ``setting``
    names (None when the bank is off), for the campaign of runtime ``rt``; what was read is
    a ledger event."""
    store = open_bank(setting)
    if store is None:
        return None
    found = experience_for(store, rt)
    if found.used:
        rt.ledger.append("experience", {"bank": store.location, "campaigns": list(found.used),
                                        "configs": [dict(c) for c in found.configs],
                                        "num_priors": len(found.priors.settings) if found.priors else 0})
    return found


def _patch_effects(trials: list[TrialResult], knob: str) -> float | None:
    """Mean log(step time with / without) over ok pairs that differ only in ``knob``."""
    ok = [r for r in trials if r.outcome is Outcome.OK]
    without = {tuple(sorted((k, v) for k, v in r.config.items() if k != knob and v is not False)): r
               for r in ok if not r.config.get(knob)}
    logs = []
    for r in ok:
        if r.config.get(knob) is True:
            key = tuple(sorted((k, v) for k, v in r.config.items() if k != knob and v is not False))
            if key in without:
                logs.append(math.log(r.step_time_s / without[key].step_time_s))
    return sum(logs) / len(logs) if logs else None


def _cost_fields(cost: dict | None) -> dict:
    """A setting's posterior effect on trial wall time, where the search fitted one."""
    if cost is None:
        return {}
    return {"log_cost_effect": cost["log_cost_effect"], "log_cost_sd": cost["log_cost_sd"]}


def campaign_record(cdir: CampaignDir) -> CampaignRecord:
    """The bank's record of a finished campaign folder."""
    contract = read_contract(cdir)
    ledger = Ledger(cdir.ledger)
    trials = [r for r in ledger.trials() if not r.extra.get("retried")]
    hw, wl = campaign_features(contract, trials)
    search = cdir.read_json(cdir.search) if cdir.search.exists() else {}
    describe = search.get("describe") or {}
    doctor = read_doctor(cdir)
    measured = list(trials)
    if doctor and not any(r.role is Role.DOCTOR for r in trials):  # doctor came from the cache
        measured.append(TrialResult(trial_id="doctor", config=dict(doctor.baseline), role=Role.DOCTOR,
                                    outcome=Outcome.OK, step_time_s=doctor.step_time_s))
    patches = []
    for e in ledger.events():
        if e["kind"] == "patch_accepted":
            patches.append({"name": e["name"], "source": e.get("source", ""), "accepted": True, "reason": None,
                            "patch": e["patch"], "log_time_effect": _patch_effects(measured, e["knob"])})
        elif e["kind"] in ("patch_refused", "patch_retired"):
            patches.append({"name": e["name"], "source": e.get("source", ""), "accepted": False,
                            "reason": ("violated the contract: " if e["kind"] == "patch_retired" else "")
                            + str(e.get("reason")), "patch": None, "log_time_effect": None})
    costs = {(c["knob"], repr(c["value"])): c for c in describe.get("trial_cost_effects") or ()}
    effects = tuple({"knob": p["knob"], "value": p["value"], "log_time_effect": p["log_time_effect"],
                     "log_time_sd": p["log_time_sd"], "log_memory_effect": p["log_memory_effect"],
                     "log_memory_sd": p["log_memory_sd"],
                     **_cost_fields(costs.get((p["knob"], repr(p["value"]))))}
                    for p in describe.get("memory_prices") or ())
    # What stands promoted after minimization, which may have dropped changes the
    # verification's winner held.
    verdict = promoted_verdict(cdir)
    promoted = dict(verdict.config) if verdict else None
    return CampaignRecord(
        id=contract.campaign_id, name=contract.spec.name, backend=contract.spec.backend,
        proposer=search.get("proposer", contract.spec.search.proposer), hardware=hw, workload=wl,
        baseline=dict(contract.spec.space.validate(contract.spec.baseline)),
        baseline_step_time_s=doctor.step_time_s if doctor else None,
        trials=tuple(r for r in measured if r.role in (Role.DOCTOR, Role.SEARCH)), effects=effects,
        prior_revision=describe.get("prior_revision"), promoted=promoted, patches=tuple(patches))


def record_campaign(bank: BankStore | None, cdir: CampaignDir) -> str | None:
    """Store the finished campaign of ``cdir``; its id, or None with the bank off."""
    if bank is None:
        return None
    rec = campaign_record(cdir)
    bank.add(rec)
    return rec.id
