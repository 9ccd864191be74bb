"""How one loss trajectory is compared with another: the signal compared (per step, a
moving window, the eval losses), the relative deviation's mean and trend, and the
tolerance a run of one numerics class is held to."""

from __future__ import annotations

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

    def compare(self, losses: Sequence[float], eval_losses: Sequence[float] = ()) -> Deviation:
        ref = signal_points(self.losses, self.eval_losses, self.signal, self.window)
        got = signal_points(losses, eval_losses, self.signal, self.window)
        return Deviation.of([(g - r) / max(abs(r), 1e-12) for r, g in zip(ref, got)])

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


def pct(x: float, sign: str = "") -> str:
    """A relative deviation as a percentage that stays readable at near-exact tolerances."""
    return f"{x:{sign}.2%}" if abs(x) >= 1e-4 or x == 0 else f"{x * 100:{sign}.2g}%"
