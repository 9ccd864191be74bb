"""Noise-aware promotion: paired A B A B runs and a t interval on the log speedup.

Noise model: what doctor sees on a shared 2-core machine: each run's median step time is
the true time times lognormal noise (CV 4%), on top of a slow drift of the machine that
A and B runs taken moments apart share.
"""

import numpy as np
import pytest

from infrarsi.noise import cv_upper_bound, estimate_noise
from infrarsi.stages.verify import decide, pair_noise, paired_speedup

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


# Run CVs measured on this project's machines, from a well-tuned baseline on a quiet one
# (0.3%) to a shared, loaded 2-core one (15%); within-run step spread as measured with
# them (12-15% where the between-run figure read 0.3%).
NOISE_LEVELS = [(0.003, 0.13), (0.01, 0.05), (0.035, 0.05), (0.15, 0.10)]
NUM_WINDOW_STEPS = 5


def _doctor_floor(rng, run_cv: float, step_cv: float, num_runs: int) -> float:
    """Doctor's estimate from back-to-back baseline runs: each run's steps spread around
    its own level, which moves between runs."""
    levels = rng.lognormal(0, run_cv, num_runs)
    steps = [level * rng.lognormal(0, step_cv, NUM_WINDOW_STEPS) for level in levels]
    return estimate_noise([float(np.median(s)) for s in steps], [list(s) for s in steps]).noise_cv


def _zero_change_promotion_rate(run_cv: float, step_cv: float, seed: int, num_repeats: int = 800) -> float:
    rng = np.random.default_rng(seed)
    promoted = 0
    for _ in range(num_repeats):
        drift = np.exp(np.cumsum(rng.normal(0, 0.05, NUM_PAIRS)))
        base = drift * rng.lognormal(0, run_cv, NUM_PAIRS)
        cand = drift * rng.lognormal(0, run_cv, NUM_PAIRS)
        # verification's floor: doctor's estimate, raised to the noise the pairs show
        floor = max(_doctor_floor(rng, run_cv, step_cv, 5), pair_noise(list(base), list(cand)))
        promoted += decide(list(base), list(cand), floor)[3]
    return promoted / num_repeats


@pytest.mark.parametrize("run_cv,step_cv", NOISE_LEVELS)
def test_a_true_zero_change_is_promoted_in_under_5_percent_of_repeats_at_every_measured_noise(run_cv, step_cv):
    assert _zero_change_promotion_rate(run_cv, step_cv, seed=int(run_cv * 1e4)) < 0.05


def test_doctor_does_not_read_quiet_back_to_back_runs_as_a_quiet_machine():
    """The measured case: three runs within 0.33% of each other whose steps spread by 13%;
    a later campaign's pairs showed 3.5% per run. The estimate must not sit below that."""
    rng = np.random.default_rng(3)
    steps = [list(m * rng.lognormal(0, 0.13, NUM_WINDOW_STEPS)) for m in (1.0, 1.0033, 0.9967)]
    noise = estimate_noise([1.0, 1.0033, 0.9967], steps)
    assert noise.between_run_cv == pytest.approx(0.0033, rel=0.01)
    assert noise.noise_cv >= 0.035 and noise.weak


def test_the_between_run_bound_widens_with_fewer_runs():
    assert cv_upper_bound(0.01, 3) > cv_upper_bound(0.01, 5) > cv_upper_bound(0.01, 20) > 0.01
    assert not estimate_noise([1.0] * 5, [[1.0] * 5] * 5).weak
