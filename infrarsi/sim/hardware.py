"""GPU and cluster hardware: a named registry of frozen specs.

Numbers are vendor datasheet figures (dense bf16, no sparsity) and what NCCL reaches on
them in practice (bus bandwidth, nccl-tests). Sources: NVIDIA H100/H200/A100 datasheets;
NCCL all-reduce bus bandwidth on DGX H100 (~360-450 GB/s NVLink 4) and 8x400 Gb/s
InfiniBand per node (~45-50 GB/s per GPU); DGX A100 (NVLink 3, 8x200 Gb/s HDR).
"""

from __future__ import annotations

from dataclasses import dataclass

from infrarsi.core.errors import SpecError

GiB = 2**30
# Sustained share of the A100's 312 TFLOP/s that large bf16 GEMMs reach in training.
# Checked against llm-foundry's published A100-80GB MFUs (scripts/train/benchmarking/
# README.md: MPT-7B on 8 GPUs, FSDP full shard, 64.2% at seq 2048 without activation
# checkpointing, 54.8% at seq 4096 with it): 0.85 put the simulator 14% and 4% above
# them, 0.80 puts it 9% above and 1% below (``calibration.py``).
A100_GEMM_MAX = 0.80


@dataclass(frozen=True, kw_only=True)
class Hardware:
    name: str
    peak_flops: float            # dense bf16 FLOP/s per GPU
    memory_bytes: int            # HBM capacity per GPU as the allocator sees it
    hbm_bytes_per_s: float       # HBM bandwidth per GPU
    gpus_per_node: int
    nvlink_bytes_per_s: float    # achievable bus bandwidth of a collective inside a node
    network_bytes_per_s: float   # achievable bus bandwidth per GPU across nodes
    nvlink_latency_s: float = 8e-6   # alpha of one ring step inside a node
    network_latency_s: float = 20e-6
    # GEMM efficiency curve eff(W) = gemm_max * W / (W + gemm_half_flops), W = FLOPs of one
    # GEMM: small GEMMs cannot fill the SMs (wave quantisation, launch tail).
    # gemm_max is the sustained fraction of the datasheet peak: large bf16 GEMMs reach
    # ~750 TFLOP/s on H100 SXM in isolation, less under the power cap of a full node.
    gemm_max: float = 0.66
    gemm_half_flops: float = 6e9
    flash_attention_efficiency: float = 0.35  # FlashAttention-2 on H100, causal FLOPs (Dao 2023: ~335 TFLOP/s)
    host_op_s: float = 10e-6    # host time to dispatch one eager op (Python + launch)

    def __post_init__(self) -> None:
        for f in ("peak_flops", "memory_bytes", "hbm_bytes_per_s", "gpus_per_node",
                  "nvlink_bytes_per_s", "network_bytes_per_s"):
            if not getattr(self, f) > 0:
                raise SpecError(f"hardware {self.name!r}: {f} must be > 0, got {getattr(self, f)}")


_HARDWARE = {
    h.name: h
    for h in [
        Hardware(name="h100-sxm-80gb", peak_flops=989e12, memory_bytes=80 * GiB, hbm_bytes_per_s=3.35e12,
                 gpus_per_node=8, nvlink_bytes_per_s=360e9, network_bytes_per_s=45e9),
        Hardware(name="h200-141gb", peak_flops=989e12, memory_bytes=141 * 10**9, hbm_bytes_per_s=4.8e12,
                 gpus_per_node=8, nvlink_bytes_per_s=360e9, network_bytes_per_s=45e9),
        # The same H100 node on a slower network: 8x200 Gb/s RoCE per node (25 GB/s per
        # GPU raw, ~20 GB/s bus bandwidth), a common Ethernet build-out.
        Hardware(name="h100-sxm-80gb-roce200", peak_flops=989e12, memory_bytes=80 * GiB, hbm_bytes_per_s=3.35e12,
                 gpus_per_node=8, nvlink_bytes_per_s=360e9, network_bytes_per_s=20e9, network_latency_s=30e-6),
        Hardware(name="a100-80gb", peak_flops=312e12, memory_bytes=80 * GiB, hbm_bytes_per_s=2.04e12,
                 gpus_per_node=8, nvlink_bytes_per_s=230e9, network_bytes_per_s=22e9,
                 gemm_max=A100_GEMM_MAX, gemm_half_flops=2e9, flash_attention_efficiency=0.55),
        Hardware(name="a100-40gb", peak_flops=312e12, memory_bytes=40 * GiB, hbm_bytes_per_s=1.56e12,
                 gpus_per_node=8, nvlink_bytes_per_s=230e9, network_bytes_per_s=22e9,
                 gemm_max=A100_GEMM_MAX, gemm_half_flops=2e9, flash_attention_efficiency=0.55),
        # A toy device so tests and examples run instantly; not calibrated against anything.
        # Its capacity sits near the median peak of the debug workload (which the fixed
        # 2.5 GiB framework overhead dominates), so tests meet both ok and OOM.
        Hardware(name="debug", peak_flops=1e12, memory_bytes=int(2.5816 * GiB), hbm_bytes_per_s=1e11,
                 gpus_per_node=4, nvlink_bytes_per_s=1e10, network_bytes_per_s=1e9,
                 gemm_half_flops=1e7),
    ]
}


def hardware(name: str) -> Hardware:
    if name not in _HARDWARE:
        raise SpecError(f"unknown hardware {name!r}; choose one of {sorted(_HARDWARE)}")
    return _HARDWARE[name]


def hardware_names() -> list[str]:
    return sorted(_HARDWARE)
