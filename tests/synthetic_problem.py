"""A small synthetic tuning problem with known truth: planted time and memory effects,
one time interaction, a memory wall, an infeasible pair and a crashing pair."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from infrarsi.core.knobs import Config, Constraint, Knob, KnobSpace
from infrarsi.core.trial import Outcome, Role, TrialResult

GIB = 2**30
SPACE = KnobSpace(
    knobs=(
        Knob(name="micro_batch", values=(1, 2, 4, 8)),
        Knob(name="checkpointing", values=("none", "selective", "full")),
        Knob(name="compile", values=("off", "on")),
        Knob(name="attention", values=("naive", "sdpa")),
        Knob(name="optimizer", values=("forloop", "foreach", "fused")),
    ),
    constraints=(Constraint("not (compile == 'on' and checkpointing == 'selective')"),),
)
BASELINE: Config = {"micro_batch": 1, "checkpointing": "none", "compile": "off",
                    "attention": "naive", "optimizer": "forloop"}
TIME = {("micro_batch", 2): -0.15, ("micro_batch", 4): -0.3, ("micro_batch", 8): -0.45,
        ("checkpointing", "selective"): 0.05, ("checkpointing", "full"): 0.3,
        ("compile", "on"): -0.2, ("attention", "sdpa"): -0.15,
        ("optimizer", "foreach"): -0.05, ("optimizer", "fused"): -0.08}
INTERACTION = {(("compile", "on"), ("attention", "sdpa")): 0.12}
MEMORY = {("micro_batch", 2): 0.3, ("micro_batch", 4): 0.7, ("micro_batch", 8): 1.2,
          ("checkpointing", "selective"): -0.3, ("checkpointing", "full"): -0.7,
          ("compile", "on"): -0.05, ("attention", "sdpa"): -0.2, ("optimizer", "foreach"): 0.02}
CRASH_PAIR = (("compile", "on"), ("optimizer", "fused"))
BASE_TIME_S, BASE_MEMORY_BYTES, CAPACITY_BYTES = 1.0, 10 * GIB, 24 * GIB


@dataclass
class SyntheticProblem:
    space: KnobSpace = SPACE
    baseline: Config = field(default_factory=lambda: dict(BASELINE))
    time_noise_sd: float = 0.02
    memory_noise_sd: float = 0.01
    seed: int = 0
    # Start-up seconds of a run (compile on, compile off); None: runs record no wall time.
    startup_s: tuple[float, float] | None = None

    def __post_init__(self) -> None:
        self.rng = np.random.default_rng(self.seed)
        self.num_runs = 0

    def log_time(self, c: Config) -> float:
        t = math.log(BASE_TIME_S) + sum(TIME.get((k, c[k]), 0.0) for k in c)
        return t + sum(v for (a, b), v in INTERACTION.items() if c[a[0]] == a[1] and c[b[0]] == b[1])

    def log_memory(self, c: Config) -> float:
        return math.log(BASE_MEMORY_BYTES) + sum(MEMORY.get((k, c[k]), 0.0) for k in c)

    def crashes(self, c: Config) -> bool:
        return all(c[k] == v for k, v in CRASH_PAIR)

    def fits(self, c: Config) -> bool:
        return self.log_memory(c) < math.log(CAPACITY_BYTES)

    def optimum(self) -> Config:
        ok = [c for c in self.space.feasible if self.fits(c) and not self.crashes(c)]
        return min(ok, key=self.log_time)

    def run(self, c: Config, role: Role = Role.SEARCH) -> TrialResult:
        self.num_runs += 1
        tid = f"t{self.num_runs:03d}"
        common = dict(trial_id=tid, config=dict(c), role=role, memory_capacity_bytes=CAPACITY_BYTES)
        if self.crashes(c):
            return TrialResult(outcome=Outcome.CRASH, reason="compile error", **common)
        peak = math.exp(self.log_memory(c) + self.rng.normal(0, self.memory_noise_sd))
        if peak >= CAPACITY_BYTES:
            return TrialResult(outcome=Outcome.OOM, peak_memory_bytes=CAPACITY_BYTES, **common)
        step = math.exp(self.log_time(c) + self.rng.normal(0, self.time_noise_sd))
        wall = 0.0 if self.startup_s is None else self.startup_s[c["compile"] == "off"] + 10 * step
        return TrialResult(outcome=Outcome.OK, step_time_s=step, peak_memory_bytes=int(peak), wall_time_s=wall,
                           **common)
