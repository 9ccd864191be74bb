"""The InfraRSI engine as a proposer: diverse start, then model-based selection.

After every result it refits the global time model (ok trials), the censored memory model
of the peak's parts (ok trials and OOMs) and the crash model (ok trials and OOMs, which got
through start-up, against crashes, invalid configs, timeouts and contract violations),
and the cost model (log wall time of ok trials, every role), then scores every unseen
feasible config by EI x P(fit) x P(no crash) / predicted trial cost ** ``COST_EXPONENT``,
among configs that clear a bar on P(fit) and on P(no crash) (``FIT_BAR``, ``CRASH_BAR``);
when the predicted-fastest config does not fit, it pairs the memory hog with the cheapest
savers (``selection.pair_with_savers``).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from infrarsi.core.knobs import Config
from infrarsi.core.priors import Priors
from infrarsi.core.trial import Outcome
from infrarsi.engine import start
from infrarsi.engine.builtin_priors import builtin_priors
from infrarsi.engine.crash_model import CRASH_OUTCOMES, REASON_CLASS, CrashModel
from infrarsi.engine.encoding import Encoding
from infrarsi.engine.memory_components import memory_components
from infrarsi.engine.memory_model import AT_LEAST, BELOW, EXACT, MemoryModel
from infrarsi.engine.revision import revise_priors
from infrarsi.engine.selection import SettingEffects, log_expected_improvement, pair_with_savers, pick_diverse
from infrarsi.engine.time_model import TimeModel
from infrarsi.proposers.base import Proposer, SearchContext

# One config per start source (experience, priors, space-filling) before the models lead.
NUM_START_CONFIGS = 3
# Constrained acquisition: only configs likely to fit and to start (each constraint on
# its own) are candidates; EI x P(fit) x P(no crash) ranks them. Multiplying alone lets a
# huge EI outweigh a small P(fit): an OOM says little about its neighbours (a censored
# point far past the wall has almost no curvature), and a region that never runs keeps
# its optimistic prior time, so the product keeps paying for failures there. Requiring
# P(fit) >= 0.6 bounds the expected OOM rate of model-chosen trials by 40% even at the
# wall, where EI is largest once the incumbent plateaus (0.5 still lost a trial in two
# there; 0.7 rarely reached configs at the wall, where the optima sit). The crash bar is
# lower: the crash model blames every unit a crash holds that no run has cleared, so a
# config holding many untried pairs next to a crashed one reads as risky long before it
# is (on the generated development jobs, P(no crash) of 0.3-0.5 came true about 70% of
# the time), and the optimum, which stacks many features, is often among them. 0.5 kept
# the engine off it (worst decile 0.73 of the oracle at 20 trials against 0.82 at 0.3,
# development jobs, seeds 0-2), for 0.7 more crashed trials per 20-trial search (4.2
# against 3.5). The product decides only when no config clears both bars.
FIT_BAR = 0.6
CRASH_BAR = 0.3
# Cost-aware acquisition: the score is divided by the predicted wall time of the trial
# (start-up, compiling included, plus its steps) to this power. A trial's cost is what
# the campaign waits for; with the same expected improvement, the config that answers
# sooner comes first. 1 is expected improvement per second (Snoek et al. 2012); 0 ignores
# cost. The cost model starts uninformed (every config predicted to cost the same), so
# a setting is charged only after a run with it has shown what it costs, unless the
# experience bank's past campaigns on similar hardware measured it (``SettingPrior.
# log_cost_mean``): a second campaign does not pay again to learn that compiling is slow.
COST_EXPONENT = 1.0


class InfraRSIProposer(Proposer):
    name = "engine"

    def __init__(self, ctx: SearchContext) -> None:
        super().__init__(ctx)
        base = builtin_priors(ctx.space, ctx.baseline, on_cpu=ctx.on_cpu)
        self.priors: Priors = ctx.priors.merged_over(base) if isinstance(ctx.priors, Priors) else base
        self.encoding = Encoding(ctx.space, ctx.baseline)
        self.time_model = TimeModel(self.encoding, self.priors)
        self.memory_model = MemoryModel(self.encoding, self.priors, ctx.memory_capacity_bytes,
                                        memory_components(self.encoding, self.priors, on_cpu=ctx.on_cpu))
        self.crash_model = CrashModel(ctx.space, ctx.baseline)
        # Log wall seconds of a trial on the same encoding: uninformed, but where the
        # experience bank carries what a setting cost in past campaigns.
        self.cost_model = TimeModel(self.encoding, self.priors.trial_cost())
        self.cost_exponent = float(ctx.extra.get("cost_exponent", COST_EXPONENT))
        self.num_start = NUM_START_CONFIGS
        self.num_started = 0
        self.pairings: list[dict] = []
        self._stale = False

    # ---- fitting ---------------------------------------------------------------------
    def _observe(self, result) -> None:
        if self.memory_model.capacity_bytes is None and result.memory_capacity_bytes:
            self.memory_model.capacity_bytes = result.memory_capacity_bytes
        self._stale = True

    def fitted(self) -> "InfraRSIProposer":
        """This proposer with its models fitted on every observation so far (verification
        reads the time, memory and crash models of all trials through it)."""
        if self._stale or not self.history:
            self._refit()
        return self

    def _refit(self) -> None:
        ok = [r for r in self.history if r.outcome is Outcome.OK]
        self.time_model.fit(self.encoding.configs([r.config for r in ok]), np.log([r.step_time_s for r in ok]))
        self._fit_memory()
        timed = [r for r in ok if r.wall_time_s > 0]
        self.cost_model.fit(self.encoding.configs([r.config for r in timed]), np.log([r.wall_time_s for r in timed]))
        # An OOM got as far as allocating for a training step: start-up, compiling the
        # step and the first collectives went through, where the crashes the model learns
        # happen, so it clears the units it holds as an ok run does.
        ran = [r for r in self.history if r.outcome in (Outcome.OK, Outcome.OOM) or r.outcome in CRASH_OUTCOMES]
        self.crash_model.fit(self.encoding.configs([r.config for r in ran]), np.array([r.outcome in CRASH_OUTCOMES for r in ran]),
                             [r.trial_id for r in ran], [REASON_CLASS.get(r.outcome, "ok") for r in ran])
        self._stale = False

    def _fit_memory(self) -> None:
        configs, kinds, values = [], [], []
        for r in self.history:
            cap = r.memory_capacity_bytes or self.memory_model.capacity_bytes
            if r.outcome is Outcome.OK and r.peak_memory_bytes:
                obs = (EXACT, r.peak_memory_bytes)
            elif r.outcome is Outcome.OK and cap:
                obs = (BELOW, cap)
            elif r.outcome is Outcome.OOM and (cap or r.peak_memory_bytes):
                obs = (AT_LEAST, max(cap or 0, r.peak_memory_bytes or 0))
            else:
                continue
            configs.append(r.config)
            kinds.append(obs[0])
            values.append(math.log(obs[1]))
        self.memory_model.fit(self.encoding.configs(configs), np.array(kinds), np.array(values))

    # ---- proposing -------------------------------------------------------------------
    def _available(self) -> np.ndarray:
        avail = np.ones(len(self.space.feasible), dtype=bool)
        for key in self._seen:
            row = self.encoding.feasible_row.get(key)
            if row is not None:
                avail[row] = False
        return avail

    def _propose(self, num_configs: int) -> list[Config]:
        if self._stale or not self.history:
            self._refit()
        avail = self._available()
        rows: list[int] = []
        if self.num_started < self.num_start:
            rows = self._start_rows(min(num_configs, self.num_start - self.num_started), avail)
            self.num_started += len(rows)
            avail[rows] = False
        rows += self._model_rows(num_configs - len(rows), avail, rows)
        return [dict(self.space.feasible[i]) for i in rows]

    def _start_rows(self, num_configs: int, avail: np.ndarray) -> list[int]:
        x = self.space.feasible_index_matrix
        # Start configs must clear the crash bar too: a crash among the first trials makes
        # the next prior-best config (often the same settings plus one) just as suspect.
        avail = avail & (self.crash_model.no_crash_probability(x) >= CRASH_BAR)
        exp_rows = [r for r in start.experience_rows(self.space, self.ctx.experience_configs,
                                                     self.encoding.feasible_row, self.ctx.baseline) if avail[r]]
        prior_mean, _ = self.time_model.predict_main(self.encoding.feasible_main)
        p_fit = self.memory_model.fit_probability_main(self.encoding.feasible_main)
        prior_rows = start.prior_best_rows(x, prior_mean, p_fit, avail, num_configs)
        observed = ~self._available()
        anchors = np.vstack([x[observed], np.array([self.encoding.baseline_indices])])
        # Sequential callers ask for one config at a time: rotate the sources by the number
        # of start configs already given, so that each source gets its turn.
        return start.diverse_start(x, [exp_rows, prior_rows], anchors, avail, num_configs, self.rng,
                                   first=self.num_started)

    def _log_scores(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        main = self.encoding.feasible_main
        mean, sd = self.time_model.predict_main(main)
        p_fit = self.memory_model.fit_probability_main(main)
        p_ok = self.crash_model.no_crash_probability(self.space.feasible_index_matrix)
        log_ei = log_expected_improvement(mean, sd, self._best_log_time())
        log_score = log_ei + np.log(np.maximum(p_fit, 1e-300)) + np.log(np.maximum(p_ok, 1e-300))
        if self.cost_exponent:
            log_score = log_score - self.cost_exponent * self.cost_model.predict_main(main)[0]
        return log_score, mean, p_fit, p_ok

    def _best_log_time(self) -> float:
        times = [r.step_time_s for r in self.history if r.outcome is Outcome.OK]
        if times:
            return math.log(min(times))
        # Nothing ran yet: improve on the predicted baseline (all-zero encoding).
        return float(self.time_model.predict_main(np.zeros((1, self.encoding.num_settings)))[0][0])

    def _model_rows(self, num_configs: int, avail: np.ndarray, chosen: list[int]) -> list[int]:
        if num_configs <= 0 or not avail.any():
            return []
        log_score, mean, p_fit, p_ok = self._log_scores()
        picks = []
        paired = self._pairing_row(mean, p_fit, p_ok, avail)
        if paired is not None:
            picks.append(paired)
            avail = avail.copy()
            avail[paired] = False
        likely = avail & (p_fit >= FIT_BAR) & (p_ok >= CRASH_BAR)
        x = self.space.feasible_index_matrix
        picks += pick_diverse(x, log_score, likely, num_configs - len(picks), chosen + picks)
        # Only when too few configs clear the bars does the product rank the rest.
        return picks + pick_diverse(x, log_score, avail, num_configs - len(picks), chosen + picks)

    def _pairing_row(self, mean: np.ndarray, p_fit: np.ndarray, p_ok: np.ndarray,
                     avail: np.ndarray) -> int | None:
        """The explicit memory-saver pairing for the predicted-fastest config, if it OOMs."""
        if not self.memory_model.capacity_bytes or self.memory_model.num_observations == 0:
            return None
        candidates = avail & (p_ok >= CRASH_BAR)
        if not candidates.any():
            return None
        fast = int(np.argmin(np.where(candidates, mean, np.inf)))
        if p_fit[fast] >= FIT_BAR:
            return None
        idx, record = pair_with_savers(self.space, self.space.feasible_index_matrix[fast], self.effects(),
                                       self._log_peak, self._fit_probability, target=FIT_BAR)
        if idx is None:
            return None
        row = self.encoding.feasible_row.get(self.space.key(self.space.from_indices(idx)))
        # The savers may bring in a setting the crash model distrusts: same bar as any pick.
        if row is None or not avail[row] or p_ok[row] < CRASH_BAR:
            return None
        record["round"] = len(self.history)
        self.pairings.append(record)
        return row

    def effects(self) -> SettingEffects:
        """Posterior main effects as per-knob, per-value tables (baseline value = 0)."""
        t_mean, _ = self.time_model.main_effects()
        m_mean, _ = self.memory_model.main_effects()
        time_tab = [np.zeros(len(k.values)) for k in self.space.knobs]
        mem_tab = [np.zeros(len(k.values)) for k in self.space.knobs]
        for j, (k, v) in enumerate(self.encoding.settings):
            time_tab[k][v], mem_tab[k][v] = t_mean[j], m_mean[j]
        return SettingEffects(time_tab, mem_tab)

    def _log_peak(self, idx: np.ndarray) -> float:
        return float(self.memory_model.predict_main(self.encoding.main(idx[None]))[0][0])

    def _fit_probability(self, idx: np.ndarray) -> float:
        return float(self.memory_model.fit_probability_main(self.encoding.main(idx[None]))[0])

    # ---- report ----------------------------------------------------------------------
    def describe(self) -> dict[str, Any]:
        if self._stale or not self.history:
            self._refit()
        return {
            "priors_source": self.priors.source,
            "memory_prices": self.memory_prices(),
            "time_interactions": self.time_model.interactions(),
            "time_noise_log_sd": self.time_model.noise_std,
            "cost_exponent": self.cost_exponent,
            "trial_cost_effects": self.trial_cost_effects(),
            "prior_revision": revise_priors(self.encoding, self.priors, self.time_model, self.memory_model),
            "crash_evidence": self.crash_model.flagged(),
            "pairing_decisions": self.pairings,
            "best_so_far": self._best_so_far(),
        }

    def memory_prices(self) -> list[dict]:
        t_mean, t_sd = self.time_model.main_effects()
        m_mean, m_sd = self.memory_model.main_effects()
        bytes_rel = self.memory_model.price_bytes()
        return [{"knob": self.encoding.label(j)[0], "value": self.encoding.label(j)[1],
                 "log_memory_effect": float(m_mean[j]), "log_memory_sd": float(m_sd[j]),
                 "bytes_vs_baseline": float(bytes_rel[j]),
                 "log_time_effect": float(t_mean[j]), "log_time_sd": float(t_sd[j])}
                for j in range(self.encoding.num_settings)]

    def trial_cost_effects(self) -> list[dict]:
        """Each setting's posterior effect on a trial's log wall time (vs the baseline's)."""
        mean, sd = self.cost_model.main_effects()
        return [{"knob": self.encoding.label(j)[0], "value": self.encoding.label(j)[1],
                 "log_cost_effect": float(mean[j]), "log_cost_sd": float(sd[j])}
                for j in range(self.encoding.num_settings)]

    def _best_so_far(self) -> dict | None:
        ok = [r for r in self.history if r.outcome is Outcome.OK]
        if not ok:
            return None
        best = min(ok, key=lambda r: r.step_time_s)
        return {"trial_id": best.trial_id, "config": dict(best.config), "step_time_s": best.step_time_s}


def warm_start_configs(ctx: SearchContext, baseline_result) -> list[Config]:
    """The engine's start configs after observing only ``baseline_result`` (one batch of
    ``NUM_START_CONFIGS``, one per start source): the warm start other proposers get
    (``SearchContext.extra["warm_start_configs"]``) for a fair comparison. A sequential
    engine asks the same sources in the same order, so its first config is the first of these."""
    engine = InfraRSIProposer(ctx)
    engine.observe(baseline_result)
    return engine.suggest(NUM_START_CONFIGS)
