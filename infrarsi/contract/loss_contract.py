"""The loss contract doctor calibrates: one reference run and tolerance per numerics class.

A config is compared with the reference run in its own numerics class
(``infrarsi.contract.numerics``): a config that keeps the baseline's numerics with the baseline at
the near-exact tolerance of repeated baseline runs and honest splits; a config in another
class (e.g. ``precision=bf16``) with a baseline run in that class, at the tolerance its
own honest split showed. The signal compared (per-step loss, a moving mean, or the job's
eval loss) is the spec's ``contract.loss_signal``. Where the job prints its losses rounded,
the contract knows the unit of the last digit printed (``loss_quantum``) and compares no
finer (``infrarsi.contract.loss_reference``).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Mapping

from infrarsi.contract.loss_reference import LossReference
from infrarsi.contract.numerics import NumericsClass, class_config, class_of, describe
from infrarsi.core.knobs import Config, Value
from infrarsi.core.serial import Record


@dataclass(frozen=True, kw_only=True)
class ClassReference(Record):
    """The reference run of one numerics class and the tolerance its configs are held to."""

    settings: NumericsClass  # () for the baseline's own numerics
    losses: tuple[float, ...]
    eval_losses: tuple[float, ...] = ()
    tolerance: float
    trial_ids: tuple[str, ...] = ()  # the reference run, then the runs that calibrated it
    honest_score: float | None = None  # the largest score of an honest run against the reference
    failure: str = ""  # why the class has no reference (its run failed)


@dataclass(frozen=True, kw_only=True)
class LossContract(Record):
    signal: str  # "step", "window" or "eval"
    window: int
    baseline: Config
    changing_knobs: tuple[str, ...]  # knobs whose settings change the numerics
    classes: tuple[ClassReference, ...]  # the baseline's own numerics first
    warnings: tuple[str, ...] = ()
    # The honest splits doctor ran in the baseline's numerics (calibration variants that
    # keep them): at a canary seed they measure that seed's own honest spread.
    splits: tuple[Mapping[str, Value], ...] = ()
    # One unit of the last digit the job printed its losses (eval losses) with; 0: full precision.
    loss_quantum: float = 0.0
    eval_loss_quantum: float = 0.0

    @property
    def quantum(self) -> float:
        """The printed unit of the values the signal compares."""
        return self.eval_loss_quantum if self.signal == "eval" else self.loss_quantum

    def resolution(self) -> str:
        """What the printed precision hides, in one sentence ("" at full precision)."""
        values = self.classes[0].eval_losses if self.signal == "eval" else self.classes[0].losses
        if not self.quantum or not values:
            return ""
        typical = statistics.median(abs(v) for v in values)
        digits = math.floor(math.log10(typical)) - round(math.log10(self.quantum)) + 1 if typical > 0 else 1
        what = "eval loss" if self.signal == "eval" else "loss"
        return (f"the job prints its {what} to {digits} significant digits: a change smaller than "
                f"{self.quantum / typical:.2g} of the {what} ({self.quantum / typical:.3%}) a step cannot be seen by "
                "the contract")

    @property
    def tolerance(self) -> float:
        """The near-exact tolerance of configs that keep the baseline's numerics."""
        return self.classes[0].tolerance

    def class_of(self, config: Mapping[str, Value]) -> NumericsClass:
        return class_of(config, self.baseline, self.changing_knobs)

    def reference_of(self, cls: NumericsClass) -> ClassReference | None:
        return next((c for c in self.classes if c.settings == cls), None)

    def reference(self, cls: NumericsClass, losses: tuple[float, ...], eval_losses: tuple[float, ...],
                  name: str) -> LossReference:
        """``losses`` as the reference of class ``cls`` at that class's tolerance (the
        canary: a run of the class's reference config at another seed)."""
        ref = self.reference_of(cls)
        assert ref is not None, f"no class {cls} in the loss contract"
        return LossReference(losses=tuple(losses), eval_losses=tuple(eval_losses), tolerance=ref.tolerance,
                             name=name, signal=self.signal, window=self.window, quantum=self.quantum)

    def reference_config(self, cls: NumericsClass) -> Config:
        return class_config(self.baseline, cls)

    def reference_for(self, config: Mapping[str, Value]) -> tuple[LossReference | None, str]:
        """The reference a run of ``config`` is compared with, or why there is none."""
        cls = self.class_of(config)
        ref = self.reference_of(cls)
        if ref is None:
            return None, (f"no reference run in its numerics ({describe(cls)}): doctor measured "
                          f"{[describe(c.settings) for c in self.classes]}; rerun doctor")
        if ref.failure:
            return None, f"the reference run in its numerics ({describe(cls)}) failed in doctor: {ref.failure}"
        name = "the baseline" if not cls else f"the {describe(cls)} reference"
        return self.reference(cls, ref.losses, ref.eval_losses, name), ""
