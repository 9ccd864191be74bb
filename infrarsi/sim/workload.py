"""What a simulated workload is: a job, its knob space, the baseline a user would write.

``workloads`` names the built-in ones; ``generator`` draws more from a seed. Both build
their spaces with ``knob_space``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from infrarsi.core.errors import SpecError
from infrarsi.core.knobs import Config, Constraint, Knob, KnobSpace
from infrarsi.sim.job import Job

_DESCRIPTIONS = {
    "tp": "tensor-parallel degree", "pp": "pipeline-parallel degree", "dp": "data-parallel degree",
    "ep": "expert-parallel degree (folded into dp x tp)", "zero": "ZeRO stage (3 = FSDP full shard)",
    "micro_batch": "sequences per micro-batch (accumulation keeps the global batch)",
    "recompute": "activation recompute", "sequence_parallel": "sequence parallelism (needs tp > 1)",
    "overlap_grad_reduce": "overlap gradient reduction with backward",
    "overlap_param_gather": "overlap parameter all-gather with forward (needs zero >= 1)",
    "bucket_mb": "communication bucket size, MB", "compile": "torch.compile each block",
    "flash_attention": "FlashAttention kernel", "fused_optimizer": "fused AdamW kernel",
    "fused_ce": "fused cross-entropy kernel", "grouped_gemm": "grouped GEMM for MoE experts",
}


@dataclass(frozen=True, kw_only=True)
class Workload:
    name: str
    description: str
    job: Job
    space: KnobSpace
    baseline: Config
    paper: dict[str, float] = field(default_factory=dict)  # the paper's reported figures

    def __post_init__(self) -> None:
        self.space.validate(self.baseline, what=f"workload {self.name!r} baseline")
        if not self.space.is_feasible(self.baseline):
            raise SpecError(f"workload {self.name!r}: baseline violates {self.space.violated(self.baseline)}")

    @property
    def memory_capacity_bytes(self) -> int:
        return self.job.hw.memory_bytes


def knob_space(job: Job, domains: dict[str, tuple]) -> KnobSpace:
    m = job.model
    knobs = tuple(Knob(name=n, values=v, description=_DESCRIPTIONS[n]) for n, v in domains.items())
    cons = [f"tp * pp * dp == {job.num_gpus}" if "pp" in domains else f"tp * dp == {job.num_gpus}",
            f"{job.global_batch} % (dp * micro_batch) == 0",
            f"{m.num_kv_heads} % tp == 0",
            "not sequence_parallel or tp > 1",
            "not overlap_param_gather or zero >= 1"]
    if "pp" in domains:
        cons.append(f"{m.num_layers} % pp == 0")
    if "ep" in domains:
        cons.append(f"(dp * tp) % ep == 0 and {m.num_experts} % ep == 0")
    return KnobSpace(knobs=knobs, constraints=tuple(Constraint(c) for c in cons))
