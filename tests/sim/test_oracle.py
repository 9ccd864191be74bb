import numpy as np
import pytest

from infrarsi.sim import BENCHMARK_WORKLOADS, HELD_OUT_WORKLOADS, estimate, oracle, simulate_trial, workload
from infrarsi.sim.grid import feasible_columns
from infrarsi.sim.job import columns


def test_grid_enumerates_exactly_the_feasible_configs_in_order():
    w = workload("debug")
    idx, _ = feasible_columns(w.space)
    assert [w.space.from_indices(i) for i in idx] == list(w.space.feasible)


def test_oracle_is_exact_against_brute_force():
    w = workload("debug")
    best_time, best_cfg = np.inf, None
    for cfg in w.space.feasible:
        e = estimate(w.job, columns(cfg))
        if e.ok[0] and e.step_time_s[0] < best_time:
            best_time, best_cfg = float(e.step_time_s[0]), cfg
    o = oracle(w)
    assert o.best_step_time_s == best_time
    assert o.best_config == best_cfg
    assert o.num_feasible == len(w.space.feasible)


@pytest.mark.parametrize("name", BENCHMARK_WORKLOADS)
def test_benchmark_workload_baseline_runs_and_oracle_speedup_in_paper_range(name):
    w = workload(name)
    assert w.space.is_feasible(w.baseline)
    assert simulate_trial(name, w.baseline, seed=0, trial_index=0).outcome.value == "ok"
    o = oracle(w)
    assert 1.5 <= o.speedup <= 2.8
    assert 0.1 <= o.baseline_mfu <= 0.4


@pytest.mark.parametrize("name", HELD_OUT_WORKLOADS)
def test_held_out_workload_baseline_runs_and_leaves_room(name):
    w = workload(name)
    assert simulate_trial(name, w.baseline, seed=0, trial_index=0).outcome.value == "ok"
    assert oracle(w).speedup > 1.1
