"""run (search half): the proposer suggests, trials fan out over the pool, every result
is checked against the contract, recorded, and fed back before the next suggestion.

Before the first suggestion (after doctor), and again whenever the search stalls
(``patching.stalled``: no slot is refilled then, and the round runs once the trials in
flight are in), a patch round (``stages.patching``) asks the patch sources for code
changes aimed at doctor's profile; each accepted patch becomes a knob, the proposer is
rebuilt over the grown space and replays the history with the new knob off, and the patch
is measured first on the best config so far. Start configs and priors come from the
experience bank's nearest past campaigns where the flow hands them in
(``infrarsi.bank.campaign.campaign_experience``; none with the bank off).

The proposer starts from every run doctor made at the contract's seed: the baseline
repeats and the calibration variants are configs of the space, so it learns from them
and never suggests them again. The search runs ``num_trials`` trials, fewer where the
campaign's trial cap must leave verification its reserve (``infrarsi.stages.run.reserve``)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from infrarsi.bank.similarity import Experience
from infrarsi.contract.checks import enforce
from infrarsi.core.knobs import Config
from infrarsi.core.priors import Priors
from infrarsi.core.trial import Role, TrialResult
from infrarsi.proposers import Proposer, SearchContext, make_proposer
from infrarsi.stages.doctor import DoctorReport, baseline_observation
from infrarsi.stages.run.reserve import search_trials, verification_reserve
from infrarsi.stages.runtime import CampaignRuntime


@dataclass(frozen=True, kw_only=True)
class SearchOutcome:
    proposer: str
    trials: tuple[TrialResult, ...]  # final attempts of search trials, in completion order
    describe: dict[str, Any]
    history: tuple[TrialResult, ...] = ()  # every contract-seed run the proposer saw, doctor's first
    priors: Any = None  # what the proposer started from (built-in or LLM, under the bank's)


def search_priors(rt: CampaignRuntime) -> Any:
    """Built-in priors, under the LLM's where the spec names an endpoint. Every fallback
    and dropped answer is a ledger event, so nothing the LLM said is lost, and a campaign
    warning (console and report). The LLM's
    answer is stored with the campaign (``priors.json``): a resumed campaign uses it and
    does not ask again."""
    from infrarsi.adapters.llm import LLMSettings, priors_or_fallback
    from infrarsi.engine.builtin_priors import builtin_priors
    from infrarsi.harness import machine

    spec, baseline = rt.spec, rt.space.validate(rt.spec.baseline)
    settings = LLMSettings(**spec.llm.model_dump()) if spec.llm else None
    if settings is not None and rt.cdir.priors.exists():
        return priors_from_json(rt.cdir.read_json(rt.cdir.priors))
    fallback = builtin_priors(rt.space, baseline, on_cpu=rt.backend.trials_on_cpu(rt.spec))
    priors, warnings = priors_or_fallback(settings, rt.space, baseline, workload_description=spec.description,
                                          hardware_description=machine.describe(dict(rt.contract.hardware)),
                                          fallback=fallback, log_dir=rt.cdir.root / "llm")
    if settings is not None:
        rt.ledger.append("priors", {"source": priors.source, "warnings": warnings})
        rt.cdir.write_json(rt.cdir.priors, priors_to_json(priors))
        for warning in warnings:
            rt.cdir.add_warning("llm", warning)
    return priors


def priors_to_json(priors: Any) -> dict[str, Any]:
    from dataclasses import asdict

    return {"source": priors.source, "settings": [asdict(p) for p in priors.settings.values()]}


def priors_from_json(data: dict[str, Any]) -> Any:
    from infrarsi.core.priors import Priors, SettingPrior

    return Priors.of((SettingPrior(**p) for p in data["settings"]), data["source"])


def build_proposer(rt: CampaignRuntime, name: str, priors: Any = None,
                   experience: tuple[Config, ...] = ()) -> Proposer:
    spec = rt.spec
    ctx = SearchContext(space=rt.space, baseline=rt.space.validate(spec.baseline),
                        memory_capacity_bytes=int(spec.device.memory_capacity), seed=spec.search.seed,
                        priors=with_patch_priors(priors, rt), on_cpu=rt.backend.trials_on_cpu(rt.spec),
                        experience_configs=tuple(experience))
    return make_proposer(name, ctx)


def with_patch_priors(priors: Any, rt: CampaignRuntime) -> Any:
    """``priors`` plus each patch's own claim (expected time and memory multipliers) as a
    weak prior on its knob."""
    from infrarsi.core.priors import Priors, SettingPrior
    from infrarsi.patches.patch import contract_patches

    claims = [SettingPrior(knob=p.knob, value=True, log_time_mean=math.log(p.expected_time_effect),
                           log_memory_mean=math.log(p.expected_memory_effect), source="patch metadata",
                           rationale=p.title) for p in contract_patches(rt.contract)]
    if not claims:
        return priors
    own = Priors.of(claims, "patch metadata")
    return own.merged_over(priors) if isinstance(priors, Priors) else own


def padded(r: TrialResult, names: list[str]) -> TrialResult:
    """A trial run before a patch knob existed had that patch off."""
    missing = [n for n in names if n not in r.config]
    return r.replace(config={**r.config, **dict.fromkeys(missing, False)}) if missing else r


def _final(results: list[TrialResult], roles: set[Role]) -> list[TrialResult]:
    return [r for r in results if r.role in roles and not r.extra.get("retried")]


def contract_seed_history(rt: CampaignRuntime, doctor: DoctorReport) -> list[TrialResult]:
    """Every final run at the contract's seed, in the order run: doctor's baseline repeats
    and calibration variants (a cached doctor's baseline as one observation), then the
    search's. Runs at canary seeds are verification's, not the search's."""
    history = [r for r in _final(rt.ledger.trials(), {Role.DOCTOR, Role.CALIBRATE, Role.SEARCH})
               if r.extra.get("job_seed") is None]
    if not any(r.role is Role.DOCTOR for r in history):  # doctor came from the cache
        history.insert(0, baseline_observation(doctor, int(rt.spec.device.memory_capacity)))
    return history


def run_search(rt: CampaignRuntime, doctor: DoctorReport, *, proposer_name: str, num_trials: int,
               priors: Any = None, experience: Experience | None = None) -> SearchOutcome:
    """Search ``num_trials`` trials (fewer where the cap needs them for verification),
    starting from ``experience``, the bank's past campaigns, where given."""
    from infrarsi.stages.run import patching

    priors = priors if priors is not None else search_priors(rt)
    configs = experience.configs if experience is not None else ()
    if experience is not None and experience.priors is not None:  # measured on similar jobs: over the guesses
        priors = experience.priors.merged_over(priors) if isinstance(priors, Priors) else experience.priors
    observed = contract_seed_history(rt, doctor)  # what the proposer has seen, in order
    doctor_used = sum(1 for r in observed if r.role is not Role.SEARCH and r.trial_id != "doctor")
    num_trials = _search_share(rt, num_trials, doctor_used)

    def rebuilt(old: Proposer | None = None) -> Proposer:  # over the current space, the history replayed
        p = build_proposer(rt, proposer_name, priors, configs)
        for r in observed:
            p.observe(padded(r, rt.space.names))
        if hasattr(old, "num_started"):  # the engine's diverse start is spent once per campaign
            p.num_started = old.num_started
        return p

    done = [r for r in observed if r.role is Role.SEARCH]
    proposer = rebuilt()
    pool = rt.pool
    batch = rt.spec.search.batch_size or pool.num_slots
    submitted = len(done)
    queued: list[Config] = []  # patch measurements, run before the proposer's next picks
    max_rounds = rt.spec.search.patch_rounds if patching.patch_sources(rt.spec, None) else 0
    last_round = len(done)
    round_due = False  # once due, no slot is refilled: the round runs when the in-flight trials are in
    while True:
        rounds = patching.rounds_done(rt)
        round_due = round_due or (not queued and submitted < num_trials and rounds < max_rounds
                                  and (rounds == 0 or patching.stalled(done, since=last_round)))
        if round_due and not pool.busy:
            queued = patching.patch_round(rt, doctor, observed, why="after doctor" if rounds == 0 else "search stalled")
            last_round, round_due = len(done), False
            if queued:
                proposer = rebuilt(proposer)
        while not round_due and pool.free_slots and submitted < num_trials:
            configs = [queued.pop(0)] if queued else proposer.suggest(min(pool.free_slots, batch,
                                                                          num_trials - submitted))
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
                done.append(r)
                observed.append(r)
                if patching.retire_violators(rt, r):
                    proposer = rebuilt(proposer)
                else:
                    proposer.observe(padded(r, rt.space.names))
    outcome = SearchOutcome(proposer=proposer_name, trials=tuple(done), describe=proposer.describe(),
                            history=tuple(observed), priors=priors)
    rt.cdir.write_json(rt.cdir.search, {"proposer": proposer_name, "describe": outcome.describe,
                                        "num_trials": len(done), "budget": num_trials})
    return outcome


def _search_share(rt: CampaignRuntime, asked: int, doctor_used: int) -> int:
    """The search trials the cap leaves of the ``asked`` ones, logged on the MLflow parent
    run; a warning says so when the cap cuts them."""
    share = search_trials(rt.spec, asked, doctor_used, rt.max_trials)
    rt.tracker.log_params({"num_trials": share}, rt.contract.campaign_id)
    if share < asked:
        reserve = verification_reserve(rt.spec)
        rt.cdir.add_warning("budget", (
            f"the search runs {share} of the {asked} trials asked (--budget or budget.num_trials): the campaign's "
            f"cap, {rt.max_trials} trials (budget.max_trials), holds doctor's {doctor_used} and verification's "
            f"reserve of {reserve}; raise budget.max_trials to {doctor_used + asked + reserve} to run them all"))
    return share
