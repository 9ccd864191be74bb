"""Step time of one training step, vectorised over configs.

Compute. A GEMM of ``W`` FLOPs runs at ``peak * gemm_max * W / (W + gemm_half_flops)``: a
saturating roofline fit to measured cuBLAS throughput against problem size (small GEMMs
lose to wave quantisation and launch tails), so micro-batch and tensor parallelism trade
off for real. Backward GEMMs cost twice the forward (Narayanan et al. 2021, Sec. 5.1).
Attention: FlashAttention computes only the causal half at ``flash_attention_efficiency``
of peak, backward 2.5x forward (Dao 2023); unfused attention computes the full masked
product at 60% of GEMM efficiency and moves the ``s^2`` scores through HBM ~8 times.
Norms, residuals, RoPE and activations are memory-bound: bytes / HBM bandwidth;
replicated over tensor-parallel ranks unless sequence parallelism splits them
(Korthikanti et al. 2022). Eager traffic per layer and token: ``40 h`` bytes for norms and
residuals, ``20 (q+kv)`` for RoPE and projections' bias/reshape copies, ``6 F`` for the
SwiGLU product (each eager op reads and writes bf16 once); ``torch.compile`` fuses chains
into single kernels, cutting this to 30% (Ansel et al. 2024 report 1.3-2x end to end on
such models; the fused traffic is what Megatron's Transformer Engine kernels reach too).

Host. Each eager op costs ``host_op_s`` of CPU dispatch; a pass takes
``max(GPU time, host time)`` since the CPU runs ahead of the GPU until it cannot.
``torch.compile`` cuts the op count to 30%. An MoE layer without grouped GEMM loops over
its local experts (5 ops each), which is what makes naive MoE training slow
(MegaBlocks, Gale et al. 2023); the loop has data-dependent shapes and compile barely
helps it (80% of the ops stay).

MoE. Tokens per local expert ``n_e = (b s / t) k ep / E``; a loop GEMM has size
``2 n_e h F_e``, a grouped GEMM is as efficient as one expert GEMM four times larger
(it schedules all experts' tiles in one launch, but tiles stay expert-sized); routing imbalance inflates expert time by ``1 + 2/sqrt(n_e)`` (binomial
spread of the busiest expert). All-to-all dispatch and combine, twice each way.

Recompute. Full: one more forward of every layer, its tensor-parallel and all-to-all
communication included (Chen et al. 2016; Korthikanti et al. 2022, Table 4: +30-40%).
Selective: one more forward of core attention.

Communication (``comm``): tensor-parallel all-reduces (2 forward, 2 backward per layer;
with sequence parallelism all-gather + reduce-scatter of the same volume) are exposed.
Data-parallel gradient reduction (fp32), parameter all-gather (bf16), ZeRO-3's per
micro-batch gathers and reduce-scatters (PyTorch FSDP), each with ``n_buckets`` bucket
latencies of 30 us; with overlap each hides behind 90% of the compute it can overlap
(last micro-batch backward for gradients, first forward for parameters) but never
below one bucket, and overlapping slows compute by 3% (SM and HBM contention) where a
data-parallel collective exists to overlap (none at dp = 1).
Pipeline: 1F1B, step = ``(m + pp - 1) * (slowest stage micro-batch + p2p)``, i.e. the
bubble fraction ``(pp-1)/m`` of Narayanan et al. 2021; the last stage also runs the output
layer and the loss. Optimizer: AdamW traffic of 36 bytes per local parameter at HBM
bandwidth when fused; the foreach (unfused) path moves 2.5x that plus per-tensor ops.
"""

from __future__ import annotations

import numpy as np

from infrarsi.sim import comm
from infrarsi.sim.job import Columns, Job
from infrarsi.sim.memory import data_parallel_ranks, expert_dp, params_per_rank

BUCKET_LATENCY_S = 30e-6
STEP_FIXED_S = 5e-3          # data loading, host sync, logging
OVERLAP_SLOWDOWN = 1.03
GROUPED_GEMM_GAIN = 4.0     # a grouped GEMM fills the GPU like one 4x larger expert GEMM
COMPILED_ELEMENTWISE = 0.3  # fused by Inductor: one read and one write per op chain


