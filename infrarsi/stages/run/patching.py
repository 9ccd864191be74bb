"""Patches proposed during the run: a round asks the sources, gates each proposal, and
grows the campaign's knob space with what the gate accepts.

Growing is a new contract (``grown``) that the runtime adopts (``CampaignRuntime.adopt``,
the one place its contract, spec and space change): an accepted patch becomes the boolean
knob ``patch_<name>`` (baseline False), pairs that do not apply together become
constraints, and a patch that was on in a trial that broke the contract gets the
constraint ``not patch_<name>`` so no proposer suggests it again. Every decision is a
ledger event (``patch_accepted``, ``patch_refused``, ``patch_retired``), from which
``restore`` rebuilds the same contract when a campaign resumes, before any stage runs.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from infrarsi.contract.freeze import Contract
from infrarsi.core.trial import Outcome, TrialResult
from infrarsi.patches.patch import Patch, contract_patches
from infrarsi.patches.sources import PatchContext, gate, measurement_config, patch_sources
from infrarsi.stages.doctor import DoctorReport
from infrarsi.stages.runtime import CampaignRuntime

# Search trials without a better ok result before the search counts as stalled.
STALL_TRIALS = 5


def grown(contract: Contract, *, add: Patch | None = None, conflicts: tuple[str, ...] = (),
          retire: str | None = None) -> Contract:
    """``contract`` with patch ``add``'s knob in its space (off at baseline, never on with
    the patches it ``conflicts`` with), or with knob ``retire`` held off."""
    spec, extra = contract.spec, dict(contract.extra)
    update: dict[str, Any] = {}
    if add is not None:
        update["patches"] = [*spec.patches, add.name]
        update["baseline"] = {**spec.baseline, add.knob: False}
        others = {p.name: p.knob for p in contract_patches(contract)}
        update["constraints"] = [*spec.constraints, *(f"not ({add.knob} and {others[c]})" for c in conflicts)]
        extra["patches"] = [*extra.get("patches", []), add.to_json()]
    if retire is not None:
        update["constraints"] = [*update.get("constraints", spec.constraints), f"not {retire}"]
    return dataclasses.replace(contract, spec=spec.model_copy(update=update), extra=extra)


def restore(rt: CampaignRuntime) -> None:
    """Replay the ledger's patch decisions (a resumed campaign)."""
    for event in list(rt.ledger.events()):
        if event["kind"] == "patch_accepted":
            rt.adopt(grown(rt.contract, add=Patch.from_json(event["patch"]),
                           conflicts=tuple(event.get("conflicts", ()))))
        elif event["kind"] == "patch_retired":
            rt.adopt(grown(rt.contract, retire=event["knob"]))


def rounds_done(rt: CampaignRuntime) -> int:
    return sum(1 for e in rt.ledger.events() if e["kind"] == "patch_round")


def stalled(trials: list[TrialResult], *, since: int = 0) -> bool:
    """No better ok search result in the last ``STALL_TRIALS`` trials, and at least that
    many finished after the first ``since`` (the trials done at the last patch round)."""
    best, without = float("inf"), 0
    for r in trials:
        if r.outcome is Outcome.OK and r.step_time_s < best:
            best, without = r.step_time_s, 0
        else:
            without += 1
    return without >= STALL_TRIALS and len(trials) - since >= STALL_TRIALS


def _context(rt: CampaignRuntime, doctor: DoctorReport, trials: list[TrialResult]) -> PatchContext:
    c = rt.spec.contract
    return PatchContext(workdir=rt.contract.workdir, editable_files=tuple(rt.contract.editable_files),
                        editable=tuple(c.editable), locked=tuple(c.locked), description=rt.spec.description,
                        phases_s=dict(doctor.phases_s), peak_memory_bytes=doctor.peak_memory_bytes,
                        memory_capacity_bytes=int(rt.spec.device.memory_capacity), step_time_s=doctor.step_time_s,
                        trials=tuple(trials), known_knobs=tuple(rt.space.names))


def _refused_names(rt: CampaignRuntime) -> set[str]:
    return {e["name"] for e in rt.ledger.events() if e["kind"] in ("patch_refused", "patch_retired")}


def patch_round(rt: CampaignRuntime, doctor: DoctorReport, trials: list[TrialResult], *,
                why: str) -> list[dict]:
    """Ask every source once; gate each proposal; grow the space. Returns the configs that
    measure each accepted patch (the best config so far with the patch on)."""
    ctx = _context(rt, doctor, trials)
    refused = _refused_names(rt)
    measure = []
    accepted_names = []
    for source in patch_sources(rt.spec, rt.cdir.root / "llm"):
        candidates, problems = source.propose(ctx, refused | {p.name for p in contract_patches(rt.contract)})
        for problem in problems:  # no candidate at all: a malformed or missing answer
            rt.ledger.append("patch_refused", {**problem, "why_asked": why})
            rt.cdir.add_warning(source.name, f"patch round ({why}): {problem['reason']}; no patch from it this round")
            refused.add(problem["name"])
        for patch in candidates:
            verdict = gate(patch, rt.contract, contract_patches(rt.contract), refused)
            if not verdict.accepted:
                rt.ledger.append("patch_refused", {"name": patch.name, "source": source.name,
                                                   "reason": verdict.reason, "diff": patch.diff, "why_asked": why})
                refused.add(patch.name)
                continue
            rt.ledger.append("patch_accepted", {"name": patch.name, "source": source.name, "knob": patch.knob,
                                                "patch": patch.to_json(), "conflicts": list(verdict.conflicts),
                                                "why_asked": why})
            rt.adopt(grown(rt.contract, add=patch, conflicts=verdict.conflicts))
            accepted_names.append(patch.name)
            measure.append(measurement_config(patch, ctx, rt.spec.baseline))
    rt.ledger.append("patch_round", {"why": why, "accepted": accepted_names,
                                     "phases_s": dict(doctor.phases_s)})
    # Patch knobs added after the best trial ran (in this round too) were off in it.
    padded = [{n: cfg.get(n, False) for n in rt.space.names} for cfg in measure]
    return [cfg for cfg in padded if rt.space.is_feasible(cfg)]


def retire_violators(rt: CampaignRuntime, result: TrialResult) -> bool:
    """A contract violation retires every patch that was on in it: a patch can keep the
    numerics in one config (bit-identical under bf16) and change them in another (fp32), so
    a run it passed elsewhere does not clear it, and which of several patches broke the
    contract cannot be told from one run. True when the space changed."""
    if result.outcome is not Outcome.CONTRACT_VIOLATION:
        return False
    on = [p for p in contract_patches(rt.contract) if result.config.get(p.knob) is True]
    retired = {e["knob"] for e in rt.ledger.events() if e["kind"] == "patch_retired"}
    changed = False
    for p in on:
        if p.knob not in retired:
            rt.ledger.append("patch_retired", {"name": p.name, "knob": p.knob, "trial_id": result.trial_id,
                                               "reason": result.reason})
            rt.adopt(grown(rt.contract, retire=p.knob))
            changed = True
    return changed
