"""The engine's start configs handed to TPE and GP as their warm start."""

import pytest

from infrarsi.core.trial import Role, TrialResult
from infrarsi.proposers import SearchContext, make_proposer
from infrarsi.proposers.engine_proposer import warm_start_configs
from infrarsi.sim import sim_workload, simulate_trial


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
    assert len(warm) == 3 and len({w.space.key(c) for c in warm}) == 3
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
