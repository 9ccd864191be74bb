"""What doctor measured of the baseline (``infrarsi.stages.doctor`` measures it): doctor.json."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from infrarsi.contract.loss_contract import LossContract
from infrarsi.contract.loss_reference import LossReference
from infrarsi.contract.noise import NoiseEstimate
from infrarsi.core.knobs import Config
from infrarsi.core.serial import Record

# Changes when a field of the report changes its type (2: loss_contract a LossContract and
# noise a NoiseEstimate, no longer dicts): a report Prefect cached for reuse was pickled in the old shape, and the
# doctor cache key carries this so such a report is measured again instead of reused.
FORMAT = 2


@dataclass(frozen=True, kw_only=True)
class DoctorReport(Record):
    baseline: Config
    trial_ids: tuple[str, ...]
    step_time_s: float  # median over runs of each run's median step time
    run_step_times_s: tuple[float, ...]
    noise_cv: float  # the noise of one run's median step time (infrarsi.contract.noise): a diagnostic and a prior
    within_run_cv: float
    reference_losses: tuple[float, ...]
    loss_tolerance: float
    loss_tolerance_source: str
    calibration: tuple[Mapping[str, Any], ...]
    peak_memory_bytes: int
    phases_s: Mapping[str, float]
    tokens_per_step: int | None
    extra: Mapping[str, Any] = field(default_factory=dict)
    noise: NoiseEstimate | None = None  # how noise_cv was found (None: a report made before it was kept)
    startup_s: float = 0.0  # median start-up of the baseline runs
    loss_contract: LossContract | None = None  # None: a report made before doctor calibrated one

    @property
    def loss_reference(self) -> LossReference | LossContract:
        """What trials are checked against: the class-aware loss contract doctor calibrated
        (a report made without one: the baseline's losses at ``loss_tolerance``)."""
        if self.loss_contract:
            return self.loss_contract
        return LossReference(losses=self.reference_losses, tolerance=self.loss_tolerance)

    @classmethod
    def upgrade(cls, data: Mapping[str, Any]) -> Mapping[str, Any]:
        """A report made without a loss contract or a noise estimate wrote an empty one."""
        return {**data, "loss_contract": data.get("loss_contract") or None, "noise": data.get("noise") or None}
