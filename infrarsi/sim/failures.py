"""Knob combinations that crash, as real stacks do. The search must discover these; the
knob space does not forbid them.

Each rule is modelled on a known class of failure (the messages are what the job prints):

1. ``torch.compile`` + fused cross-entropy: the custom Triton loss kernel is opaque to
   Dynamo and its autograd function breaks the graph into a recompile loop
   (cf. pytorch/pytorch issues on user-defined Triton kernels under compile).
2. ``torch.compile`` + selective recompute + sequence parallelism: checkpointed regions
   that contain the sequence-parallel all-gather autograd function do not trace.
3. ``torch.compile`` + expert parallelism: all-to-all with data-dependent split sizes
   hits Dynamo's recompile limit and the job aborts.
4. ZeRO-3 + pipeline parallelism + parameter-gather overlap: prefetches race the
   pipeline schedule and the NCCL watchdog kills the job.
"""

from __future__ import annotations

import numpy as np

from infrarsi.sim.job import Columns

CRASH_REASONS = {
    1: "torch._dynamo.exc.Unsupported: call_function UserDefinedTritonKernel in fused cross-entropy "
       "(compile + fused_ce)",
    2: "torch._dynamo.exc.TorchRuntimeError: checkpointed region contains sequence-parallel gather "
       "(compile + selective recompute + sequence_parallel)",
    3: "torch._dynamo hit config.recompile_limit (8) on all_to_all_single split sizes (compile + ep > 1)",
    4: "NCCL watchdog: Watchdog caught collective operation timeout: WorkNCCL(OpType=_ALLGATHER_BASE) "
       "(zero 3 + pp > 1 + overlap_param_gather)",
}


def crash_codes(c: Columns) -> np.ndarray:
    """0 where the config runs, else the number of the first rule it trips."""
    compiled = c["compile"].astype(bool)
    rules = [
        compiled & c["fused_ce"].astype(bool),
        compiled & (c["recompute"] == "selective") & c["sequence_parallel"].astype(bool),
        compiled & (c["ep"] > 1),
        (c["zero"] == 3) & (c["pp"] > 1) & c["overlap_param_gather"].astype(bool),
    ]
    return np.select(rules, [1, 2, 3, 4], default=0)
