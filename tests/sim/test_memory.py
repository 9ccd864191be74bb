import numpy as np

from infrarsi.sim import Job
from infrarsi.sim.job import columns, fill_defaults
from infrarsi.sim.memory import layer_activation_bytes, model_state_bytes

# MPT-7B has the shape Korthikanti et al. analyse: multi-head attention, GeLU MLP of 4h.
JOB = Job.of(model="mpt-7b", hw="h100-sxm-80gb", num_gpus=8, seq_len=2048, global_batch=64)
S, B, H, A = 2048, 2, 4096, 32


def act(**cfg):
    return float(layer_activation_bytes(JOB, fill_defaults(columns({"micro_batch": B, **cfg})))[0])


def test_activations_match_korthikanti_2022():
    sbh, scores = S * B * H, 5 * A * S * S * B
    assert act(flash_attention=False) == 34 * sbh + scores
    assert act(flash_attention=False, tp=4, dp=2) == sbh * (10 + 24 / 4) + scores / 4
    assert act(flash_attention=False, tp=4, dp=2, sequence_parallel=True) == 34 * sbh / 4 + scores / 4
    assert act(flash_attention=False, recompute="selective") == 34 * sbh
    assert act(flash_attention=True) == 34 * sbh  # flash never stores the scores either
    stored = layer_activation_bytes(JOB, fill_defaults(columns({"micro_batch": B, "recompute": "full"})),
                                    stored_only=True)
    assert float(stored[0]) == 2 * sbh


def test_model_states_18_bytes_per_param_and_zero_sharding():
    n = JOB.model.num_params  # tied embeddings, one stage, tp 1: every parameter on every rank
    ddp = model_state_bytes(JOB, fill_defaults(columns({"dp": 8, "zero": 0})))
    zero1 = model_state_bytes(JOB, fill_defaults(columns({"dp": 8, "zero": 1})))
    zero2 = model_state_bytes(JOB, fill_defaults(columns({"dp": 8, "zero": 2})))
    assert np.isclose(ddp[0], 18 * n)
    assert np.isclose(zero1[0], (6 + 12 / 8) * n)
    assert np.isclose(zero2[0], (2 + 16 / 8) * n)


def test_zero3_on_one_rank_costs_nothing_more_than_ddp():
    # A data-parallel group of one has nothing to shard or gather.
    ddp = model_state_bytes(JOB, fill_defaults(columns({"tp": 8, "dp": 1, "zero": 0})))
    fsdp = model_state_bytes(JOB, fill_defaults(columns({"tp": 8, "dp": 1, "zero": 3})))
    assert np.isclose(ddp[0], fsdp[0])
