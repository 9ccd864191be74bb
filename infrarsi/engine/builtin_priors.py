"""Built-in priors: what each knob setting typically does to step time (and, for the few
knobs the memory part table lacks, to the whole peak).

The table holds *absolute levels* per knob value (natural-log time factors against a
reference value of that knob); ``builtin_priors`` turns them into effects relative to the
campaign's baseline value, the scale ``Priors`` uses. Every number has a comment saying
where it comes from. Knobs not named here get uninformed priors. What a setting does to
memory depends on how the peak splits into states and activations, so it lives in
``memory_components`` (by part), not here.
Assumption throughout: the contract fixes the global batch, so a knob that changes the
micro-batch or the parallel layout changes gradient accumulation, not the work done.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

from infrarsi.core.knobs import Config, KnobSpace, Value
from infrarsi.core.priors import UNINFORMED_LOG_STD, Priors, SettingPrior
from infrarsi.engine import memory_components
from infrarsi.engine.knob_rows import STAGE_ROWS, knob_row, normalise

_L = math.log


@dataclass(frozen=True)
class Level:
    log_time: float = 0.0
    log_memory: float = 0.0  # whole-peak memory, for knobs the part table lacks
    time_sd: float = 0.0     # uncertainty of this level against the knob's reference value
    memory_sd: float = 0.0
    why: str = ""


_CHECKPOINTING = {
    "none": Level(why="reference: keep every activation"),
    # Korthikanti et al. 2022 (Megatron, "Reducing Activation Recomputation"): selective
    # recompute costs ~2-4% time.
    "selective": Level(_L(1.04), time_sd=0.05, why="Korthikanti et al. 2022: +2-4% time"),
    # Full recompute re-runs the forward: +1/3 of forward+backward (Chen et al. 2016),
    # measured +36% in Korthikanti et al.
    "full": Level(_L(1.33), time_sd=0.1, why="Chen et al. 2016 / Korthikanti et al. 2022: +33-36% time"),
}
_ON_OFF = {"off": Level(why="reference: feature off")}
_TABLE: dict[str, dict[str, Level]] = {
    "checkpointing": _CHECKPOINTING,
    "recompute": _CHECKPOINTING,
    "activation_checkpointing": _CHECKPOINTING,
    "precision": {
        "fp32": Level(why="reference: fp32"),
        # Tensor-core bf16 matmuls run 2-16x fp32/tf32 (A100/H100 datasheets); end-to-end
        # AMP training ~2x (NVIDIA mixed-precision guide). Wide sd: on CPUs bf16 is often slower.
        "bf16": Level(_L(0.5), time_sd=0.6, why="NVIDIA AMP guide ~2x on tensor cores"),
        "fp16": Level(_L(0.5), time_sd=0.6, why="as bf16, plus loss scaling"),
    },
    "compile": {
        **_ON_OFF,
        # PyTorch 2.0 release: geomean 1.38x training speedup on 163 models (A100, AMP);
        # less on small/CPU models and sometimes a regression, hence sd 0.3.
        "on": Level(_L(0.8), time_sd=0.3, why="PyTorch 2.0 release: 1.38x geomean training speedup"),
    },
    "optimizer": {
        "forloop": Level(why="reference: per-parameter loop"),
        # Multi-tensor apply makes the optimizer step 2-3x faster (PyTorch docs); the step is
        # ~5-10% of a training step, so -5%.
        "foreach": Level(_L(0.95), time_sd=0.05, why="PyTorch optimizer docs: foreach 2-3x faster step, step ~5-10% of time"),
        "fused": Level(_L(0.93), time_sd=0.05, why="PyTorch fused Adam: one kernel; slightly better than foreach"),
    },
    "attention": {
        "naive": Level(why="reference: materialises the T x T score matrix"),
        # FlashAttention (Dao et al. 2022): attention 2-4x faster; attention is ~20-40% of
        # a GPT step at T~1k, so -20% overall.
        "sdpa": Level(_L(0.8), time_sd=0.3, why="Dao et al. 2022: attention 2-4x faster"),
        "flash": Level(_L(0.8), time_sd=0.3, why="Dao et al. 2022"),
    },
    "flash_attention": {**_ON_OFF, "on": Level(_L(0.8), time_sd=0.3, why="Dao et al. 2022: attention 2-4x faster")},
    # Apex/Megatron fused Adam: optimizer step in one kernel, ~5% of step time saved.
    "fused_optimizer": {**_ON_OFF, "on": Level(_L(0.95), time_sd=0.05, why="Megatron fused Adam: one kernel per step")},
    # Fused/chunked cross-entropy never materialises fp32 logits [tokens x vocab]: Liger
    # Kernel (Hsu et al. 2024) reports large memory savings at large vocab, small speedups.
    "fused_cross_entropy": {**_ON_OFF, "on": Level(_L(0.97), time_sd=0.05, why="Liger Kernel 2024: no fp32 logits tensor")},
    # Korthikanti et al. 2022: sequence parallelism shards layernorm/dropout activations over
    # TP ranks with the same communication volume.
    "sequence_parallel": {**_ON_OFF, "on": Level(_L(0.98), time_sd=0.05, why="Korthikanti et al. 2022: SP shards non-TP activations")},
    # Megatron-LM distributed optimizer docs: overlapping the DP reduce-scatter with backward
    # hides most of it (-5-10% when DP comm is visible).
    "overlap_grad_reduce": {**_ON_OFF, "on": Level(_L(0.93), time_sd=0.05, why="Megatron-LM: hide grad reduce under backward")},
    "overlap_param_gather": {**_ON_OFF, "on": Level(_L(0.96), time_sd=0.05, why="Megatron-LM: hide param all-gather under forward")},
}

# ZeRO (Rajbhandari et al. 2020): stage 3 moves 1.5x the DP communication volume (paper,
# Sec. 7), stages 1-2 the same.
_ZERO = {0: Level(why="reference: plain data parallel"),
         1: Level(0.0, time_sd=0.05, why="ZeRO paper: optimizer states sharded"),
         2: Level(_L(1.02), time_sd=0.05, why="ZeRO paper: + gradients sharded"),
         3: Level(_L(1.15), time_sd=0.1, why="ZeRO paper: + params sharded, 1.5x comm volume")}


def _micro_batch(mb: float) -> Level:
    # Kernels get more efficient with more rows per launch until the device saturates:
    # ~5-10% per doubling (common MLPerf/Megatron experience).
    return Level(-0.08 * math.log2(mb), time_sd=0.1, why="kernel efficiency per doubling")


_NUMERIC: dict[str, Callable[[float], Level]] = {
    "micro_batch": _micro_batch,
    "micro_batch_size": _micro_batch,
    # Megatron TP (Shoeybi et al. 2019, Narayanan et al. 2021): 77% scaling at tp=8 inside a
    # node, so each doubling costs ~5% of time at fixed devices.
    "tp": lambda v: Level(0.05 * math.log2(v), time_sd=0.1, why="Narayanan et al. 2021: TP comm per layer"),
    # Pipeline bubble (p-1)/m (GPipe, Huang et al. 2019) at typical m: ~8% per doubling.
    "pp": lambda v: Level(0.08 * math.log2(v), time_sd=0.1, why="GPipe bubble (p-1)/m"),
    # A campaign tunes a fixed allocation (tp * pp * dp = devices), so more data
    # parallelism means less tp/pp: their per-layer comm and bubble go (in their priors),
    # and each device multiplies larger matrices, taken as ~10% per doubling (Narayanan et
    # al. 2021 compare splits of a fixed device count: data parallelism is the cheapest
    # while the model fits); the ring all-reduce volume per rank hardly depends on dp
    # (Patarasuk & Yuan 2009).
    "dp": lambda v: Level(-0.1 * math.log2(v), time_sd=0.15, why="fixed device count: dp scales better than tp/pp (Narayanan et al. 2021)"),
    # Expert parallel (Lepikhin et al. 2020, GShard): all-to-all grows.
    "ep": lambda v: Level(0.05 * math.log2(v), time_sd=0.1, why="GShard: all-to-all cost"),
    # PyTorch DDP (Li et al. 2020, Fig. 9): 25 MB buckets near-optimal; U-shaped around it.
    "bucket_mb": lambda v: Level(0.02 * math.log2(v / 25.0) ** 2, time_sd=0.05, why="Li et al. 2020 (DDP): 25 MB near-optimal"),
    "bucket_size_mb": lambda v: Level(0.02 * math.log2(v / 25.0) ** 2, time_sd=0.05, why="Li et al. 2020 (DDP)"),
    # CPU DDP processes over a fixed batch: ideal -ln(n), gloo all-reduce eats about half;
    # activations split over processes, model states replicated (the part table has no
    # row for processes: this memory factor is on the whole peak).
    "nproc": lambda v: Level(-0.5 * _L(v), -0.2 * _L(v), 0.2, 0.2, "CPU DDP: half of linear scaling after gloo all-reduce"),
    # Intra-op threads: matmuls parallelise well, small ops do not (Amdahl): ~60% of ideal.
    "threads": lambda v: Level(-0.6 * _L(v), 0.0, 0.2, 0.05, "Amdahl: ~60% of ideal intra-op scaling"),
}


def _stage(v: float) -> Level:
    return _ZERO.get(int(v), Level(0.0, time_sd=0.7, memory_sd=0.7, why="unknown stage"))


for _name in STAGE_ROWS:
    _NUMERIC[_name] = _stage

# A mixture-of-experts job (its space has an expert-parallel knob) answers these knobs
# differently, and the dense rows above mislead there. The directions are published MoE
# practice; the sizes were set on the generated development jobs (least-squares effects
# over every config that runs, the 14 MoE jobs of ``DEVELOPMENT_SEEDS``; held-out jobs not
# looked at) and then checked on the 17 MoE jobs of ``EXTRA_DEVELOPMENT_SEEDS``, not used
# to set them: per doubling ep -0.28, micro-batch -0.27, tp +0.19 (sd over jobs 0.11-0.16),
# ZeRO-3 +0.73 from stage 1, where the dense rows said +0.05, -0.08, +0.05 and +0.14. The
# simulator implements the same mechanisms, so real MoE jobs have not checked them. The
# sds are wide enough to let a handful of trials overrule them. What they bought the
# search there: at 20 trials the mean fraction of the oracle over both development splits
# went from 0.925 to 0.933, the extra split alone from 0.930 to 0.932 (its median from
# 0.966 to 0.958): jobs whose optimum runs without EP (one or two nodes, where compile,
# which crashes with EP, pays more) lost what the others gained.
_MOE_NUMERIC: dict[str, Callable[[float], Level]] = {
    # Experts hold most of the parameters: without EP every rank keeps every expert, runs
    # each on a sliver of tokens (small GEMMs) and all-reduces all their gradients; EP
    # gives each expert ep x the tokens and shrinks its gradient group (Lepikhin et al.
    # 2020; DeepSpeed-MoE, Rajbhandari et al. 2022; Megatron-Core MoE guide: prefer EP
    # over TP for expert layers). Development jobs: -0.46, -0.77, -1.01 at ep 2, 4, 8 (median).
    "ep": lambda v: Level(-0.35 * math.log2(v), time_sd=0.2, why="MoE: tokens per expert and expert-gradient "
                                                                  "group scale with EP (GShard, DeepSpeed-MoE)"),
    # Tokens per expert scale with the micro-batch too: larger GEMMs matter more than in a
    # dense layer (development jobs: -0.39 and -0.70 at 2 and 4 from 1).
    "micro_batch": lambda v: Level(-0.25 * math.log2(v), time_sd=0.15, why="MoE: tokens per expert per micro-batch"),
    # TP splits the (small) dense part but not the experts under parallel folding, and adds
    # its per-layer collectives (development jobs: +0.08, +0.32, +0.77 at tp 2, 4, 8).
    "tp": lambda v: Level(0.15 * math.log2(v), time_sd=0.15, why="MoE: TP comm without sharding the experts "
                                                                 "(Megatron-Core parallel folding)"),
}
_MOE_NUMERIC["micro_batch_size"] = _MOE_NUMERIC["micro_batch"]
# ZeRO-3 gathers every expert's parameters each layer, forward and backward: most of an
# MoE's bytes, where a dense job gathers 1.5x its DP volume (DeepSpeed long kept ZeRO-3
# out of its MoE support). Development jobs: +1.28 from stage 1.
_MOE_ZERO3 = Level(_L(2.0), time_sd=0.4, why="MoE: ZeRO-3 gathers all expert parameters per layer")
for _name in STAGE_ROWS:
    _MOE_NUMERIC[_name] = lambda v: _MOE_ZERO3 if int(v) == 3 else _stage(v)


# Where a CPU trainer differs from the accelerator numbers above: a fused attention kernel
# has no HBM round trip to save (the FlashAttention gain is a GPU memory-hierarchy gain).
# PyTorch's sdpa on a 2-core CPU with AVX512-BF16 measured -14% step time in fp32 and +35%
# in bf16 against the naive path (median over 30 config pairs each,
# docs/benchmark/cpu_landscape): no direction to expect, so centred on 0 with the GPU
# prior's sd.
_CPU_SDPA = Level(0.0, time_sd=0.3, why="CPU: no HBM traffic to save; measured -14% (fp32) to +35% (bf16) on a CPU")
_CPU_TABLE: dict[str, dict[str, Level]] = {
    "attention": {"naive": _TABLE["attention"]["naive"], "sdpa": _CPU_SDPA, "flash": _CPU_SDPA},
    "flash_attention": {**_ON_OFF, "on": _CPU_SDPA},
}


def level(knob: str, value: Value, *, on_cpu: bool = False, moe: bool = False) -> Level | None:
    """The table's absolute level for one setting, or None when the table is silent.
    ``on_cpu``: the trials run on CPU only (no accelerator), where some numbers differ;
    ``moe``: a mixture-of-experts job (``_MOE_NUMERIC``)."""
    value = normalise(value)
    if knob in _NUMERIC and isinstance(value, (int, float)):
        table = _MOE_NUMERIC if moe and knob in _MOE_NUMERIC else _NUMERIC
        # Stage knobs start at 0; every other numeric knob is a positive count or size.
        return table[knob](value) if value > 0 or knob in STAGE_ROWS else None
    table = (_CPU_TABLE.get(knob) if on_cpu else None) or _TABLE.get(knob)
    return table.get(value) if table and isinstance(value, str) else None


def builtin_priors(space: KnobSpace, baseline: Config, *, on_cpu: bool = False) -> Priors:
    """Per-setting priors relative to ``baseline``; settings the table lacks are left out
    (``Priors.get`` then answers uninformed). ``on_cpu``: for trials without an accelerator.
    Values are looked up as the knob's ``levels`` spell them (``float32`` -> ``fp32``).
    A space with an expert-parallel knob is a mixture-of-experts job."""
    out = []
    moe = any(knob_row(k) == "ep" for k in space.knobs)
    for knob in space.knobs:
        row = knob_row(knob)
        base = None if row is None else level(row, knob.canonical(baseline[knob.name]), on_cpu=on_cpu, moe=moe)
        if base is None:
            continue
        for value in knob.values:
            lv = level(row, knob.canonical(value), on_cpu=on_cpu, moe=moe)
            if lv is None or value == baseline[knob.name]:
                continue
            # Where the part table knows the setting, the memory model takes its memory
            # from there (``memory_components``): this prior says nothing about memory.
            by_parts = memory_components.part_levels(row, knob.canonical(value)) is not None \
                and memory_components.part_levels(row, knob.canonical(baseline[knob.name])) is not None
            out.append(SettingPrior(
                knob=knob.name, value=value,
                log_time_mean=lv.log_time - base.log_time,
                log_time_std=max(math.hypot(lv.time_sd, base.time_sd), 0.02),
                log_memory_mean=0.0 if by_parts else lv.log_memory - base.log_memory,
                log_memory_std=UNINFORMED_LOG_STD if by_parts else max(math.hypot(lv.memory_sd, base.memory_sd), 0.02),
                source="builtin-cpu" if on_cpu else "builtin", rationale=lv.why))
    return Priors.of(out, "builtin-cpu" if on_cpu else "builtin")