def _gemm_s(job: Job, flops, size):
    hw = job.hw
    eff = hw.gemm_max * size / (size + hw.gemm_half_flops)
    return flops / (hw.peak_flops * eff)


def layer_times(job: Job, c: Columns) -> dict[str, np.ndarray]:
    """Per layer and micro-batch: forward and backward compute, host time, exposed comm."""
    m, hw = job.model, job.hw
    s, b, h, t = job.seq_len, c["micro_batch"], m.hidden, c["tp"]
    tokens = s * b
    sp = c["sequence_parallel"].astype(bool)
    flash = c["flash_attention"].astype(bool)
    compiled = c["compile"].astype(bool)

    gemm = _gemm_s(job, 2 * tokens * h * 2 * (m.q_dim + m.kv_dim) / t, 2 * tokens * h * (m.q_dim + 2 * m.kv_dim) / t)
    dense_ffn = m.shared_expert_ffn if m.is_moe else m.ffn_hidden
    if dense_ffn:
        gemm = gemm + _gemm_s(job, 2 * tokens * h * dense_ffn * m.mlp_matrices / t, 2 * tokens * h * dense_ffn / t)
    ops = np.full(len(t), 30.0)
    # Eager RMSNorm, RoPE, SwiGLU and residuals are several kernels each: ~20 bytes moved
    # per element of q/k/v and ~6 per element of the MLP's inner width (see docs).
    elementwise_par = 10 * (m.q_dim + m.kv_dim) + 3 * dense_ffn
    comm_f = 2 * comm.all_reduce_s(hw, tokens * h * 2, t, 1)
    if m.is_moe:
        k, fe = m.experts_per_token, m.expert_ffn
        local_tokens = tokens / t
        per_expert = local_tokens * k * c["ep"] / m.num_experts
        grouped = c["grouped_gemm"].astype(bool)
        size = 2 * per_expert * h * fe * np.where(grouped, GROUPED_GEMM_GAIN, 1.0)
        imbalance = 1 + 2 / np.sqrt(np.maximum(per_expert, 1.0))
        gemm = gemm + imbalance * _gemm_s(job, 2 * local_tokens * k * h * fe * m.mlp_matrices, size)
        elementwise_par += 3 * k * fe + 4 * k * h  # expert activations, permute / unpermute
        loop_ops = np.where(grouped, 8.0, 5.0 * m.num_experts / c["ep"])
        a2a = comm.all_to_all_s(hw, local_tokens * k * h * 2, c["ep"], 1)
        comm_f = comm_f + 2 * a2a
    else:
        loop_ops = np.zeros(len(t))

    core = 4 * tokens * s * m.q_dim / t
    attn_f = np.where(flash, 0.5 * core / (hw.peak_flops * hw.flash_attention_efficiency),
                      _gemm_s(job, core, core / m.num_heads) / 0.6
                      + 8 * b * m.num_heads / t * s * s * 2 / hw.hbm_bytes_per_s)
    attn_b = attn_f * np.where(flash, 2.5, 2.0)

    ew_bytes = 40 * tokens * h / np.where(sp, t, 1) + 2 * tokens * elementwise_par / t
    ew = ew_bytes / hw.hbm_bytes_per_s * np.where(compiled, COMPILED_ELEMENTWISE, 1.0)

    gpu_f = gemm + attn_f + ew
    gpu_b = 2 * gemm + attn_b + 2 * ew
    host_f = (ops * np.where(compiled, 0.3, 1.0) + loop_ops * np.where(compiled, 0.8, 1.0)) * hw.host_op_s
    host_b = 1.5 * host_f
    fwd = np.maximum(gpu_f, host_f)
    bwd = np.maximum(gpu_b, host_b)
    recompute = np.select([c["recompute"] == "full", c["recompute"] == "selective"],
                          [fwd + comm_f, attn_f], default=0.0)
    return {"fwd": fwd + comm_f, "bwd": bwd + comm_f + recompute}


