"""Peak memory as a sum of parts, and what each knob setting does to each part.

A training step's peak is a sum: a fixed part (CUDA context, NCCL and cuBLAS workspaces,
communication buckets; on a CPU the framework's own resident set), the model states
(parameters, gradients, optimizer moments), for a mixture-of-experts model the experts'
states apart from the dense ones (they shard over other groups), and the activations
(with the logits and other transients of a micro-batch). A knob scales some parts and
leaves the others: a micro-batch of 4 quadruples the activations and leaves the states
alone, so what it does to the whole peak depends on how large the activations are, which
one log-additive coefficient per setting cannot express (full recompute of a job whose
peak is its optimizer states saves little; of a 32k-sequence job, most of the peak).

``memory_components`` builds the prior the memory model fits: each part's share of the
baseline's peak, and per setting a log factor on each part, relative to the baseline's
value, from the table below. A setting the table does not know, or whose prior came from
somewhere other than the built-in table (the experience bank, an LLM, a patch's metadata),
scales the whole peak by its prior's factor. ZeRO sharding depends on two knobs at once
(the stage and the data-parallel degree), so it enters the states as a fixed feature:
log bytes per parameter (Rajbhandari et al. 2020) relative to the baseline's, with a
coefficient near 1.

Where the structure comes from, and a caveat: these are the published accountings of
training memory (Korthikanti et al. 2022 for activations, the ZeRO paper for states,
Megatron's MoE parallel folding for experts), which the cluster simulator
(``infrarsi/sim/memory.py``) implements too, so the simulated benchmarks cannot tell how
well the structure carries to a real job; the real-job checks (CPU campaigns, the GPU
check) can.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Mapping

import numpy as np

from infrarsi.core.knobs import Value
from infrarsi.core.priors import Priors
from infrarsi.engine.encoding import Encoding
from infrarsi.engine.knob_rows import STAGE_ROWS, knob_row, normalise

_L = math.log
FIXED, STATES, EXPERTS, ACTIVATIONS = "fixed", "states", "expert_states", "activations"
# Shares of the peak at the reference config (micro-batch 1, no recompute, no tensor,
# pipeline or expert parallelism, no ZeRO), before the baseline's own settings move them.
# ~30% activations against 16 bytes/param of mixed-precision Adam states is typical of a
# distributed LLM job at micro-batch 1 (Korthikanti et al. 2022's per-layer formula);
# experts hold most of an MoE's parameters (Mixtral 8x7B 45 of 47B, OLMoE 6.3 of 6.9B).
# A CPU trainer is measured by its resident set, mostly the framework itself: the built-in
# workload's tiny flavour measured ~1% of it per sample (324 MB at micro-batch 2, 528 MB
# at 64, fp32, no checkpointing), so activations are a few percent there.
REFERENCE_SHARES = {FIXED: 0.1, STATES: 0.6, ACTIVATIONS: 0.3}
REFERENCE_SHARES_MOE = {FIXED: 0.1, STATES: 0.1, EXPERTS: 0.5, ACTIVATIONS: 0.3}
REFERENCE_SHARES_CPU = {FIXED: 0.75, STATES: 0.2, ACTIVATIONS: 0.05}
# The shares vary a lot between jobs (sequence length, model size): one sd is a factor e.
SHARE_LOG_STD = 1.0
# A part a setting is not listed for: unchanged, give or take 5%.
UNLISTED_STD = 0.05
# ZeRO's feature: its coefficient is 1 give or take 0.2.
SHARDING_COEF_STD = 0.2

# knob row -> value -> {part: (absolute log level against the knob's reference, sd)}.
_FLAGS: dict[str, dict[Value, dict[str, tuple[float, float]]]] = {
    # Korthikanti et al. 2022: selective recompute drops the attention scores (most of a
    # layer's activations without a fused attention kernel, none with one: wide sd); full
    # recompute keeps the layer inputs, 2 of ~34 bytes per element per layer, plus one layer.
    "checkpointing": {"none": {}, "selective": {ACTIVATIONS: (_L(0.6), 0.4)},
                      "full": {ACTIVATIONS: (_L(0.15), 0.5)}},
    # Sequence parallelism shards the layer-norm and dropout activations over the TP ranks.
    "sequence_parallel": {"off": {}, "on": {ACTIVATIONS: (-0.3, 0.3)}},
    # Inductor fuses elementwise chains and drops their intermediates.
    "compile": {"off": {}, "on": {ACTIVATIONS: (_L(0.9), 0.15)}},
    # Chunked cross-entropy never materialises fp32 logits (Liger Kernel, Hsu et al. 2024).
    "fused_cross_entropy": {"off": {}, "on": {ACTIVATIONS: (_L(0.8), 0.3)}},
    # FlashAttention (Dao 2022) stores no T x T scores.
    "flash_attention": {"off": {}, "on": {ACTIVATIONS: (_L(0.5), 0.5)}},
    "attention": {"naive": {}, "sdpa": {ACTIVATIONS: (_L(0.6), 0.4)}, "flash": {ACTIVATIONS: (_L(0.6), 0.4)}},
    # bf16 halves stored activations; bf16 weights beside fp32 master copies and moments.
    "precision": {"fp32": {}, "bf16": {ACTIVATIONS: (_L(0.5), 0.3), STATES: (_L(0.9), 0.2)},
                  "fp16": {ACTIVATIONS: (_L(0.5), 0.3), STATES: (_L(0.9), 0.2)}},
    # Optimizer kernels: the same moments; foreach keeps temporary tensor lists.
    "fused_optimizer": {"off": {}, "on": {}},
    "optimizer": {"forloop": {}, "foreach": {STATES: (0.02, 0.05)}, "fused": {}},
    # A grouped GEMM runs the same experts on the same tokens.
    "grouped_gemm": {"off": {}, "on": {ACTIVATIONS: (0.0, 0.1)}},
    # Overlap keeps a bucket or two more in flight.
    "overlap_grad_reduce": {"off": {}, "on": {FIXED: (0.02, 0.05)}},
    "overlap_param_gather": {"off": {}, "on": {FIXED: (0.02, 0.05)}},
}
_FLAGS["recompute"] = _FLAGS["activation_checkpointing"] = _FLAGS["checkpointing"]
_FLAGS["fused_ce"] = _FLAGS["fused_cross_entropy"]
_NUMERIC: dict[str, Callable[[float], dict[str, tuple[float, float]]]] = {
    "micro_batch": lambda v: {ACTIVATIONS: (_L(v), 0.1)},
    # Megatron TP shards the dense states and, without sequence parallelism, 24 of a
    # layer's ~34 activation bytes per element (Korthikanti et al. 2022); experts shard over
    # ep only under parallel folding, but some stacks shard them over tp too (wide sd).
    "tp": lambda v: {STATES: (-_L(v), 0.1), EXPERTS: (0.0, 0.3), ACTIVATIONS: (-0.7 * _L(v), 0.25)},
    # Pipeline stages split the layers; the first stage keeps pp micro-batches in flight
    # of its 1/pp of the layers (1F1B, Narayanan et al. 2021), so activations stay.
    "pp": lambda v: {STATES: (-_L(v), 0.15), EXPERTS: (-_L(v), 0.15), ACTIVATIONS: (0.0, 0.3)},
    # Experts shard over ep; the all-to-all buffers grow a little.
    "ep": lambda v: {EXPERTS: (-_L(v), 0.15), ACTIVATIONS: (0.05 * _L(v), 0.1)},
    # The data-parallel degree and the ZeRO stage act through the sharding feature.
    "dp": lambda v: {STATES: (0.0, 0.2), EXPERTS: (0.0, 0.2)},
    "zero": lambda v: {STATES: (0.0, 0.2), EXPERTS: (0.0, 0.2)},
    # Two buckets of this size are in flight (PyTorch DDP).
    "bucket_mb": lambda v: {FIXED: (0.1 * _L(v / 25.0), 0.1)},
}
for _name in STAGE_ROWS[1:]:
    _NUMERIC[_name] = _NUMERIC["zero"]
_NUMERIC["micro_batch_size"] = _NUMERIC["micro_batch"]
_NUMERIC["bucket_size_mb"] = _NUMERIC["bucket_mb"]


def part_levels(row: str | None, value: Value) -> dict[str, tuple[float, float]] | None:
    """The table's levels of one setting, or None when the table does not know it."""
    if row is None:
        return None
    value = normalise(value)
    if row in _NUMERIC and isinstance(value, (int, float)):
        return _NUMERIC[row](value) if value > 0 or row in STAGE_ROWS else None
    table = _FLAGS.get(row)
    return table.get(value) if table is not None and value in table else None


