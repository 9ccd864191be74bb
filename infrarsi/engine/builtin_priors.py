"""Built-in priors: what each knob setting typically does to step time and peak memory.

The table holds *absolute levels* per knob value (natural-log time and memory factors
against a reference value of that knob); ``builtin_priors`` turns them into effects
relative to the campaign's baseline value, the scale ``Priors`` uses. Every number has a
comment saying where it comes from. Knobs not named here get uninformed priors.
Assumption throughout: the contract fixes the global batch, so a knob that changes the
micro-batch or the parallel layout changes gradient accumulation, not the work done.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

from infrarsi.knobs import Config, Knob, KnobSpace, Value
from infrarsi.priors import SettingPrior, Priors

_L = math.log


@dataclass(frozen=True)
class Level:
    log_time: float = 0.0
    log_memory: float = 0.0
    time_sd: float = 0.0     # uncertainty of this level against the knob's reference value
    memory_sd: float = 0.0
    why: str = ""


# Share of the peak that activations take at micro-batch 1 without recompute, the rest
# being model states, buffers and workspace. One number for every activation knob below, so
# that their memory priors agree with each other: ~30% is typical of a distributed LLM job
# at micro-batch 1 (the per-layer activation formula of Korthikanti et al. 2022 against 16
# bytes/param of model states).
_ACTIVATION_SHARE = 0.3
# A trainer on CPU (no accelerator) is measured by its process's resident set, of which the
# framework itself is a large fixed part (importing torch alone takes a few hundred MB), so
# activations are a few percent of it: the built-in workload's tiny flavour measured ~1% per
# sample here (324 MB at micro-batch 2, 528 MB at 64 without checkpointing, fp32); 5% leaves
# room for larger models. The models learn the rest from the runs (``Encoding.prior_covariance``).
_CPU_ACTIVATION_SHARE = 0.05


def _activation_factor(kept: float, share: float = _ACTIVATION_SHARE) -> float:
    """Peak-memory factor of keeping ``kept`` x the activations (1 = all of them)."""
    return 1.0 - share + share * kept


def _checkpointing(share: float) -> dict[str, Level]:
    return {
        "none": Level(why="reference: keep every activation"),
        # Korthikanti et al. 2022 (Megatron, "Reducing Activation Recomputation"): selective
        # recompute costs ~2-4% time and drops the attention block's activations (about half
        # of a layer's with the T x T scores; less with a fused attention kernel).
        "selective": Level(_L(1.04), _L(_activation_factor(0.5, share)), 0.05, 0.15,
                           "Korthikanti et al. 2022: +2-4% time, attention activations not kept"),
        # Full recompute re-runs the forward: +1/3 of forward+backward (Chen et al. 2016),
        # measured +36% in Korthikanti et al.; activation memory drops to layer inputs (~10%).
        "full": Level(_L(1.33), _L(_activation_factor(0.1, share)), 0.1, 0.2,
                      "Chen et al. 2016 / Korthikanti et al. 2022: +33-36% time, activations ~layer inputs"),
    }


_CHECKPOINTING = _checkpointing(_ACTIVATION_SHARE)
_ON_OFF = {"off": Level(why="reference: feature off")}
_TABLE: dict[str, dict[str, Level]] = {
    "checkpointing": _CHECKPOINTING,
    "recompute": _CHECKPOINTING,
    "activation_checkpointing": _CHECKPOINTING,
    "precision": {
        "fp32": Level(why="reference: fp32"),
        # Tensor-core bf16 matmuls run 2-16x fp32/tf32 (A100/H100 datasheets); end-to-end
        # AMP training ~2x (NVIDIA mixed-precision guide). Wide sd: on CPUs bf16 is often slower.
        "bf16": Level(_L(0.5), _L(0.75), 0.6, 0.25, "NVIDIA AMP guide ~2x on tensor cores; activations halve, fp32 master weights stay"),
        "fp16": Level(_L(0.5), _L(0.75), 0.6, 0.25, "as bf16, plus loss scaling"),
    },
    "compile": {
        **_ON_OFF,
        # PyTorch 2.0 release: geomean 1.38x training speedup on 163 models (A100, AMP);
        # less on small/CPU models and sometimes a regression, hence sd 0.3. Fusion drops
        # intermediates (memory -10%).
        "on": Level(_L(0.8), _L(0.9), 0.3, 0.15, "PyTorch 2.0 release: 1.38x geomean training speedup; fusion saves intermediates"),
    },
    "optimizer": {
        "forloop": Level(why="reference: per-parameter loop"),
        # Multi-tensor apply makes the optimizer step 2-3x faster (PyTorch docs); the step is
        # ~5-10% of a training step, so -5%. Foreach keeps temporary tensor lists (+2%).
        "foreach": Level(_L(0.95), _L(1.02), 0.05, 0.05, "PyTorch optimizer docs: foreach 2-3x faster step, step ~5-10% of time"),
        "fused": Level(_L(0.93), _L(1.0), 0.05, 0.05, "PyTorch fused Adam: one kernel; slightly better than foreach"),
    },
    "attention": {
        "naive": Level(why="reference: materialises the T x T score matrix"),
        # FlashAttention (Dao et al. 2022): attention 2-4x faster, memory linear in sequence;
        # attention is ~20-40% of a GPT step at T~1k, so -20% overall; scores dominate activations.
        "sdpa": Level(_L(0.8), _L(0.7), 0.3, 0.3, "Dao et al. 2022: attention 2-4x faster, no T x T scores"),
        "flash": Level(_L(0.8), _L(0.7), 0.3, 0.3, "Dao et al. 2022"),
    },
    "flash_attention": {**_ON_OFF, "on": Level(_L(0.8), _L(0.7), 0.3, 0.3, "Dao et al. 2022: attention 2-4x faster, no T x T scores")},
    # Apex/Megatron fused Adam: optimizer step in one kernel, ~5% of step time saved.
    "fused_optimizer": {**_ON_OFF, "on": Level(_L(0.95), 0.0, 0.05, 0.05, "Megatron fused Adam: one kernel per step")},
    # Fused/chunked cross-entropy never materialises fp32 logits [tokens x vocab]: Liger
    # Kernel (Hsu et al. 2024) reports large memory savings at large vocab, small speedups.
    "fused_cross_entropy": {**_ON_OFF, "on": Level(_L(0.97), _L(0.85), 0.05, 0.2, "Liger Kernel 2024: no fp32 logits tensor")},
    # Korthikanti et al. 2022: sequence parallelism shards layernorm/dropout activations over
    # TP ranks (activation memory /tp there) with the same communication volume.
    "sequence_parallel": {**_ON_OFF, "on": Level(_L(0.98), _L(0.8), 0.05, 0.15, "Korthikanti et al. 2022: SP shards non-TP activations")},
    # Megatron-LM distributed optimizer docs: overlapping the DP reduce-scatter with backward
    # hides most of it (-5-10% when DP comm is visible); buckets cost a little memory.
    "overlap_grad_reduce": {**_ON_OFF, "on": Level(_L(0.93), _L(1.02), 0.05, 0.03, "Megatron-LM: hide grad reduce under backward")},
    "overlap_param_gather": {**_ON_OFF, "on": Level(_L(0.96), _L(1.02), 0.05, 0.03, "Megatron-LM: hide param all-gather under forward")},
}

# ZeRO (Rajbhandari et al. 2020): model states of mixed-precision Adam are 16 bytes/param;
# stage 1 shards the 12 optimizer bytes, stage 2 also the 2 gradient bytes, stage 3 also the
# 2 parameter bytes. With N=8 and model states ~70% of the peak: peak factors 0.54/0.46/0.39.
# Stage 3 moves 1.5x the DP communication volume (paper, Sec. 7), stages 1-2 the same.
_ZERO = {0: Level(why="reference: plain data parallel"),
         1: Level(0.0, _L(0.54), 0.05, 0.3, "ZeRO paper: optimizer states sharded"),
         2: Level(_L(1.02), _L(0.46), 0.05, 0.3, "ZeRO paper: + gradients sharded"),
         3: Level(_L(1.15), _L(0.39), 0.1, 0.3, "ZeRO paper: + params sharded, 1.5x comm volume")}


def _micro_batch(mb: float, share: float = _ACTIVATION_SHARE) -> Level:
    # Kernels get more efficient with more rows per launch until the device saturates:
    # ~5-10% per doubling (common MLPerf/Megatron experience). Activations scale with the
    # micro-batch (``_ACTIVATION_SHARE`` of the peak at micro-batch 1).
    return Level(-0.08 * math.log2(mb), _L(_activation_factor(mb, share)), 0.1, 0.3,
                 "kernel efficiency per doubling; activations linear in micro-batch")


_NUMERIC: dict[str, Callable[[float], Level]] = {
    "micro_batch": _micro_batch,
    "micro_batch_size": _micro_batch,
    # Megatron TP (Shoeybi et al. 2019, Narayanan et al. 2021): 77% scaling at tp=8 inside a
    # node, so each doubling costs ~5% of time at fixed devices; states and most
    # activations shard over tp.
    "tp": lambda v: Level(0.05 * math.log2(v), -0.5 * _L(v), 0.1, 0.3, "Narayanan et al. 2021: TP comm per layer; states /tp"),
    # Pipeline bubble (p-1)/m (GPipe, Huang et al. 2019) at typical m: ~8% per doubling;
    # states /pp, but stage 0 holds up to pp micro-batches of activations.
    "pp": lambda v: Level(0.08 * math.log2(v), -0.5 * _L(v), 0.1, 0.2, "GPipe bubble (p-1)/m; states /pp, stage-0 activations x pp"),
    # A campaign tunes a fixed allocation (tp * pp * dp = devices), so more data
    # parallelism means less tp/pp: their per-layer comm and bubble go (in their priors),
    # and each device multiplies larger matrices, taken as ~10% per doubling (Narayanan et
    # al. 2021 compare splits of a fixed device count: data parallelism is the cheapest
    # while the model fits); the ring all-reduce volume per rank hardly depends on dp
    # (Patarasuk & Yuan 2009). Per-device memory is unchanged without ZeRO.
    "dp": lambda v: Level(-0.1 * math.log2(v), 0.0, 0.15, 0.1, "fixed device count: dp scales better than tp/pp (Narayanan et al. 2021)"),
    # Expert parallel (Lepikhin et al. 2020, GShard): experts shard over ep; all-to-all grows.
    "ep": lambda v: Level(0.05 * math.log2(v), -0.4 * _L(v), 0.1, 0.2, "GShard: experts sharded, all-to-all cost"),
    # PyTorch DDP (Li et al. 2020, Fig. 9): 25 MB buckets near-optimal; U-shaped around it.
    "bucket_mb": lambda v: Level(0.02 * math.log2(v / 25.0) ** 2, 0.0, 0.05, 0.02, "Li et al. 2020 (DDP): 25 MB near-optimal"),
    "bucket_size_mb": lambda v: Level(0.02 * math.log2(v / 25.0) ** 2, 0.0, 0.05, 0.02, "Li et al. 2020 (DDP)"),
    # CPU DDP processes over a fixed batch: ideal -ln(n), gloo all-reduce eats about half;
    # activations split over processes, model states replicated.
    "nproc": lambda v: Level(-0.5 * _L(v), -0.2 * _L(v), 0.2, 0.2, "CPU DDP: half of linear scaling after gloo all-reduce"),
    # Intra-op threads: matmuls parallelise well, small ops do not (Amdahl): ~60% of ideal.
    "threads": lambda v: Level(-0.6 * _L(v), 0.0, 0.2, 0.05, "Amdahl: ~60% of ideal intra-op scaling"),
}
_STAGE_KNOBS = ("zero", "zero_stage", "fsdp", "fsdp_stage")
for _name in _STAGE_KNOBS:
    _NUMERIC[_name] = lambda v: _ZERO.get(int(v), Level(0.0, 0.0, 0.7, 0.7, "unknown stage"))


def _normalise(value: Value) -> Value:
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, str) and value.lower() in ("true", "yes", "1", "enabled"):
        return "on"
    if isinstance(value, str) and value.lower() in ("false", "no", "0", "disabled"):
        return "off"
    return value.lower() if isinstance(value, str) else value


# Where a CPU trainer differs from the accelerator numbers above: activations are a small
# share of the resident set, and a fused attention kernel has no HBM round trip to save (the
# FlashAttention gain is a GPU memory-hierarchy gain). PyTorch's sdpa on a 2-core CPU with
# AVX512-BF16 measured -14% step time in fp32 and +35% in bf16 against the naive path
# (median over 30 config pairs each, docs/benchmark/cpu_landscape): no direction to expect,
# so centred on 0 with the GPU prior's sd.
_CPU_SDPA = Level(0.0, _L(_activation_factor(0.5, _CPU_ACTIVATION_SHARE)), 0.3, 0.3,
                  "CPU: no HBM traffic to save; measured -14% (fp32) to +35% (bf16) on a CPU")
_CPU_TABLE: dict[str, dict[str, Level]] = {
    **{k: _checkpointing(_CPU_ACTIVATION_SHARE) for k in ("checkpointing", "recompute", "activation_checkpointing")},
    "attention": {"naive": _TABLE["attention"]["naive"], "sdpa": _CPU_SDPA, "flash": _CPU_SDPA},
    "flash_attention": {**_ON_OFF, "on": _CPU_SDPA},
}
_CPU_NUMERIC: dict[str, Callable[[float], Level]] = {
    **_NUMERIC,
    "micro_batch": lambda v: _micro_batch(v, _CPU_ACTIVATION_SHARE),
    "micro_batch_size": lambda v: _micro_batch(v, _CPU_ACTIVATION_SHARE),
}


def level(knob: str, value: Value, *, on_cpu: bool = False) -> Level | None:
    """The table's absolute level for one setting, or None when the table is silent.
    ``on_cpu``: the trials run on CPU only (no accelerator), where some numbers differ."""
    value = _normalise(value)
    numeric = _CPU_NUMERIC if on_cpu else _NUMERIC
    if knob in numeric and isinstance(value, (int, float)):
        # Stage knobs start at 0; every other numeric knob is a positive count or size.
        return numeric[knob](value) if value > 0 or knob in _STAGE_KNOBS else None
    table = (_CPU_TABLE.get(knob) if on_cpu else None) or _TABLE.get(knob)
    return table.get(value) if table and isinstance(value, str) else None


# A knob's kind names its row above, whatever the script calls the knob. grad_accum has no
# row: kept in a fixed product with the micro-batch, the split's effect is the micro-batch's.
_KIND_ROWS = {"micro_batch": "micro_batch", "precision": "precision", "compile": "compile", "threads": "threads",
              "processes": "nproc", "checkpointing": "checkpointing", "attention": "attention",
              "optimizer": "optimizer", "sharding": "zero", "bucket": "bucket_mb"}


def _row(knob: Knob) -> str | None:
    """The table row for ``knob``: by its kind when it has one, else by its name."""
    return knob.name if knob.kind is None else _KIND_ROWS.get(knob.kind)


def builtin_priors(space: KnobSpace, baseline: Config, *, on_cpu: bool = False) -> Priors:
    """Per-setting priors relative to ``baseline``; settings the table lacks are left out
    (``Priors.get`` then answers uninformed). ``on_cpu``: for trials without an accelerator.
    Values are looked up as the knob's ``levels`` spell them (``float32`` -> ``fp32``)."""
    out = []
    for knob in space.knobs:
        row = _row(knob)
        base = None if row is None else level(row, knob.canonical(baseline[knob.name]), on_cpu=on_cpu)
        if base is None:
            continue
        for value in knob.values:
            lv = level(row, knob.canonical(value), on_cpu=on_cpu)
            if lv is None or value == baseline[knob.name]:
                continue
            out.append(SettingPrior(
                knob=knob.name, value=value,
                log_time_mean=lv.log_time - base.log_time,
                log_time_std=max(math.hypot(lv.time_sd, base.time_sd), 0.02),
                log_memory_mean=lv.log_memory - base.log_memory,
                log_memory_std=max(math.hypot(lv.memory_sd, base.memory_sd), 0.02),
                source="builtin-cpu" if on_cpu else "builtin", rationale=lv.why))
    return Priors.of(out, "builtin-cpu" if on_cpu else "builtin")
