"""run (search half): the proposer suggests, trials fan out over the pool, every result
is checked against the contract, recorded, and fed back before the next suggestion."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from infrarsi.checks import enforce
from infrarsi.proposers import Proposer, SearchContext, make_proposer
from infrarsi.runtime import CampaignRuntime
from infrarsi.stages.doctor import DoctorReport, baseline_observation
from infrarsi.trial import Outcome, Role, TrialResult


@dataclass(frozen=True, kw_only=True)
class SearchOutcome:
    proposer: str
    trials: tuple[TrialResult, ...]  # final attempts of search trials, in completion order
    describe: dict[str, Any]


def search_priors(rt: CampaignRuntime) -> Any:
    """Built-in priors, under the LLM's where the spec names an endpoint. Every fallback
    and dropped answer is a ledger event, so nothing the LLM said is lost. The LLM's
    answer is stored with the campaign (``priors.json``): a resumed campaign uses it and
    does not ask again."""
    from infrarsi import hardware
    from infrarsi.adapters.llm import LLMSettings, priors_or_fallback
    from infrarsi.engine.builtin_priors import builtin_priors

    spec, baseline = rt.spec, rt.space.validate(rt.spec.baseline)
    settings = LLMSettings(**spec.llm.model_dump()) if spec.llm else None
    if settings is not None and rt.cdir.priors.exists():
        return priors_from_json(rt.cdir.read_json(rt.cdir.priors))
    fallback = builtin_priors(rt.space, baseline, on_cpu=rt.spec.trials_on_cpu)
    priors, warnings = priors_or_fallback(settings, rt.space, baseline, workload_description=spec.description,
                                          hardware_description=hardware.describe(dict(rt.contract.hardware)),
                                          fallback=fallback, log_dir=rt.cdir.root / "llm")
    if settings is not None:
        rt.ledger.append("priors", {"source": priors.source, "warnings": warnings})
        rt.cdir.write_json(rt.cdir.priors, priors_to_json(priors))
    return priors


def priors_to_json(priors: Any) -> dict[str, Any]:
    from dataclasses import asdict

    return {"source": priors.source, "settings": [asdict(p) for p in priors.settings.values()]}


def priors_from_json(data: dict[str, Any]) -> Any:
    from infrarsi.priors import Priors, SettingPrior

    return Priors.of((SettingPrior(**p) for p in data["settings"]), data["source"])


def build_proposer(rt: CampaignRuntime, name: str, priors: Any = None) -> Proposer:
    spec = rt.spec
    ctx = SearchContext(space=rt.space, baseline=rt.space.validate(spec.baseline),
                        memory_capacity_bytes=int(spec.device.memory_capacity), seed=spec.search.seed,
                        priors=priors, on_cpu=rt.spec.trials_on_cpu)
    return make_proposer(name, ctx)


def _final(results: list[TrialResult], roles: set[Role]) -> list[TrialResult]:
    return [r for r in results if r.role in roles and not r.extra.get("retried")]


def run_search(rt: CampaignRuntime, doctor: DoctorReport, *, proposer_name: str, num_trials: int,
               priors: Any = None) -> SearchOutcome:
    proposer = build_proposer(rt, proposer_name, priors if priors is not None else search_priors(rt))
    history = rt.ledger.trials()
    if not _final(history, {Role.DOCTOR}):  # doctor came from the cache
        proposer.observe(baseline_observation(doctor, int(rt.spec.device.memory_capacity)))
    for r in _final(history, {Role.DOCTOR, Role.SEARCH}):  # a resumed campaign replays its ledger
        proposer.observe(r)
    done = _final(history, {Role.SEARCH})
    pool = rt.pool
    batch = rt.spec.search.batch_size or pool.num_slots
    submitted = len(done)
    while True:
        while pool.free_slots and submitted < num_trials:
            configs = proposer.suggest(min(pool.free_slots, batch, num_trials - submitted))
            if not configs:
                break
            for cfg in configs:
                pool.submit(rt.request(cfg, Role.SEARCH))
                submitted += 1
        if not pool.busy:
            break
        for r in pool.wait():
            r = rt.final(enforce(r, rt.spec.contract, doctor.loss_reference))
            if rt.needs_remeasure(r):
                r, again = rt.remeasure(r)
                pool.submit(again)
            rt.record(r)
            if not r.extra.get("retried"):
                proposer.observe(r)
                done.append(r)
    outcome = SearchOutcome(proposer=proposer_name, trials=tuple(done), describe=proposer.describe())
    rt.cdir.write_json(rt.cdir.search, {"proposer": proposer_name, "describe": outcome.describe,
                                        "num_trials": len(done)})
    return outcome


def finalists(trials: list[TrialResult] | tuple[TrialResult, ...], doctor: DoctorReport, num: int) -> list[TrialResult]:
    """The fastest distinct ok configs that beat the baseline by more than its noise."""
    best: dict[tuple, TrialResult] = {}
    for r in trials:
        if r.outcome is not Outcome.OK or r.config == doctor.baseline:
            continue
        key = tuple(sorted(r.config.items()))
        if key not in best or r.step_time_s < best[key].step_time_s:
            best[key] = r
    floor = doctor.step_time_s / (1 + doctor.noise_cv)
    ranked = sorted((r for r in best.values() if r.step_time_s < floor), key=lambda r: r.step_time_s)
    return ranked[:num]
