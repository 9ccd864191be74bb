"""The engine's start across layouts, and the same start handed to TPE and GP."""

import numpy as np
import pytest

from infrarsi.engine.start import layout_columns, layout_diverse_rows
from infrarsi.proposers import SearchContext, make_proposer
from infrarsi.proposers.engine import warm_start_configs
from infrarsi.sim import sim_workload, simulate_trial
from infrarsi.trial import Role, TrialResult


def test_layout_diverse_rows_probe_one_config_per_basin():
    # Knobs: tp, zero (layout) and a flag. Rows sorted fastest first by log_time.
    x = np.array([[0, 0, 1], [0, 0, 0], [1, 0, 1], [1, 1, 1], [1, 1, 0], [0, 1, 1]])
    log_time = np.array([0.0, 0.1, 0.2, 0.3, 0.4, 0.5])
    candidates = np.ones(len(x), dtype=bool)
    baseline = np.array([0, 0, 0])
    rows = layout_diverse_rows(x, [0, 1], log_time, candidates, 3, baseline)
    # Fastest first; then only a layout two knobs away from the baseline's and the first's.
    assert rows == [0, 3]
    assert layout_diverse_rows(x, [0, 1], log_time, candidates, 3, baseline, min_layout_distance=1) == [0, 2, 3]
    assert layout_diverse_rows(x, [0, 1], log_time, candidates & (np.arange(6) != 0), 1, baseline) == [1]


def _result(name, cfg, seed, index, role=Role.SEARCH):
    sim = simulate_trial(name, cfg, seed=seed, trial_index=index)
    peak = min(sim.peak_memory_bytes, sim.memory_capacity_bytes)
    return TrialResult(trial_id=f"t{index}", config=cfg, role=role, outcome=sim.outcome,
                       step_time_s=sim.step_time_s, step_times_s=sim.step_times_s, peak_memory_bytes=peak,
                       memory_capacity_bytes=sim.memory_capacity_bytes, wall_time_s=sim.trial_time_s)


@pytest.mark.parametrize("sampler", ["tpe", "gp"])
def test_warm_start_is_the_engines_start_and_optuna_asks_it_first(sampler):
    name = "gen-1005"
    w = sim_workload(name)
    ctx = SearchContext(space=w.space, baseline=dict(w.baseline), memory_capacity_bytes=w.memory_capacity_bytes)
    base = _result(name, dict(w.baseline), 0, 0, Role.DOCTOR)
    warm = warm_start_configs(ctx, base)
    assert 1 <= len(warm) <= 3
    layouts = {tuple(c[k] for k in ("tp", "pp", "dp", "zero", "recompute")) for c in warm}
    assert len(layouts) == len(warm)  # one per layout
    engine = make_proposer("engine", ctx)
    engine.observe(base)
    assert engine.suggest(1) == warm[:1]
    other = make_proposer(sampler, SearchContext(space=w.space, baseline=dict(w.baseline),
                                                 extra={"warm_start_configs": tuple(warm)}))
    other.observe(base)
    asked = []
    for i in range(len(warm)):
        (cfg,) = other.suggest(1)
        asked.append(cfg)
        other.observe(_result(name, cfg, 0, i + 1))
    assert asked == warm
