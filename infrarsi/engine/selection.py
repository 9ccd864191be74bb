"""Selection: score candidates, pick a diverse batch, and pair memory hogs with savers.

Score = EI(log step time) x P(fits in memory) x P(no crash) (the engine divides it by the
predicted trial cost: ``engine_proposer.COST_EXPONENT``), computed in log space so the
product never underflows. A batch is picked greedily; each candidate's score is multiplied
by 1 - 0.5**d, d its Hamming distance to the nearest config already in the batch, so
parallel slots do not all probe one neighbourhood (local penalisation: a cheap stand-in
for re-fitting the models on "believed" outcomes after each pick).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np
from scipy import special

from infrarsi.core.knobs import KnobSpace

_LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)


def log_expected_improvement(mean: np.ndarray, sd: np.ndarray, best: float) -> np.ndarray:
    """log E[max(best - f, 0)] for f ~ N(mean, sd^2), stable far into the tail."""
    sd = np.maximum(sd, 1e-9)
    z = (best - mean) / sd
    out = np.empty_like(z)
    body = z > -6.0
    zb = z[body]
    out[body] = np.log(np.maximum(zb * special.ndtr(zb) + np.exp(-0.5 * zb**2 - _LOG_SQRT_2PI), 1e-300))
    zt = z[~body]  # z*Phi(z) + phi(z) ~ phi(z) / z^2 as z -> -inf
    out[~body] = -0.5 * zt**2 - _LOG_SQRT_2PI - 2.0 * np.log(-zt)
    return out + np.log(sd)


def hamming_to_nearest(index_matrix: np.ndarray, chosen: np.ndarray) -> np.ndarray:
    """Per row, the number of knobs it differs in from its nearest row of ``chosen``."""
    if len(chosen) == 0:
        return np.full(len(index_matrix), index_matrix.shape[1], dtype=np.int64)
    dist = np.full(len(index_matrix), np.iinfo(np.int64).max)
    for row in chosen:
        dist = np.minimum(dist, (index_matrix != row).sum(axis=1))
    return dist


def pick_diverse(index_matrix: np.ndarray, log_score: np.ndarray, available: np.ndarray,
                 num_configs: int, chosen: list[int] | None = None) -> list[int]:
    """Greedy batch: best penalised score first, penalty 1 - 0.5**distance to the batch."""
    chosen = list(chosen or [])
    picks: list[int] = []
    avail = available.copy()
    avail[chosen] = False
    for _ in range(num_configs):
        if not avail.any():
            break
        # Distance 0 is a chosen row itself (unavailable); clip it to keep the log finite.
        dist = np.maximum(hamming_to_nearest(index_matrix, index_matrix[chosen + picks]), 1)
        penalised = np.where(avail, log_score + np.log1p(-(0.5 ** dist.astype(float))), -np.inf)
        best = int(np.argmax(penalised))
        picks.append(best)
        avail[best] = False
    return picks


@dataclass(frozen=True)
class SettingEffects:
    """Per knob, per value: posterior log-time and log-memory effects vs the baseline."""

    log_time: list[np.ndarray]
    log_memory: list[np.ndarray]


def pair_with_savers(space: KnobSpace, fast: np.ndarray, effects: SettingEffects,
                     log_peak: Callable[[np.ndarray], float], fit_probability: Callable[[np.ndarray], float],
                     *, target: float = 0.5, max_savers: int = 3) -> tuple[np.ndarray | None, dict]:
    """Make ``fast`` (value indices) fit by switching in the cheapest memory savers.

    The memory-hungry setting is the fast config's setting with the largest memory price
    among those that buy time; it is kept. Each step switches one other knob to the value
    that costs the least log time per byte saved (a saver that also saves time costs < 0
    and wins), until P(fit) >= ``target``. Returns the new indices (None when no saver
    gets there) and a record of every step for the report.
    """
    hungry = _hungry_knob(fast, effects)
    record = {"fast_config": space.from_indices(fast), "fast_fit_probability": fit_probability(fast),
              "hungry_setting": _label(space, hungry, fast[hungry]) if hungry is not None else None,
              "steps": []}
    current = fast.copy()
    for _ in range(max_savers):
        step = _cheapest_saver(space, current, hungry, effects, log_peak)
        if step is None:
            break
        k, v, cost, saved = step
        current = current.copy()
        current[k] = v
        record["steps"].append({"saver": _label(space, k, v), "bytes_saved": saved,
                                "log_time_cost": cost * saved, "log_time_cost_per_gib": cost * 2**30,
                                "fit_probability": fit_probability(current)})
        if record["steps"][-1]["fit_probability"] >= target:
            record["paired_config"] = space.from_indices(current)
            return current, record
    return None, record


def _hungry_knob(fast: np.ndarray, effects: SettingEffects) -> int | None:
    best, best_price = None, 0.0
    for k, v in enumerate(fast):
        price, gain = effects.log_memory[k][v], -effects.log_time[k][v]
        if price > best_price and gain > 0:
            best, best_price = k, price
    return best


def _cheapest_saver(space: KnobSpace, current: np.ndarray, hungry: int | None,
                    effects: SettingEffects, log_peak: Callable) -> tuple[int, int, float, float] | None:
    peak = math.exp(log_peak(current))
    best = None
    for k, knob in enumerate(space.knobs):
        if k == hungry:
            continue
        for v in range(len(knob.values)):
            d_mem = effects.log_memory[k][v] - effects.log_memory[k][current[k]]
            if v == current[k] or d_mem >= 0:
                continue
            cand = current.copy()
            cand[k] = v
            if not space.is_feasible(space.from_indices(cand)):
                continue
            saved = peak * -math.expm1(d_mem)
            cost = (effects.log_time[k][v] - effects.log_time[k][current[k]]) / saved
            if best is None or cost < best[2]:
                best = (k, v, float(cost), float(saved))
    return best


def _label(space: KnobSpace, k: int, v: int) -> dict:
    knob = space.knobs[k]
    return {"knob": knob.name, "value": knob.values[int(v)]}
