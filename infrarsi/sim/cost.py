"""The noise-free cost of configs: step time, peak memory, crash, MFU (vectorised)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from infrarsi.sim.failures import crash_codes
from infrarsi.sim.job import Columns, Job, fill_defaults
from infrarsi.sim.memory import peak_memory_bytes
from infrarsi.sim.timing import step_time_s


@dataclass(frozen=True, kw_only=True)
class Estimate:
    """One entry per config. ``step_time_s`` is what the step would take if it ran, also
    for configs that OOM or crash; ``ok`` says whether it runs."""

    step_time_s: np.ndarray
    peak_memory_bytes: np.ndarray
    crash_code: np.ndarray
    oom: np.ndarray
    mfu: np.ndarray

    @property
    def ok(self) -> np.ndarray:
        return ~self.oom & (self.crash_code == 0)


def num_microbatches(job: Job, c: Columns) -> np.ndarray:
    return job.global_batch / (c["dp"] * c["micro_batch"])


def mfu(job: Job, step_time: np.ndarray, *, causal: bool = True) -> np.ndarray:
    """Model FLOPs utilisation: model FLOPs per step (recompute not counted) over
    ``step_time * num_gpus * peak``, as Chowdhery et al. 2022 (PaLM) define it; attention
    counted causally (half the score and value products) unless ``causal`` is False."""
    flops = job.tokens_per_step * job.model.flops_per_token(job.seq_len, causal=causal)
    return flops / (step_time * job.num_gpus * job.hw.peak_flops)


def estimate(job: Job, cols: Columns) -> Estimate:
    c = fill_defaults(cols)
    m = num_microbatches(job, c)
    t = step_time_s(job, c, m)
    peak = peak_memory_bytes(job, c, m)
    crash = crash_codes(c)
    # A crash happens at start-up (compile / first collective), before memory fills up.
    oom = (peak > job.hw.memory_bytes) & (crash == 0)
    return Estimate(step_time_s=t, peak_memory_bytes=peak, crash_code=crash, oom=oom, mfu=mfu(job, t))
