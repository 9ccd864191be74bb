"""Selection: the memory-saver pairing and the diverse batch."""

from __future__ import annotations

import math

import numpy as np
from scipy import special

from infrarsi.core.knobs import Knob, KnobSpace
from infrarsi.engine.selection import SettingEffects, pair_with_savers, pick_diverse

SPACE = KnobSpace(knobs=(
    Knob(name="micro_batch", values=(1, 8)),
    Knob(name="checkpointing", values=("none", "selective", "full")),
    Knob(name="offload", values=("off", "on")),
))
# log time / log memory effects vs the baseline (1, none, off): micro-batch 8 is fast and
# hungry; per byte saved, selective costs 0.05/0.33, full 0.3/0.55, offload 0.5/0.45.
EFFECTS = SettingEffects(
    log_time=[np.array([0.0, -0.4]), np.array([0.0, 0.05, 0.3]), np.array([0.0, 0.5])],
    log_memory=[np.array([0.0, 1.0]), np.array([0.0, -0.4, -0.8]), np.array([0.0, -0.6])],
)
BASE_LOG_PEAK, LOG_CAPACITY = math.log(10e9), math.log(20e9)


def log_peak(idx):
    return BASE_LOG_PEAK + sum(EFFECTS.log_memory[k][v] for k, v in enumerate(idx))


def fit_probability(idx):
    return float(special.ndtr((LOG_CAPACITY - log_peak(idx)) / 0.05))


def test_pairs_the_hungry_fast_setting_with_the_cheapest_saver():
    fast = np.array([1, 0, 0])  # micro_batch 8, no checkpointing, no offload: OOMs
    paired, record = pair_with_savers(SPACE, fast, EFFECTS, log_peak, fit_probability)
    assert SPACE.from_indices(paired) == {"micro_batch": 8, "checkpointing": "selective", "offload": "off"}
    assert record["hungry_setting"] == {"knob": "micro_batch", "value": 8}
    assert [s["saver"] for s in record["steps"]] == [{"knob": "checkpointing", "value": "selective"}]
    assert record["fast_fit_probability"] < 0.5 < record["steps"][0]["fit_probability"]
    assert math.isclose(record["steps"][0]["bytes_saved"], math.exp(BASE_LOG_PEAK + 1.0) * -math.expm1(-0.4))


def test_pairing_adds_a_second_saver_when_one_is_not_enough():
    global LOG_CAPACITY
    old, LOG_CAPACITY = LOG_CAPACITY, math.log(13e9)  # now 1.0 - 0.4 is still too much
    try:
        paired, record = pair_with_savers(SPACE, np.array([1, 0, 0]), EFFECTS, log_peak, fit_probability)
    finally:
        LOG_CAPACITY = old
    # After selective, going on to full saves 0.4 more for 0.25 time; offload 0.6 for 0.5:
    # full is cheaper per byte, and it replaces selective on the same knob.
    assert SPACE.from_indices(paired) == {"micro_batch": 8, "checkpointing": "full", "offload": "off"}
    assert len(record["steps"]) == 2


def test_no_pairing_when_no_saver_reaches_the_target():
    tight = lambda idx: 0.0  # nothing ever fits  # noqa: E731
    paired, record = pair_with_savers(SPACE, np.array([1, 0, 0]), EFFECTS, log_peak, tight, max_savers=2)
    assert paired is None and len(record["steps"]) == 2


def test_batch_is_diverse():
    x = SPACE.feasible_index_matrix
    score = np.full(len(x), 0.8)  # log scores
    score[0], score[1] = 1.0, 0.99  # rows 0 and 1 differ in one knob only: 1 is a near-copy
    picks = pick_diverse(x, score, np.ones(len(x), dtype=bool), 2)
    assert picks[0] == 0 and (x[picks[1]] != x[0]).sum() >= 2


def test_start_sources_take_turns_when_asked_one_at_a_time():
    from infrarsi.engine.start import diverse_start

    x = SPACE.feasible_index_matrix
    anchors, avail = x[:1], np.ones(len(x), dtype=bool)
    experience, prior = [], [10, 11]

    def start(n, first=0):
        return diverse_start(x, [experience, prior], anchors, avail, n, np.random.default_rng(0), first=first)

    # A batch of three samples every non-empty source; three calls for one config each
    # get the sources in turn instead of the first source three times.
    batch = start(3)
    assert batch[0] == 10 and batch[2] == 11 and batch[1] not in (10, 11)
    singles = [start(1, first=i)[0] for i in range(3)]
    assert singles[0] == 10 and singles[1] not in (10, 11) and singles[2] == 10
    assert diverse_start(x, [[], []], anchors, np.zeros(len(x), dtype=bool), 2, np.random.default_rng(0)) == []


def test_space_filling_start_keeps_away_from_the_prior_pick_of_its_own_batch():
    """On two-level knobs the config farthest from the baseline flips every knob; when the
    prior-best pick of the same batch flips them all too, the fill must not repeat it."""
    from infrarsi.core.knobs import Knob, KnobSpace
    from infrarsi.engine.start import diverse_start

    space = KnobSpace(knobs=tuple(Knob(name=f"k{i}", values=("off", "on")) for i in range(4)))
    x = space.feasible_index_matrix
    base = np.zeros((1, 4), dtype=np.int64)
    all_on = int(np.flatnonzero((x == 1).all(axis=1))[0])
    for seed in range(5):
        prior_pick, fill = diverse_start(x, [[all_on]], base, np.ones(len(x), dtype=bool), 2,
                                         np.random.default_rng(seed))
        assert prior_pick == all_on
        # Two knobs flipped: as far from the baseline as from the prior pick.
        assert (x[fill] != x[all_on]).sum() == 2 and (x[fill] != base[0]).sum() == 2
