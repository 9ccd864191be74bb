"""What minimization kept of the verified winner, and what stands promoted after it
(``infrarsi.stages.run.minimize`` decides it): minimize.json."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from infrarsi.core.knobs import Value
from infrarsi.core.serial import Record
from infrarsi.record.verification import VerificationReport


@dataclass(frozen=True, kw_only=True)
class Contribution:
    """One change of the leader: how much slower it is without it (>1: it pays)."""

    knob: str
    baseline_value: Value
    value: Value
    contribution: float | None  # objective without the change / with it
    ci_low: float | None
    ci_high: float | None
    step_contribution: float | None  # the same on step time alone
    pairs: tuple[tuple[str, str], ...] = ()  # (run with it, run without it), where measured
    inert: bool = False  # doctor's calibration saw it move neither the loss nor the speed
    kept: bool = True
    source: str = "measured"  # "measured" (leave-one-out pairs) or "predicted" (the time model)
    ground: str = ""  # a Ground: why it was kept or dropped
    note: str = ""


@dataclass(frozen=True, kw_only=True)
class MinimizeReport(Record):
    winner: Mapping[str, Value]
    promoted: Mapping[str, Value] | None
    contributions: tuple[Contribution, ...]
    dropped: tuple[str, ...]
    margin: float
    job_steps: float | None
    num_trials: int  # runs of the smaller configs (their baselines are verification's)
    note: str
    final: VerificationReport  # what is promoted after minimization
