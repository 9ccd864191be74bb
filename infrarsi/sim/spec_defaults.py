"""The spec fields a ``backend = "sim"`` campaign takes from the simulator: its workload's
knobs, constraints, baseline, contract numbers and capacity."""

from __future__ import annotations

from typing import Any

from infrarsi.sim.backend import NUM_STEPS, WARMUP_STEPS, sim_workload


def sim_spec_defaults(name: str) -> dict[str, Any]:
    """Spec fields a ``backend = "sim"`` campaign takes from the simulator's workload."""
    w = sim_workload(name)
    return {
        "description": w.description, "workload_dir": ".", "command": ["sim"],
        "knobs": {k.name: {"values": list(k.values), "description": k.description} for k in w.space.knobs},
        "constraints": [c.expr for c in w.space.constraints], "baseline": dict(w.baseline),
        "contract": {"seq_len": w.job.seq_len, "global_batch_tokens": w.job.seq_len * w.job.global_batch,
                     "num_steps": NUM_STEPS + WARMUP_STEPS, "warmup_steps": WARMUP_STEPS,
                     "locked": ["*"]},
        "device": {"memory_capacity": w.memory_capacity_bytes, "emulate_capacity": False},
        "resources": {"cpus_per_trial": 0.5},
    }
