"""Exact optimum of a workload: every feasible config priced at once (numpy)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from infrarsi.core.knobs import Config
from infrarsi.sim.cost import Estimate, estimate
from infrarsi.sim.grid import feasible_columns
from infrarsi.sim.job import columns
from infrarsi.sim.workload import Workload


@dataclass(frozen=True, kw_only=True)
class OracleResult:
    best_config: Config
    best_step_time_s: float
    baseline_step_time_s: float
    best_mfu: float
    baseline_mfu: float
    num_feasible: int
    num_ok: int
    num_oom: int
    num_crash: int

    @property
    def speedup(self) -> float:
        return self.baseline_step_time_s / self.best_step_time_s


def evaluate_space(w: Workload) -> tuple[np.ndarray, Estimate]:
    """Value indices of every feasible config and their noise-free estimates."""
    idx, cols = feasible_columns(w.space)
    return idx, estimate(w.job, cols)


def oracle(w: Workload) -> OracleResult:
    idx, est = evaluate_space(w)
    times = np.where(est.ok, est.step_time_s, np.inf)
    best = int(np.argmin(times))
    base = estimate(w.job, columns(w.baseline))
    return OracleResult(
        best_config=w.space.from_indices(idx[best]), best_step_time_s=float(times[best]),
        baseline_step_time_s=float(base.step_time_s[0]), best_mfu=float(est.mfu[best]),
        baseline_mfu=float(base.mfu[0]), num_feasible=len(idx), num_ok=int(est.ok.sum()),
        num_oom=int(est.oom.sum()), num_crash=int((est.crash_code > 0).sum()),
    )
