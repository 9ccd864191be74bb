"""How noisy one run's step time is, from repeated runs of the same config.

Two spreads bound the noise of a run's median step time from below. Between runs: the
coefficient of variation of the run medians; from a handful of back-to-back runs it is
itself uncertain (three runs of a loaded machine read 0.33% where a later campaign's
pairs showed 3.5%), so the estimate takes its one-sided upper confidence bound. Within a
run: the steps' own spread, as the sampling error of a median of that many steps (a
run's median cannot be steadier than that, whatever the between-run figure says). The
noise is the larger of the two. Fewer than ``WEAK_BELOW_RUNS`` runs make a weak estimate.
"""

from __future__ import annotations

import functools
import math
import statistics
from dataclasses import dataclass
from typing import Sequence

from scipy import stats

from infrarsi.core.serial import Record

WEAK_BELOW_RUNS = 4
UPPER_BOUND_CONFIDENCE = 0.90
# Sampling error of the median of n normal draws: sqrt(pi / 2) * sigma / sqrt(n).
MEDIAN_SE_FACTOR = math.sqrt(math.pi / 2)


@dataclass(frozen=True, kw_only=True)
class NoiseEstimate(Record):
    noise_cv: float  # a diagnostic, and a prior on what paired runs can tell apart
    between_run_cv: float
    between_run_cv_upper: float
    within_run_cv: float  # median over runs of the steps' CV
    within_run_median_cv: float  # that spread as the sampling error of one run's median
    num_runs: int
    weak: bool


def cv(values: Sequence[float]) -> float:
    mean = statistics.mean(values) if values else 0.0
    return statistics.stdev(values) / mean if len(values) > 1 and mean > 0 else 0.0


def cv_upper_bound(sample_cv: float, num_runs: int, confidence: float = UPPER_BOUND_CONFIDENCE) -> float:
    """One-sided upper confidence bound of a CV estimated from ``num_runs`` runs (chi-square)."""
    if num_runs < 2:
        return sample_cv
    return sample_cv * _chi2_factor(num_runs - 1, confidence)


@functools.lru_cache(maxsize=None)
def _chi2_factor(dof: int, confidence: float) -> float:
    return math.sqrt(dof / stats.chi2.ppf(1 - confidence, dof))


def estimate_noise(run_medians_s: Sequence[float], run_step_times_s: Sequence[Sequence[float]]) -> NoiseEstimate:
    """The noise of one run's median step time, from runs of one config."""
    between = cv(run_medians_s)
    upper = cv_upper_bound(between, len(run_medians_s))
    spreads = [(cv(steps), len(steps)) for steps in run_step_times_s if len(steps) > 1]
    within = statistics.median(s for s, _ in spreads) if spreads else 0.0
    within_median = statistics.median(MEDIAN_SE_FACTOR * s / math.sqrt(n) for s, n in spreads) if spreads else 0.0
    return NoiseEstimate(noise_cv=max(upper, within_median), between_run_cv=between, between_run_cv_upper=upper,
                         within_run_cv=within, within_run_median_cv=within_median,
                         num_runs=len(run_medians_s), weak=len(run_medians_s) < WEAK_BELOW_RUNS)
