"""Generated benchmark jobs: fixed, disjoint splits of runnable, varied jobs."""

from infrarsi.core.trial import Outcome
from infrarsi.sim import oracle, sim_workload, simulate_trial
from infrarsi.sim.cost import estimate
from infrarsi.sim.generator import (
    DEVELOPMENT_SEEDS,
    EXTRA_DEVELOPMENT_SEEDS,
    HELD_OUT_SEEDS,
    MIN_BASELINE_MFU,
    STYLES,
    split_names,
)
from infrarsi.sim.job import columns


def test_splits_are_fixed_disjoint_and_large_enough():
    assert len(DEVELOPMENT_SEEDS) >= 30 and len(HELD_OUT_SEEDS) >= 30
    assert not set(DEVELOPMENT_SEEDS) & set(HELD_OUT_SEEDS)
    assert not (set(DEVELOPMENT_SEEDS) | set(EXTRA_DEVELOPMENT_SEEDS)) & set(HELD_OUT_SEEDS)
    assert split_names("held-out")[0] == f"gen-{HELD_OUT_SEEDS[0]}"


def test_a_seed_always_gives_the_same_job():
    a = sim_workload("gen-1003")
    from infrarsi.sim.generator import generated_workload

    generated_workload.cache_clear()
    b = sim_workload("gen-1003")
    assert a is not b and a.description == b.description and a.baseline == b.baseline
    assert a.space.names == b.space.names


def test_every_job_has_a_runnable_plausible_baseline_and_the_splits_vary():
    models, styles, nodes, moe = set(), set(), set(), set()
    for name in split_names("development") + split_names("held-out"):
        w = sim_workload(name)
        assert w.space.is_feasible(w.baseline)
        est = estimate(w.job, columns(w.baseline))
        assert est.ok[0] and est.mfu[0] >= MIN_BASELINE_MFU
        models.add(w.job.model.name)
        moe.add(w.job.model.is_moe)
        styles.add(w.paper["style"])
        nodes.add(w.job.num_gpus // 8)
    assert moe == {True, False} and len(models) >= 8 and set(STYLES) <= styles
    assert min(nodes) == 1 and max(nodes) == 64


def test_a_generated_job_runs_through_the_sim_backend_and_the_oracle_beats_its_baseline():
    name = split_names("development")[0]
    w = sim_workload(name)
    out = simulate_trial(name, w.baseline, seed=0, trial_index=0)
    assert out.outcome is Outcome.OK
    o = oracle(w)
    assert o.speedup >= 1.0 and o.num_ok <= o.num_feasible
