"""Step-time rules with nothing to overlap, and the MFU convention."""

import numpy as np

from infrarsi.sim import Job
from infrarsi.sim.cost import estimate, mfu
from infrarsi.sim.job import columns

JOB = Job.of(model="llama3-8b", hw="h100-sxm-80gb", num_gpus=8, seq_len=4096, global_batch=64)


def step(**cfg):
    return float(estimate(JOB, columns(cfg)).step_time_s[0])


def test_overlap_costs_nothing_without_a_data_parallel_group():
    plain = step(tp=8, dp=1)
    assert step(tp=8, dp=1, overlap_grad_reduce=True) == plain
    assert step(tp=8, dp=1, zero=1, overlap_param_gather=True, overlap_grad_reduce=True) == plain
    # With a data-parallel group it hides communication and slows compute a little.
    assert step(tp=4, dp=2, overlap_grad_reduce=True) != step(tp=4, dp=2)


def test_mfu_counts_causal_attention_half_of_the_full_count():
    m = JOB.model
    full, causal = m.flops_per_token(4096, causal=False), m.flops_per_token(4096)
    assert np.isclose(full - causal, 6 * m.num_layers * m.q_dim * 4096)
    t = estimate(JOB, columns({"dp": 8})).step_time_s
    assert mfu(JOB, t)[0] < mfu(JOB, t, causal=False)[0]