def zero_bytes_per_param(stage: np.ndarray, ranks: np.ndarray) -> np.ndarray:
    """Bytes per parameter of mixed-precision Adam states under ZeRO (Rajbhandari et al.
    2020): 2 + 2 + 12, the 12 optimizer bytes sharded by stage 1, the gradients too by 2,
    everything by 3."""
    n = np.maximum(np.asarray(ranks, dtype=float), 1.0)
    z = np.asarray(stage)
    return np.select([z == 0, z == 1, z == 2], [np.full_like(n, 16.0), 4 + 12 / n, 2 + 14 / n], 16 / n)


@dataclass(frozen=True)
class Sharding:
    """ZeRO's feature on one part: ``log_bytes(columns)`` minus its baseline value."""

    part: int
    log_bytes: Callable[[Mapping[str, np.ndarray]], np.ndarray]
    baseline_log_bytes: float

    def feature(self, columns: Mapping[str, np.ndarray]) -> np.ndarray:
        return self.log_bytes(columns) - self.baseline_log_bytes


@dataclass(frozen=True)
class MemoryComponents:
    """The memory model's prior: parts, their log shares of the baseline's peak, and per
    setting (``Encoding.settings`` order) the mean and sd of its log factor on each part.
    ``whole[j]``: setting j scales every part by the same factor."""

    parts: tuple[str, ...]
    log_share: np.ndarray        # [num_parts]
    effect_mean: np.ndarray      # [num_parts, num_settings]
    effect_std: np.ndarray       # [num_parts, num_settings]
    whole: np.ndarray            # [num_settings] bool
    sharding: tuple[Sharding, ...] = ()

    @classmethod
    def single(cls, encoding: Encoding, priors: Priors) -> "MemoryComponents":
        """One part, each setting's prior on the whole peak: the log-additive model."""
        labels = [encoding.label(j) for j in range(encoding.num_settings)]
        mean = np.array([[priors.get(*lb).log_memory_mean for lb in labels]]).reshape(1, -1)
        std = np.array([[priors.get(*lb).log_memory_std for lb in labels]]).reshape(1, -1)
        return cls(("peak",), np.zeros(1), mean, std, np.ones(encoding.num_settings, dtype=bool))


