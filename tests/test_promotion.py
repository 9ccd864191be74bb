"""Noise-aware promotion: paired A B A B runs and a t interval on the log speedup.

Noise model: what doctor sees on a shared 2-core machine: each run's median step time is
the true time times lognormal noise (CV 4%), on top of a slow drift of the machine that
A and B runs taken moments apart share.
"""

import numpy as np
import pytest

from infrarsi.stages.verify import decide, paired_speedup

NUM_REPEATS = 2000
NUM_PAIRS = 5  # the default budget.verify_pairs
RUN_CV = 0.04


def _promotion_rate(true_speedup: float, seed: int) -> float:
    rng = np.random.default_rng(seed)
    promoted = 0
    for _ in range(NUM_REPEATS):
        drift = np.exp(np.cumsum(rng.normal(0, 0.05, NUM_PAIRS)))  # load changes between pairs
        base = 1.0 * drift * rng.lognormal(0, RUN_CV, NUM_PAIRS)
        cand = drift / true_speedup * rng.lognormal(0, RUN_CV, NUM_PAIRS)
        # doctor's noise floor: CV of three baseline runs of the same machine
        floor = float(np.std(rng.lognormal(0, RUN_CV, 3), ddof=1))
        promoted += decide(list(base), list(cand), floor)[3]
    return promoted / NUM_REPEATS


def test_no_real_speedup_is_promoted_in_under_5_percent_of_repeats():
    assert _promotion_rate(1.0, seed=1) < 0.05


def test_a_real_15_percent_speedup_is_promoted_in_over_90_percent_of_repeats():
    assert _promotion_rate(1.15, seed=2) > 0.90


def test_paired_speedup_is_the_geometric_mean_with_an_interval_around_it():
    speedup, low, high = paired_speedup([1.0, 1.1, 0.9, 1.0], [0.5, 0.56, 0.44, 0.5])
    assert speedup == pytest.approx(2.0, rel=0.02)
    assert low < speedup < high
    assert paired_speedup([1.0, 1.0], [0.5, 0.5]) == (2.0, 2.0, 2.0)
