"""What a trial is and how it ended: an outcome enum plus one immutable result record."""

from __future__ import annotations

import dataclasses
import enum
import re
from dataclasses import dataclass, field
from typing import Any, Mapping

from infrarsi.core.knobs import Value
from infrarsi.core.serial import Record


class Outcome(str, enum.Enum):
    OK = "ok"
    OOM = "oom"
    CRASH = "crash"
    TIMEOUT = "timeout"
    CONTRACT_VIOLATION = "contract_violation"
    INVALID = "invalid"  # the job refused the config before running (e.g. uneven micro-batch)

    @property
    def failed(self) -> bool:
        return self is not Outcome.OK


class Role(str, enum.Enum):
    DOCTOR = "doctor"      # baseline repeats that measure noise and the reference loss
    SEARCH = "search"      # a proposer's candidate
    VERIFY = "verify"      # a finalist re-run in the A B A B verification
    VERIFY_BASELINE = "verify_baseline"  # the baseline half of a verification pair
    CALIBRATE = "calibrate"  # legitimate variants that calibrate the loss tolerance
    MINIMIZE = "minimize"  # the winner, and the winner less one change, measured for each change's share

    @classmethod
    def _missing_(cls, value: object) -> "Role | None":
        # Ledgers written before minimization stopped measuring its own baselines name the
        # baseline half of those rounds "minimize_baseline": read it as a minimization run.
        return cls.MINIMIZE if value == "minimize_baseline" else None


# One place decides what an out-of-memory looks like. Patterns are the real messages of
# the allocators and runtimes; anything else that fails is a crash, never silently an OOM.
_OOM_PATTERNS = re.compile(
    "|".join([
        r"CUDA out of memory",
        r"torch\.OutOfMemoryError",
        r"torch\.cuda\.OutOfMemoryError",
        r"HIP out of memory",
        r"\bMemoryError\b",
        r"std::bad_alloc",
        r"Cannot allocate memory",
        r"CUBLAS_STATUS_ALLOC_FAILED",
        r"NCCL.*(?:out of memory|ncclSystemError.*alloc)",
        r"RESOURCE_EXHAUSTED",
    ])
)


def is_out_of_memory(text: str) -> bool:
    """True when ``text`` (a trial's stderr tail) shows an out-of-memory failure."""
    return bool(_OOM_PATTERNS.search(text))


@dataclass(frozen=True, kw_only=True)
class TrialResult(Record):
    """The immutable record of one trial attempt, as written to the ledger.

    ``step_time_s`` is the harness-measured median step time over the contract's measured
    window (None unless the trial produced one). ``peak_memory_bytes`` is the peak the
    harness saw; for an OOM it is a lower bound (the trial was killed at or above
    ``memory_capacity_bytes``). ``host_peak_rss_bytes`` is the largest resident set of
    any process of the trial's tree, kept apart from the device memory it may stand in for.
    ``eval_losses`` are the job's evaluation losses in the order reported. ``startup_s`` is
    what the trial cost before its steps ran at their steady pace: the time from launch to
    the last warm-up step, less the warm-up steps at the measured median step time.
    ``loss_quantum`` (``eval_loss_quantum``) is one unit of the last digit the job printed
    its losses (eval losses) with, the largest over the run: None where it reported them at
    full precision (the Reporter, a framework callback).
    """

    trial_id: str
    config: Mapping[str, Value]
    role: Role
    outcome: Outcome
    step_time_s: float | None = None
    step_times_s: tuple[float, ...] = ()
    losses: tuple[float, ...] = ()
    eval_losses: tuple[float, ...] = ()
    loss_quantum: float | None = None
    eval_loss_quantum: float | None = None
    peak_memory_bytes: int | None = None
    host_peak_rss_bytes: int | None = None
    memory_capacity_bytes: int | None = None
    tokens_per_step: int | None = None
    wall_time_s: float = 0.0
    startup_s: float | None = None
    device_seconds: float = 0.0
    reason: str = ""
    attempt: int = 1
    patches: tuple[str, ...] = ()
    log_path: str | None = None
    phases_s: Mapping[str, float] = field(default_factory=dict)
    extra: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.outcome is Outcome.OK:
            assert self.step_time_s is not None, "an ok trial needs a step time"

    @property
    def censored(self) -> bool:
        """An OOM is a right-censored memory observation: peak >= capacity."""
        return self.outcome is Outcome.OOM

    @classmethod
    def upgrade(cls, data: Mapping[str, Any]) -> Mapping[str, Any]:
        """Older ledgers and bank rows wrote None for an empty reason or sequence."""
        empty = {k: () for k in ("step_times_s", "losses", "eval_losses", "patches") if data.get(k, ()) is None}
        return {**data, **empty, **({"reason": ""} if data.get("reason", "") is None else {})}

    def replace(self, **changes: Any) -> "TrialResult":
        return dataclasses.replace(self, **changes)
