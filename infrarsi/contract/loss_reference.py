"""How one loss trajectory is compared with another: the signal compared (per step, a
moving window, the eval losses), the relative deviation's mean and trend, and the
tolerance a run of one numerics class is held to.

A job that prints its loss rounded (a Trainer's four significant digits, nanoGPT's four
decimals) cannot show a change smaller than one unit of its last digit: two runs whose true
losses differ by far less still print values one unit apart where the rounding falls
between them. So each point's relative deviation is shrunk toward zero by one such unit
(``quantum``) before the trajectory's mean and trend are taken: a one-digit flip is no
deviation, a sustained shift larger than a digit still is, and one smaller than a digit
cannot be seen at all (``LossContract.resolution`` says how small that is).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Sequence

from infrarsi.core.trial import TrialResult

SIGNALS = ("step", "window", "eval")


@dataclass(frozen=True, kw_only=True)
class Deviation:
    """How a trajectory departs from its reference: relative deviation per point (a step,
    a window of steps or an eval), its mean, and the value of its least-squares trend
    line at the last point. ``score`` (the larger of the two in size) is what is compared
    with the tolerance: a drift or an offset, never one point's excess alone."""

    points: tuple[float, ...]
    mean: float
    trend_end: float

    @property
    def score(self) -> float:
        return max(abs(self.mean), abs(self.trend_end))

    @property
    def signed(self) -> float:
        return self.mean if abs(self.mean) >= abs(self.trend_end) else self.trend_end

    @classmethod
    def of(cls, points: Sequence[float]) -> "Deviation":
        n = len(points)
        mean = statistics.fmean(points) if n else 0.0
        if n < 3:
            return cls(points=tuple(points), mean=mean, trend_end=mean)
        slope = statistics.linear_regression(range(n), points).slope
        return cls(points=tuple(points), mean=mean, trend_end=mean + slope * (n - 1) / 2)


def signal_points(losses: Sequence[float], eval_losses: Sequence[float], signal: str, window: int) -> list[float]:
    """The values a signal compares: per-step losses, their moving mean over ``window``
    steps, or the job's eval losses."""
    if signal == "eval":
        return list(eval_losses)
    if signal == "window" and window > 1:
        return [statistics.fmean(losses[i:i + window]) for i in range(len(losses) - window + 1)]
    return list(losses)


@dataclass(frozen=True, kw_only=True)
class LossReference:
    """A reference trajectory and the tolerance a run of its numerics is held to."""

    losses: tuple[float, ...]
    tolerance: float  # max |mean| and |trend end| of the relative deviation
    name: str = "the baseline"  # what the losses are, for the violation message
    eval_losses: tuple[float, ...] = ()
    signal: str = "step"  # one of SIGNALS
    window: int = 1  # steps per moving mean (signal "window")
    quantum: float = 0.0  # one unit of the last digit the compared values are printed with (0: full precision)

    def compare(self, losses: Sequence[float], eval_losses: Sequence[float] = ()) -> Deviation:
        ref = signal_points(self.losses, self.eval_losses, self.signal, self.window)
        got = signal_points(losses, eval_losses, self.signal, self.window)
        return Deviation.of([beyond_rounding(g - r, r, self.quantum) for r, g in zip(ref, got)])

    def deviation(self, losses: Sequence[float]) -> tuple[float, int]:
        """Largest signed relative per-step deviation from the reference and its step."""
        worst, at = 0.0, -1
        for i, (ref, got) in enumerate(zip(self.losses, losses)):
            dev = (got - ref) / max(abs(ref), 1e-12)
            if abs(dev) > abs(worst):
                worst, at = dev, i
        return worst, at

    def problems(self, result: TrialResult) -> list[str]:
        what = {"step": "loss", "window": f"{self.window}-step mean loss", "eval": "eval loss"}[self.signal]
        if self.signal == "eval" and len(result.eval_losses) != len(self.eval_losses):
            return [f"reported {len(result.eval_losses)} eval losses where {self.name} reported "
                    f"{len(self.eval_losses)}"]
        if not result.losses:
            return []
        dev = self.compare(result.losses, result.eval_losses)
        if dev.score <= self.tolerance:
            return []
        side = "below" if dev.signed < 0 else "above"
        return [f"{what} is {pct(dev.score)} {side} {self.name} over the trajectory (mean {pct(dev.mean, '+')}, "
                f"trend at the last point {pct(dev.trend_end, '+')}; tolerance {pct(self.tolerance)})"]


def beyond_rounding(difference: float, reference: float, quantum: float) -> float:
    """The relative deviation ``difference / reference`` less what rounding to ``quantum``
    can make of no difference at all (one unit: two printed values each within half a unit
    of the true ones), toward zero."""
    scale = max(abs(reference), 1e-12)
    return math.copysign(max(0.0, abs(difference) - quantum) / scale, difference)


def pct(x: float, sign: str = "") -> str:
    """A relative deviation as a percentage that stays readable at near-exact tolerances."""
    return f"{x:{sign}.2%}" if abs(x) >= 1e-4 or x == 0 else f"{x * 100:{sign}.2g}%"
