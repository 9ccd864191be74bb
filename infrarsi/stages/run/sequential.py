"""Sequential paired verification: decide after every pair instead of after a fixed number.

A candidate runs in rounds, each pairing it with a baseline run taken moments before, so
slow drift of a shared machine, common to both runs of a pair, cancels in the pair's log
ratio ``x = log(baseline / candidate)``. After each round from ``min_pairs`` on, ``look``
puts a one-sided t bound on each side of the mean log ratio and compares both with the
threshold ``log(1 + margin)``, the spec's practical margin (``budget.practical_margin``,
the smallest speedup worth promoting):

- the lower bound above the threshold: the candidate clears (it is promoted and stops);
- the upper bound below it: it can no longer clear (it stops);
- the look's optimistic estimate (mean + ``FUTILITY_Z`` standard errors) would not clear at
  the last look, with the spread seen so far: clearing has become unlikely (it stops, as
  *futile*);
- otherwise it runs another round, up to ``max_pairs``, where the lower bound decides.

Noise is variance, never a bar: the t bound's width is the pairs' own spread, so a noisy
machine widens the bound and the test runs more rounds (up to ``max_pairs``) before it
decides; it does not raise the threshold (why, measured: docs/verification.md). Room for
many pairs is what lets a close candidate on a noisy machine clear; the futility stop is
what keeps that room from being spent on a candidate with nothing to show (a true zero
change against a 1% margin never gets its upper bound under the threshold, so without it
it would run every pair). Stopping for futility never clears anything, so it cannot raise
the false-promotion rate; it costs some power, measured in ``tests/test_promotion.py``.

Looking after every round is a multiple test. Each early look spends at most 0.5%, and
the early looks together at most half of ``alpha``; the last look spends the rest
(Bonferroni over the looks): the chance that a candidate whose true log speedup sits at
the threshold clears at *any* look stays below ``alpha`` whatever the looks' correlation.
``tests/test_promotion.py`` measures the rates; ``benchmarks/campaign_cost.py`` tabulates
them. The interval a look reports is at that look's level, so its lower end is the bound
that decided. The variance has ``n - 1`` degrees of freedom, so two pairs decide only
when they agree closely, which a clear winner on a quiet machine does.
"""

from __future__ import annotations

import enum
import functools
import math
import statistics
from dataclasses import dataclass
from typing import Sequence

from scipy import stats

ALPHA = 0.05  # one-sided, over all looks: the most a candidate at the threshold may clear
# The most one early look may spend. From seven pairs on, the early looks share half of
# alpha and the last look keeps the other half (30 pairs: 0.089% at each of 28 early looks);
# with fewer pairs the last look keeps more of it (three pairs: 4.5%), near the fixed test's
# power at that many pairs.
EARLY_LEVEL = 0.005
# A look stops an arm as futile when its mean plus this many standard errors, taken as the
# truth, would still leave the last look's lower bound under the threshold. At 30 pairs, on
# the noise model of tests/test_promotion.py: a true zero change at 3.5% run noise stops after
# about 10 pairs (29 without), a true 1.15x at 15% is promoted 85% of the time (90% without).
FUTILITY_Z = 2.0


class Decision(str, enum.Enum):
    CLEARS = "clears"
    CANNOT_CLEAR = "cannot_clear"
    FUTILE = "futile"  # may still clear, but unlikely by the last look: not worth more pairs
    CONTINUE = "continue"


@dataclass(frozen=True, kw_only=True)
class SequentialRule:
    """When to look and how sure each look must be."""

    max_pairs: int
    min_pairs: int = 2
    alpha: float = ALPHA
    futility_z: float | None = FUTILITY_Z  # None: run on to the last look unless the bounds decide

    def __post_init__(self) -> None:
        assert 2 <= self.min_pairs <= self.max_pairs, "looks need 2 <= min_pairs <= max_pairs"

    @property
    def num_looks(self) -> int:
        return self.max_pairs - self.min_pairs + 1

    def level(self, num_pairs: int) -> float:
        """The one-sided error each side of the look at ``num_pairs`` pairs may make: an
        early look at most ``EARLY_LEVEL`` and the early ones at most half of ``alpha``
        together; the last look the rest."""
        early = min(EARLY_LEVEL, self.alpha / 2 / max(self.num_looks - 1, 1))
        if num_pairs >= self.max_pairs:
            return self.alpha - early * (self.num_looks - 1)
        return early

    def multiplier(self, num_pairs: int) -> float:
        """The one-sided t quantile each side of a look with ``num_pairs`` pairs uses."""
        return _t_quantile(1.0 - self.level(num_pairs), num_pairs - 1)


@functools.lru_cache(maxsize=None)
def _t_quantile(q: float, dof: int) -> float:
    return float(stats.t.ppf(q, dof))


@dataclass(frozen=True, kw_only=True)
class Look:
    """One look at a candidate's pairs (log scale; ``exp`` gives speedups)."""

    num_pairs: int
    mean: float
    low: float
    high: float
    margin: float  # the practical margin this look held the candidate to
    pair_noise_cv: float | None  # the per-run noise the pairs show (a diagnostic)
    decision: Decision

    @property
    def threshold(self) -> float:
        return math.log1p(self.margin)


def pair_noise(log_ratios: Sequence[float]) -> float | None:
    """The per-run noise a set of pairs shows: the spread of their log ratios over sqrt(2)
    (each ratio carries the noise of two runs); drift shared within a pair cancels."""
    if len(log_ratios) < 2:
        return None
    return statistics.stdev(log_ratios) / math.sqrt(2)


def look(rule: SequentialRule, log_ratios: Sequence[float], margin: float) -> Look:
    """The decision after ``len(log_ratios)`` pairs against ``1 + margin``."""
    n = len(log_ratios)
    assert n >= 1, "a look needs a pair"
    seen = pair_noise(log_ratios)
    mean = statistics.fmean(log_ratios)
    if n < rule.min_pairs:
        return Look(num_pairs=n, mean=mean, low=-math.inf, high=math.inf, margin=margin, pair_noise_cv=seen,
                    decision=Decision.CONTINUE)
    sd = statistics.stdev(log_ratios)
    half = rule.multiplier(n) * sd / math.sqrt(n)
    low, high, threshold = mean - half, mean + half, math.log1p(margin)
    if low > threshold:
        decision = Decision.CLEARS
    elif high < threshold or n >= rule.max_pairs:
        decision = Decision.CANNOT_CLEAR
    elif rule.futility_z is not None and (mean + rule.futility_z * sd / math.sqrt(n)
                                          - rule.multiplier(rule.max_pairs) * sd / math.sqrt(rule.max_pairs)
                                          < threshold):
        decision = Decision.FUTILE
    else:
        decision = Decision.CONTINUE
    return Look(num_pairs=n, mean=mean, low=low, high=high, margin=margin, pair_noise_cv=seen, decision=decision)


def log_ratios(numerators_s: Sequence[float], denominators_s: Sequence[float]) -> list[float]:
    """``log(a / b)`` pair by pair: for speedups, the baseline's times over the candidate's."""
    return [math.log(a / b) for a, b in zip(numerators_s, denominators_s)]
