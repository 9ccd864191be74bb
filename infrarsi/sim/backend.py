"""The ``sim`` trial backend: one simulated trial of a workload config.

Noise: every step time is the noise-free time times ``exp(N(0, sigma^2))`` (lognormal,
sigma = 2%, the run-to-run coefficient of variation typical of a quiet GPU node), plus a
per-trial factor of the same size (node-to-node variation). Draws come from a generator
seeded by (seed, trial_index, workload) so a trial is reproducible and distinct trials
differ. Wall time of a trial: start-up (process launch, NCCL init, compile) plus warm-up
and measured steps; a crash dies at start-up, an OOM in its first step.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Mapping

import numpy as np

from infrarsi.core.knobs import Value
from infrarsi.core.trial import Outcome
from infrarsi.sim.cost import estimate
from infrarsi.sim.failures import CRASH_REASONS
from infrarsi.sim.job import columns
from infrarsi.sim.workload import Workload
from infrarsi.sim.workloads import workload

NOISE_SIGMA = 0.02
NUM_STEPS = 5
WARMUP_STEPS = 3
STARTUP_S = 60.0
COMPILE_STARTUP_S = 90.0


@dataclass(frozen=True, kw_only=True)
class SimOutcome:
    outcome: Outcome
    step_time_s: float | None           # median of the noisy steps; None unless ok
    step_times_s: tuple[float, ...]
    true_step_time_s: float             # noise-free; what the config would take (for scoring)
    peak_memory_bytes: int              # for an OOM the true peak (the caller censors it)
    memory_capacity_bytes: int
    mfu: float | None                   # from the noisy median; None unless ok
    trial_time_s: float                 # simulated wall time the trial occupied its GPUs
    reason: str = ""


def sim_workload(name: str) -> Workload:
    """The workload ``name`` (space, baseline config, capacity, description)."""
    return workload(name)


def simulate_trial(workload_name: str, config: Mapping[str, Value], *, seed: int, trial_index: int) -> SimOutcome:
    w = workload(workload_name)
    # A knob the spec adds beyond the workload's is one the simulated job ignores (inert).
    cfg = w.space.validate({k: v for k, v in config.items() if k in w.space.names})
    est = estimate(w.job, columns(cfg))
    true_time = float(est.step_time_s[0])
    peak = int(est.peak_memory_bytes[0])
    capacity = w.memory_capacity_bytes
    startup = COMPILE_STARTUP_S if cfg.get("compile") else STARTUP_S
    crash = int(est.crash_code[0])
    if crash:
        return SimOutcome(outcome=Outcome.CRASH, step_time_s=None, step_times_s=(), true_step_time_s=true_time,
                          peak_memory_bytes=peak, memory_capacity_bytes=capacity, mfu=None,
                          trial_time_s=startup, reason=CRASH_REASONS[crash])
    if est.oom[0]:
        return SimOutcome(outcome=Outcome.OOM, step_time_s=None, step_times_s=(), true_step_time_s=true_time,
                          peak_memory_bytes=peak, memory_capacity_bytes=capacity, mfu=None,
                          trial_time_s=startup + true_time,
                          reason=f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate more than "
                                 f"{capacity / 2**30:.2f} GiB total capacity (peak {peak / 2**30:.2f} GiB)")
    rng = np.random.default_rng([seed, trial_index, zlib.crc32(workload_name.encode())])
    trial_factor = rng.lognormal(0.0, NOISE_SIGMA)
    steps = tuple(float(x) for x in true_time * trial_factor * rng.lognormal(0.0, NOISE_SIGMA, NUM_STEPS))
    median = float(np.median(steps))
    mfu = float(est.mfu[0]) * true_time / median
    return SimOutcome(outcome=Outcome.OK, step_time_s=median, step_times_s=steps, true_step_time_s=true_time,
                      peak_memory_bytes=peak, memory_capacity_bytes=capacity, mfu=mfu,
                      trial_time_s=startup + (NUM_STEPS + WARMUP_STEPS) * true_time)
