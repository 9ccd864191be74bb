"""Peak memory per GPU of one training step, vectorised over configs.

Model states (mixed-precision Adam; ZeRO, Rajbhandari et al. 2020; Megatron-LM
distributed-optimizer docs): per parameter 2 bytes bf16 weights, 4 bytes fp32 main
gradients, 12 bytes fp32 master weights + Adam moments = 18 bytes. ZeRO-1 shards the 12
optimizer bytes over the data-parallel group, ZeRO-2 also the gradients, ZeRO-3 (FSDP
full shard) everything, plus the unsharded working set of the layers being gathered.

Activations per layer and micro-batch (Korthikanti et al. 2022, "Reducing Activation
Recomputation in Large Transformer Models", Sec. 4, in bytes, bf16):
``sbh * (10 + 24/t) + 5 a s^2 b / t`` with tensor parallelism ``t``, ``sbh * 34/t + ...``
with sequence parallelism; selective recompute drops the ``5 a s^2 b`` term, full
recompute keeps only the layer input ``2 sbh`` (``/t`` with sequence parallelism) plus one
layer's working set. The ``24`` splits into attention ``8 = 4(q+kv)/h`` and MLP
``16 = 4F/h`` (GeLU, F = 4h); a SwiGLU MLP stores gate, up and product: ``6F/h``; routed
MoE experts store per token and chosen expert the permuted input and their MLP
activations: ``k (2 + 6F_e/h)``. FlashAttention (Dao 2022) never stores the ``s^2``
scores either, so with it selective recompute saves nothing.

Pipeline 1F1B keeps ``min(pp, m)`` micro-batches in flight on the first stage
(Narayanan et al. 2021). Logits: 10 bytes per logit unfused (bf16 logits, fp32 upcast,
fp32 gradient), 2 bytes fused (chunked cross-entropy). MoE all-to-all send and receive
buffers: ``2 * tokens * k * h * 2`` bytes. Framework overhead (CUDA context, NCCL, cuBLAS
workspaces): 2.5 GiB plus two communication buckets; fragmentation of the caching
allocator: +6% of allocated tensors (PyTorch memory docs; measured 5-10% on LLM jobs).
"""

from __future__ import annotations

import numpy as np

from infrarsi.sim.hardware import GiB
from infrarsi.sim.job import Columns, Job

OVERHEAD_BYTES = 2.5 * GiB
FRAGMENTATION = 1.06


def params_per_rank(job: Job, c: Columns) -> tuple[np.ndarray, np.ndarray]:
    """(dense + embedding params, routed-expert params) held by one rank of the largest stage.
    Experts are sharded over ``ep`` only (expert tensor parallelism 1, MoE Parallel Folding)."""
    m = job.model
    layers = m.num_layers / c["pp"]
    emb = np.where(c["pp"] == 1, m.embedding_params, m.vocab * m.hidden)
    dense = (layers * (m.attention_params + m.dense_mlp_params) + emb) / c["tp"]
    experts = layers * m.expert_params / c["ep"]
    return dense, experts


def expert_dp(c: Columns) -> np.ndarray:
    """Ranks sharing one expert shard: the data-parallel group of the experts."""
    return c["dp"] * c["tp"] // c["ep"]


def data_parallel_ranks(job: Job, c: Columns) -> np.ndarray:
    """The largest group any parameter is replicated (or sharded) over: dp, or for an
    MoE also the experts' data-parallel group."""
    return np.maximum(c["dp"], expert_dp(c)) if job.model.is_moe else np.asarray(c["dp"])


def model_state_bytes(job: Job, c: Columns) -> np.ndarray:
    dense, experts = params_per_rank(job, c)
    z = c["zero"]

    def per_param(shards):
        return np.select([z == 0, z == 1, z == 2], [18.0, 6 + 12 / shards, 2 + 16 / shards],
                         default=18 / shards)

    states = dense * per_param(c["dp"]) + experts * per_param(expert_dp(c))
    m = job.model
    layer = (m.attention_params + m.dense_mlp_params) / c["tp"] + m.expert_params / c["ep"]
    # Two layers prefetched, bf16 + fp32 grad; a group of one rank has nothing to gather.
    sharded = data_parallel_ranks(job, c) > 1
    gathered = np.where((z == 3) & sharded, 2 * layer * (2 + 4), 0.0)
    return states + gathered


def layer_activation_bytes(job: Job, c: Columns, *, stored_only: bool = False) -> np.ndarray:
    """Activation bytes one layer keeps for one micro-batch (Korthikanti et al. 2022).
    ``stored_only``: what full recompute keeps (the layer input)."""
    m = job.model
    s, b, h, t = job.seq_len, c["micro_batch"], m.hidden, c["tp"]
    sbh = s * b * h
    sp = c["sequence_parallel"].astype(bool)
    if stored_only:
        return 2 * sbh / np.where(sp, t, 1)
    attn = 4 * (m.q_dim + m.kv_dim) / h
    if m.is_moe:
        mlp = 6 * m.shared_expert_ffn / h + m.experts_per_token * (2 + 6 * m.expert_ffn / h)
    else:
        mlp = (6 if m.swiglu else 4) * m.ffn_hidden / h
    parallel = attn + mlp
    linear = np.where(sp, sbh * (10 + parallel) / t, sbh * (10 + parallel / t))
    scores = 5 * m.num_heads * s * s * b / t
    keeps_scores = ~c["flash_attention"].astype(bool) & (c["recompute"] == "none")
    return linear + np.where(keeps_scores, scores, 0.0)


def activation_bytes(job: Job, c: Columns, num_microbatches: np.ndarray) -> np.ndarray:
    """Activations of the first pipeline stage at its peak."""
    layers = job.model.num_layers / c["pp"]
    in_flight = np.minimum(c["pp"], num_microbatches)
    full = layer_activation_bytes(job, c)
    stored = np.where(c["recompute"] == "full",
                      layers * layer_activation_bytes(job, c, stored_only=True) + full / in_flight,
                      layers * full)
    return stored * in_flight


def logits_bytes(job: Job, c: Columns) -> np.ndarray:
    per_logit = np.where(c["fused_ce"].astype(bool), 2.0, 10.0)
    return job.seq_len * c["micro_batch"] * job.model.vocab / c["tp"] * per_logit


def dispatch_bytes(job: Job, c: Columns) -> np.ndarray:
    m = job.model
    if not m.is_moe:
        return np.zeros(len(c["tp"]))
    tokens = job.seq_len * c["micro_batch"] / c["tp"]
    return np.where(c["ep"] > 1, 2.0, 1.0) * tokens * m.experts_per_token * m.hidden * 2


def peak_memory_bytes(job: Job, c: Columns, num_microbatches: np.ndarray) -> np.ndarray:
    acts = activation_bytes(job, c, num_microbatches)
    one_mb = acts / np.minimum(c["pp"], num_microbatches)
    transient = logits_bytes(job, c) + dispatch_bytes(job, c)
    # First stage: all in-flight micro-batches; last stage: one micro-batch plus logits.
    dynamic = np.where(c["pp"] == 1, acts + transient, np.maximum(acts, one_mb + transient))
    allocated = model_state_bytes(job, c) + dynamic
    return allocated * FRAGMENTATION + OVERHEAD_BYTES + 2 * c["bucket_mb"] * 2**20
