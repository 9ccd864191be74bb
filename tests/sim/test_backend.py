from infrarsi.core.trial import Outcome, is_out_of_memory
from infrarsi.sim import sim_workload, simulate_trial

W = "dense-9b-h100"


def test_oom_when_peak_exceeds_capacity():
    # DDP keeps 18 bytes per parameter on every GPU: 9B x 18 B = 160 GB > 80 GiB.
    cfg = {**sim_workload(W).baseline, "tp": 1, "dp": 8, "zero": 0}
    out = simulate_trial(W, cfg, seed=0, trial_index=1)
    assert out.outcome is Outcome.OOM
    assert out.peak_memory_bytes > out.memory_capacity_bytes
    assert is_out_of_memory(out.reason)
    assert out.step_time_s is None


def test_crash_combos_crash():
    base = sim_workload(W).baseline
    for change in ({"compile": True, "fused_ce": True},
                   {"compile": True, "recompute": "selective", "sequence_parallel": True}):
        out = simulate_trial(W, {**base, **change}, seed=0, trial_index=1)
        assert out.outcome is Outcome.CRASH, change
        assert out.reason and not is_out_of_memory(out.reason)
    moe = sim_workload("moe-35b-a3b-h200").baseline
    assert simulate_trial("moe-35b-a3b-h200", {**moe, "compile": True}, seed=0, trial_index=1).outcome is Outcome.CRASH


def test_noise_is_seeded_reproducible_and_varies_by_trial():
    base = sim_workload(W).baseline
    a = simulate_trial(W, base, seed=3, trial_index=7)
    assert a == simulate_trial(W, base, seed=3, trial_index=7)
    b = simulate_trial(W, base, seed=3, trial_index=8)
    assert a.step_times_s != b.step_times_s
    assert a.true_step_time_s == b.true_step_time_s
    assert 0.9 < a.step_time_s / a.true_step_time_s < 1.1
