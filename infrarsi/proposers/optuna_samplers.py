"""Optuna samplers (TPE, GP) as proposers, driven by ask-and-tell.

Optuna samplers ignore FAIL trials, so an OOM recorded as FAIL would teach them nothing.
Here every finished trial is told as COMPLETE with constraints ``oom``, ``crash`` (crash,
invalid, timeout) and ``violation`` (contract violation) (``Trial.set_constraint``;
feasible when <= 0) and, for failures, a pessimistic value (the worst time seen), so
constraint-aware samplers learn where the memory wall and the crashes are.
``SearchContext.extra["warm_start_configs"]`` are enqueued, so a sampler can start from
the same configs as the engine; priors they cannot take.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from infrarsi.core.knobs import Config
from infrarsi.core.trial import Outcome, TrialResult
from infrarsi.proposers.base import Proposer, SearchContext

_CONSTRAINT = {Outcome.OOM: "oom", Outcome.CONTRACT_VIOLATION: "violation"}


class _OptunaProposer(Proposer):
    def __init__(self, ctx: SearchContext) -> None:
        super().__init__(ctx)
        import optuna  # lazy: only these proposers need it

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self._optuna = optuna
        self._dists = {k.name: optuna.distributions.CategoricalDistribution(k.values) for k in self.space.knobs}
        self.study = optuna.create_study(direction="minimize", sampler=self._make_sampler(ctx.seed))
        self._pending: dict[tuple, Any] = {}
        self._known: dict[tuple, tuple[float, dict[str, float]]] = {}
        # A warm start (the engine's start configs, ``warm_start_configs``): asked first, in order.
        for cfg in ctx.extra.get("warm_start_configs", ()):
            self.study.enqueue_trial(dict(cfg), skip_if_exists=True)

    def _make_sampler(self, seed: int) -> Any:
        raise NotImplementedError

    def _penalty(self) -> float:
        times = [v for v, _ in self._known.values() if math.isfinite(v)]
        return max(times) + math.log(2.0) if times else 0.0

    def _tell(self, trial: Any, value: float, constraints: dict[str, float]) -> None:
        for key, c in constraints.items():
            trial.set_constraint(key, c)
        self.study.tell(trial, value)

    def _propose(self, num_configs: int) -> list[Config]:
        out: list[Config] = []
        for _ in range(num_configs):
            trial = self.study.ask(self._dists)  # one sampler fit per suggestion
            cfg = {n: trial.params[n] for n in self.space.names}
            key = self.space.key(cfg)
            taken = self._seen | set(self._pending) | {self.space.key(c) for c in out}
            if self.space.is_feasible(cfg) and key not in taken:
                self._pending[key] = trial
                out.append(cfg)
                continue
            # Optuna samples the product space and knows no constraints: move an infeasible
            # or repeated point to the nearest feasible unseen config (a user would do the
            # same) and tell the sampler the config it will actually get, not a fake value.
            self.study.tell(trial, state=self._optuna.trial.TrialState.FAIL)
            nearest = self._nearest_unseen(cfg, taken)
            if nearest is not None:
                out.append(nearest)
        return out

    def _nearest_unseen(self, cfg: Config, taken: set[tuple]) -> Config | None:
        idx = self.space.feasible_index_matrix
        if not len(idx):
            return None
        target = np.array(self.space.indices(cfg))
        distance = (idx != target).sum(axis=1) + self.rng.random(len(idx)) * 0.5  # random tie-break
        for row in np.argsort(distance):
            candidate = self.space.from_indices(idx[row])
            if self.space.key(candidate) not in taken:
                return candidate
        return None

    def _observe(self, result: TrialResult) -> None:
        key = self.space.key(result.config)
        # One constraint per reason class; a contract violation is its own.
        cons = {"oom": 0.0, "crash": 0.0, "violation": 0.0}
        if result.outcome is Outcome.OK:
            value = math.log(result.step_time_s)
        else:
            value = self._penalty()
            cons[_CONSTRAINT.get(result.outcome, "crash")] = 1.0
        self._known[key] = (value, cons)
        trial = self._pending.pop(key, None)
        if trial is not None:
            self._tell(trial, value, cons)
        else:  # a result the sampler did not ask for (the baseline, a resumed trial)
            self.study.add_trial(self._optuna.trial.create_trial(
                params=dict(result.config), distributions=self._dists, value=value, constraints=cons,
            ))


class TPEProposer(_OptunaProposer):
    name = "tpe"

    def _make_sampler(self, seed: int) -> Any:
        return self._optuna.samplers.TPESampler(seed=seed, n_startup_trials=5, multivariate=True)


class GPProposer(_OptunaProposer):
    name = "gp"

    def _make_sampler(self, seed: int) -> Any:
        return self._optuna.samplers.GPSampler(seed=seed, n_startup_trials=5)
