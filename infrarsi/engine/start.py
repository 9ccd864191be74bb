"""Diverse start: the first configs come from several sources, never one incumbent.

Sources, interleaved round-robin so a small first batch still samples each (and a
caller asking one config at a time gets them in turn): the
experience bank's configs, the configs the priors predict best (that are predicted to fit),
and a maximin space-filling design over one-hot Hamming distance (seeded tie-breaks), away
from everything run or picked before it.
"""

from __future__ import annotations

import numpy as np

from infrarsi.core.knobs import Config, KnobSpace
from infrarsi.engine.selection import hamming_to_nearest, pick_diverse


def experience_rows(space: KnobSpace, configs: tuple[Config, ...], row_of: dict[tuple, int],
                    baseline: Config) -> list[int]:
    """Feasible-matrix rows of the bank's configs; a knob a config does not name takes the
    baseline's value (a patch knob added after the bank was read: the patch off), knobs the
    space lacks are ignored, and invalid or infeasible configs are skipped (a config from
    other hardware may name values this space lacks)."""
    rows = []
    for cfg in configs:
        row = row_of.get(tuple(cfg.get(n, baseline[n]) for n in space.names))
        if row is not None:
            rows.append(row)
    return rows


def maximin_rows(index_matrix: np.ndarray, anchors: np.ndarray, available: np.ndarray,
                 num_configs: int, jitter: np.ndarray) -> list[int]:
    """Greedy maximin: each pick is as far (Hamming) as possible from the anchors and the
    earlier picks; a seeded random ``jitter`` below 1 breaks ties without overriding distance."""
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


def diverse_start(index_matrix: np.ndarray, sources: list[list[int]], anchors: np.ndarray,
                  available: np.ndarray, num_configs: int, rng: np.random.Generator, first: int = 0) -> list[int]:
    """Round-robin over the non-empty ranked ``sources`` and a space-filling source,
    starting at source ``first`` (mod their number), de-duplicated, up to ``num_configs``.

    The space-filling pick is made when its turn comes, as far as possible from the
    ``anchors`` *and every config picked before it in this batch*: filling only around what
    has run would put it next to the prior-best pick of the same batch (on two-level knobs
    the config farthest from the baseline is the one that flips them all, as the priors'
    favourite often does too), so the batch would test one corner twice.
    """
    live: list[list[int] | None] = [s for s in sources if s] + [None]  # None: the space-filling source
    shift = first % len(live)
    live = live[shift:] + live[:shift]
    nxt = [0] * len(live)
    jitter = rng.random(len(index_matrix))
    # The space-filling source leaves the other sources' candidates to them.
    fill_avail = available.copy()
    fill_avail[[r for src in sources for r in src]] = False
    avail = available.copy()
    out: list[int] = []
    while len(out) < num_configs:
        before = len(out)
        for i, src in enumerate(live):
            if len(out) == num_configs:
                break
            if src is None:
                chosen = np.vstack([anchors, index_matrix[out]]) if out else anchors
                pick = maximin_rows(index_matrix, chosen, avail & fill_avail, 1, jitter)
            else:
                while nxt[i] < len(src) and not avail[src[nxt[i]]]:
                    nxt[i] += 1
                pick = [src[nxt[i]]] if nxt[i] < len(src) else []
            if pick:
                out.append(pick[0])
                avail[pick[0]] = False
        if len(out) == before:
            break
    return out
