"""Contract checks applied to every finished trial before anything may learn from it.

A trial that ran to the end but broke the contract becomes ``contract_violation`` with
the reason; it is recorded, never promoted, and the search sees it as a failure.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

from infrarsi.launcher import STAMP_LATENCY_S
from infrarsi.spec import ContractSpec
from infrarsi.trial import Outcome, TrialResult

# Per measured step: what an honest job's own step timer may leave out of the harness's
# interval (the tiny GPT job's reported steps were 7 ms short of the harness's per step
# at load average 31 on 2 cores). Steps shorter than this are not cross-checked usefully.
UNTIMED_GAP_S = 0.01

if TYPE_CHECKING:
    from infrarsi.loss_contract import LossContract

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


def contract_problems(result: TrialResult, contract: ContractSpec,
                      reference: "LossReference | LossContract | None") -> list[str]:
    """Every way an ok trial broke the contract; empty when it kept it. ``reference`` is a
    ``LossReference`` or a class-aware set of them (``LossContract``), which picks the
    reference in the trial's own numerics."""
    problems: list[str] = []
    if result.extra.get("simulated"):  # the simulator honours the workload by construction
        return problems
    start = result.extra.get("start") or {}
    if start.get("seq_len") is not None and start["seq_len"] != contract.seq_len:
        problems.append(f"sequence length {start['seq_len']} != contract {contract.seq_len}")
    if result.tokens_per_step != contract.global_batch_tokens:
        problems.append(f"tokens per step {result.tokens_per_step} != contract {contract.global_batch_tokens}")
    if len(result.losses) != contract.num_steps:
        problems.append(f"reported {len(result.losses)} losses for {contract.num_steps} steps")
    problems += _timing_problems(result, contract)
    if reference is not None and not isinstance(reference, LossReference):
        reference, missing = reference.reference_for(result.config)
        if missing:
            problems.append(missing)
    if reference is not None:
        problems += reference.problems(result)
    return problems


def _timing_problems(result: TrialResult, contract: ContractSpec) -> list[str]:
    """The workload's own step times must agree with the harness clock over the window."""
    reported = result.extra.get("reported_step_times_s") or []
    window = reported[contract.warmup_steps:contract.num_steps]
    if not window or not result.step_times_s:
        return []
    harness_s, workload_s = sum(result.step_times_s), sum(window)
    # The harness stamps each line when it arrives: allow a reader's wake-up at either end
    # of the window, and per step the time an honest job's timer leaves out (writing its
    # line, the loop around it, a scheduler slice when the machine is busy).
    slack_s = (contract.timing_tolerance * harness_s + 2 * STAMP_LATENCY_S
               + len(result.step_times_s) * UNTIMED_GAP_S)
    if abs(harness_s - workload_s) > slack_s:
        return [f"workload-reported step time {workload_s:.3f} s disagrees with the harness clock "
                f"{harness_s:.3f} s over the measured window"]
    return []


def enforce(result: TrialResult, contract: ContractSpec,
            reference: "LossReference | LossContract | None") -> TrialResult:
    if result.outcome is not Outcome.OK:
        return result
    problems = contract_problems(result, contract, reference)
    if not problems:
        return result
    return result.replace(outcome=Outcome.CONTRACT_VIOLATION, reason="; ".join(problems))