def memory_components(encoding: Encoding, priors: Priors, *, on_cpu: bool = False) -> MemoryComponents:
    """The parts' prior for a campaign: ``priors`` decide for the settings whose memory prior
    came from elsewhere than the built-in tables (those scale the whole peak)."""
    space, base = encoding.space, encoding.baseline
    names = space.names
    rows = {k.name: knob_row(k) for k in space.knobs}
    moe = any(rows.get(n) == "ep" for n in names)
    shares = REFERENCE_SHARES_CPU if on_cpu else REFERENCE_SHARES_MOE if moe else REFERENCE_SHARES
    parts = tuple(shares)
    index = {p: i for i, p in enumerate(parts)}
    num = encoding.num_settings
    mean, std = np.zeros((len(parts), num)), np.full((len(parts), num), UNLISTED_STD)
    whole = np.zeros(num, dtype=bool)
    level_at_base = np.zeros(len(parts))
    for knob in space.knobs:
        for part, (m, _) in (part_levels(rows.get(knob.name), knob.canonical(base[knob.name])) or {}).items():
            if part in index:
                level_at_base[index[part]] += m
    for j in range(num):
        knob_name, value = encoding.label(j)
        knob, prior = space.knob(knob_name), priors.get(knob_name, value)
        here = part_levels(rows.get(knob_name), knob.canonical(value))
        there = part_levels(rows.get(knob_name), knob.canonical(base[knob_name]))
        told = prior.source != "uninformed" and not prior.source.startswith("builtin")
        if here is None or there is None or told:
            mean[:, j], std[:, j], whole[j] = prior.log_memory_mean, prior.log_memory_std, True
            continue
        for part, i in index.items():
            (mh, sh), (mb, sb) = here.get(part, (0.0, None)), there.get(part, (0.0, None))
            mean[i, j] = mh - mb
            if sh is not None or sb is not None:
                std[i, j] = math.hypot(sh or 0.0, sb or 0.0)
    sharding = _sharding(space, base, rows, index, moe)
    for s in sharding:
        level_at_base[s.part] += s.baseline_log_bytes - _L(16.0)
    log_share = np.log(np.array([shares[p] for p in parts])) + level_at_base
    log_share -= np.log(np.exp(log_share).sum())
    return MemoryComponents(parts, log_share, mean, std, whole, sharding)


def _sharding(space, base, rows, index, moe) -> tuple[Sharding, ...]:
    """ZeRO over the data-parallel group (a stage knob with numeric values and a ``dp``
    knob); an MoE's experts over their own data-parallel group, dp x tp / ep (Megatron's
    parallel folding)."""
    stage = next((n for n in space.names if rows.get(n) in STAGE_ROWS
                  and all(isinstance(v, int) and not isinstance(v, bool) for v in space.knob(n).values)), None)
    dp = next((n for n in space.names if rows.get(n) == "dp"), None)
    if stage is None or dp is None:
        return ()
    tp = next((n for n in space.names if rows.get(n) == "tp"), None)
    ep = next((n for n in space.names if rows.get(n) == "ep"), None)

    def dense(c):
        return np.log(zero_bytes_per_param(c[stage], c[dp]))

    def experts(c):
        group = c[dp] * (c[tp] if tp else 1) / c[ep]
        return np.log(zero_bytes_per_param(c[stage], group))

    at_base = {n: np.array([base[n]]) for n in space.names}
    out = [Sharding(index[STATES], dense, float(dense(at_base)[0]))]
    if moe and ep is not None:
        out.append(Sharding(index[EXPERTS], experts, float(experts(at_base)[0])))
    return tuple(out)