def head_times(job: Job, c: Columns) -> np.ndarray:
    """Output projection and loss, forward + backward, per micro-batch (last stage)."""
    m, hw = job.model, job.hw
    tokens = job.seq_len * c["micro_batch"]
    flops = 2 * tokens * m.hidden * m.vocab / c["tp"]
    gemm = 3 * _gemm_s(job, flops, flops)
    loss_bytes = tokens * m.vocab / c["tp"] * np.where(c["fused_ce"].astype(bool), 6.0, 24.0)
    return gemm + loss_bytes / hw.hbm_bytes_per_s


def _overlapped(total, window, bucket_fraction, enabled):
    hidden = np.maximum(total - 0.9 * window, total * bucket_fraction)
    return np.where(enabled, np.minimum(hidden, total), total)


def step_time_s(job: Job, c: Columns, num_microbatches: np.ndarray) -> np.ndarray:
    hw = job.hw
    mb = num_microbatches
    lt = layer_times(job, c)
    layers = job.model.num_layers / c["pp"]
    ovg = c["overlap_grad_reduce"].astype(bool)
    ovp = c["overlap_param_gather"].astype(bool)
    # Overlap contends for SMs and HBM only while a data-parallel collective runs: with no
    # data-parallel group (dp = 1 and no expert-data group) there is nothing to overlap.
    has_dp_comm = data_parallel_ranks(job, c) > 1
    compute_scale = np.where((ovg | ovp) & has_dp_comm, OVERLAP_SLOWDOWN, 1.0)
    fwd = layers * lt["fwd"] * compute_scale
    bwd = layers * lt["bwd"] * compute_scale
    stage = fwd + bwd + head_times(job, c)
    act_bytes = job.seq_len * c["micro_batch"] * job.model.hidden * 2 / np.where(c["sequence_parallel"].astype(bool), c["tp"], 1)
    p2p = np.where(c["pp"] > 1, 2 * comm.p2p_s(hw, act_bytes, c["tp"] * c["dp"]), 0.0)
    pipeline = (mb + c["pp"] - 1) * (stage + p2p)

    dense, experts = params_per_rank(job, c)
    edp = expert_dp(c)
    bucket = c["bucket_mb"] * 2.0**20
    z = c["zero"]

    def collective(fn, bytes_per_param, extra=1.0):
        nbytes_d, nbytes_e = dense * bytes_per_param, experts * bytes_per_param
        n_buckets = np.ceil((nbytes_d + nbytes_e) / bucket)
        bw = fn(hw, nbytes_d, c["dp"], c["tp"]) + fn(hw, nbytes_e, edp, c["ep"])
        latency = np.where(has_dp_comm, n_buckets * BUCKET_LATENCY_S, 0.0)
        frac = np.minimum(1.0, bucket / np.maximum(nbytes_d + nbytes_e, 1.0))
        return bw + latency, frac

    grad_ar, frac_g = collective(comm.all_reduce_s, 4)
    grad_rs, _ = collective(comm.reduce_scatter_s, 4)
    param_ag, frac_p = collective(comm.all_gather_s, 2)
    last_bwd, first_fwd = bwd, fwd
    dp_time = np.select(
        [z == 0, z <= 2],
        [_overlapped(grad_ar, last_bwd, frac_g, ovg),
         _overlapped(grad_rs, last_bwd, frac_g, ovg) + _overlapped(param_ag, first_fwd, frac_p, ovp)],
        # ZeRO-3: every micro-batch gathers parameters twice and reduce-scatters gradients.
        default=mb * (_overlapped(param_ag, first_fwd, frac_p, ovp) + _overlapped(param_ag, bwd, frac_p, ovp)
                      + _overlapped(grad_rs, bwd, frac_g, ovg)),
    )

    local = np.where(z >= 1, dense / c["dp"] + experts / edp, dense + experts)
    fused = c["fused_optimizer"].astype(bool)
    optimizer = 36 * local / hw.hbm_bytes_per_s * np.where(fused, 1.0, 2.5) \
        + np.where(fused, 0.0, layers * 10 * 4 * hw.host_op_s)
    return pipeline + dp_time + optimizer + STEP_FIXED_S
