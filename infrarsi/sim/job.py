"""A training job to simulate (model, hardware, scale, batch) and the knob columns the
cost model reads.

The cost model is vectorised: a config is a mapping from knob name to a numpy array (one
element per config), so one call prices one config or the whole feasible space alike.
Knobs a workload does not expose take the ``KNOB_DEFAULTS`` value.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping

import numpy as np

from infrarsi.core.errors import SpecError
from infrarsi.sim.hardware import Hardware, hardware
from infrarsi.sim.models import ModelShape, model_shape

# Every knob the simulator understands, with the value a job has when a workload does not
# expose it (a plain eager data-parallel job).
KNOB_DEFAULTS: dict[str, object] = {
    "tp": 1, "pp": 1, "dp": 1, "ep": 1,
    "zero": 0,                      # 0 DDP, 1 distributed optimizer, 2 +grads, 3 FSDP/full shard
    "micro_batch": 1,               # sequences per micro-batch; accumulation = global / (dp * micro_batch)
    "recompute": "none",            # none / selective (core attention) / full (every layer)
    "sequence_parallel": False,
    "overlap_grad_reduce": False,
    "overlap_param_gather": False,
    "bucket_mb": 40,
    "compile": False,               # torch.compile of each block
    "flash_attention": True,
    "fused_optimizer": False,       # fused AdamW kernel instead of foreach
    "fused_ce": False,              # fused (chunked) cross-entropy, no fp32 logits
    "grouped_gemm": False,          # MoE experts as one grouped GEMM instead of a loop
}


@dataclass(frozen=True, kw_only=True)
class Job:
    model: ModelShape
    hw: Hardware
    num_gpus: int
    seq_len: int
    global_batch: int               # sequences per optimizer step (fixed by the contract)

    @classmethod
    def of(cls, *, model: str, hw: str, num_gpus: int, seq_len: int, global_batch: int) -> "Job":
        return cls(model=model_shape(model), hw=hardware(hw), num_gpus=num_gpus, seq_len=seq_len,
                   global_batch=global_batch)

    def __post_init__(self) -> None:
        for f in ("num_gpus", "seq_len", "global_batch"):
            if getattr(self, f) < 1:
                raise SpecError(f"job: {f} must be >= 1, got {getattr(self, f)}")

    @property
    def tokens_per_step(self) -> int:
        return self.seq_len * self.global_batch


Columns = dict[str, np.ndarray]


def columns(configs: Iterable[Mapping[str, object]] | Mapping[str, object]) -> Columns:
    """Knob columns for one config (a mapping) or many (an iterable of mappings)."""
    rows = [configs] if isinstance(configs, Mapping) else list(configs)
    unknown = {k for r in rows for k in r} - set(KNOB_DEFAULTS)
    if unknown:
        raise SpecError(f"config: knob(s) {sorted(unknown)} are unknown to the simulator; "
                        f"it knows {sorted(KNOB_DEFAULTS)}")
    return {k: np.array([r.get(k, d) for r in rows]) for k, d in KNOB_DEFAULTS.items()}


def fill_defaults(cols: Mapping[str, np.ndarray]) -> Columns:
    n = len(next(iter(cols.values()))) if cols else 1
    return {k: np.asarray(cols[k]) if k in cols else np.full(n, d) for k, d in KNOB_DEFAULTS.items()}
