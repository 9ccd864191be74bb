"""Diverse start: the first configs come from several sources, never one incumbent.

Sources, interleaved round-robin so a small first batch still samples each (and a
caller asking one config at a time gets them in turn): the
experience bank's configs, the configs the priors predict best (that are predicted to fit),
and a maximin space-filling design over one-hot Hamming distance (seeded tie-breaks).
"""

from __future__ import annotations

import numpy as np

from infrarsi.engine.selection import hamming_to_nearest, pick_diverse
from infrarsi.knobs import Config, KnobSpace


def experience_rows(space: KnobSpace, configs: tuple[Config, ...], row_of: dict[tuple, int]) -> list[int]:
    """Feasible-matrix rows of the bank's configs; invalid or infeasible ones are skipped
    (a config from other hardware may name values this space lacks)."""
    rows = []
    for cfg in configs:
        if set(cfg) != set(space.names):
            continue
        row = row_of.get(tuple(cfg[n] for n in space.names))
        if row is not None:
            rows.append(row)
    return rows


def maximin_rows(index_matrix: np.ndarray, anchors: np.ndarray, available: np.ndarray,
                 num_configs: int, rng: np.random.Generator) -> list[int]:
    """Greedy maximin: each pick is as far (Hamming) as possible from the anchors and the
    earlier picks; a seeded random jitter below 1 breaks ties without overriding distance."""
    jitter = rng.random(len(index_matrix))
    dist = hamming_to_nearest(index_matrix, anchors).astype(float)
    avail = available.copy()
    picks: list[int] = []
    for _ in range(num_configs):
        if not avail.any():
            break
        best = int(np.argmax(np.where(avail, dist + jitter, -np.inf)))
        picks.append(best)
        avail[best] = False
        dist = np.minimum(dist, (index_matrix != index_matrix[best]).sum(axis=1))
    return picks


def prior_best_rows(index_matrix: np.ndarray, prior_log_time: np.ndarray, fit_probability: np.ndarray,
                    available: np.ndarray, num_configs: int) -> list[int]:
    """Fastest under the prior time model among configs predicted to fit, diversified."""
    score = np.where(fit_probability >= 0.5, -prior_log_time, -np.inf)
    return pick_diverse(index_matrix, score, available & np.isfinite(score), num_configs)


def interleave(sources: list[list[int]], num_configs: int, first: int = 0) -> list[int]:
    """Round-robin over the non-empty sources, starting at source ``first`` (mod their
    number), de-duplicated, up to ``num_configs``."""
    live = [s for s in sources if s]
    if not live:
        return []
    shift = first % len(live)
    live = live[shift:] + live[:shift]
    out: list[int] = []
    for i in range(max(len(s) for s in live)):
        for src in live:
            if i < len(src) and src[i] not in out and len(out) < num_configs:
                out.append(src[i])
    return out
