"""Model FLOPs utilisation: the model FLOP/s a trial achieved over what its devices can do.

MFU = flops_per_token x tokens_per_step / step_time_s / (num_devices x peak FLOP/s per
device). The model FLOPs per token come from the job (its start event's
``flops_per_token``) or, for a job that reports none, from ``resources.flops_per_token``;
the peak from ``infrarsi.stages.report.accelerators`` by the device name the job (``device_name`` in its
start event), the spec (``resources.accelerator``) or the machine (nvidia-smi at init)
reports, or from ``resources.peak_flops_per_device``. The devices are the ones a trial is
given (``gpus_per_trial`` x ``nodes_per_trial``), the same for every config, so the ratio
of two MFUs is their speedup. Trials on CPU have no MFU: it is omitted, never invented.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass
from typing import Any, Mapping

from infrarsi.record.doctor import DoctorReport
from infrarsi.record.verification import Verdict
from infrarsi.stages.report.accelerators import lookup

__all__ = ["MfuBasis", "campaign_mfu", "mfu", "mfu_basis"]


@dataclass(frozen=True, kw_only=True)
class MfuBasis:
    """What a campaign's MFU figures are computed against."""

    accelerator: str  # the table's name, or the reported one when the peak came from the spec
    device_name: str  # as reported
    peak_flops_per_device: float
    num_devices: int
    peak_source: str  # "table" or "spec"


def mfu(*, flops_per_token: float, tokens_per_step: int, step_time_s: float, num_devices: int,
        peak_flops_per_device: float) -> float:
    """The fraction of the devices' peak that one step's model FLOPs used."""
    return flops_per_token * tokens_per_step / step_time_s / (num_devices * peak_flops_per_device)


def _device_name(resources: Mapping[str, Any], hardware: Mapping[str, Any], start: Mapping[str, Any]) -> str | None:
    if start.get("device_name"):
        return str(start["device_name"])
    if resources.get("accelerator"):
        return str(resources["accelerator"])
    gpus = hardware.get("gpus") or []
    # nvidia-smi's "name, memory.total" line, as the hardware fingerprint keeps it.
    return str(gpus[0]).split(",")[0].strip() if gpus else None


def mfu_basis(resources: Mapping[str, Any], hardware: Mapping[str, Any], start: Mapping[str, Any]) -> MfuBasis | None:
    """The peak and device count a trial's MFU is taken against; None on CPU or for a
    device the table does not know (set ``resources.peak_flops_per_device`` for one)."""
    num_devices = int(resources.get("gpus_per_trial") or 0) * int(resources.get("nodes_per_trial") or 1)
    if num_devices == 0:
        return None
    name = _device_name(resources, hardware, start)
    if resources.get("peak_flops_per_device"):
        peak = float(resources["peak_flops_per_device"])
        return MfuBasis(accelerator=name or "unnamed", device_name=name or "", peak_flops_per_device=peak,
                        num_devices=num_devices, peak_source="spec")
    entry = lookup(name) if name else None
    if entry is None:
        return None
    return MfuBasis(accelerator=entry.name, device_name=name, peak_flops_per_device=entry.peak_bf16_flops,
                    num_devices=num_devices, peak_source="table")


def _flops_per_token(resources: Mapping[str, Any], start: Mapping[str, Any]) -> float | None:
    value = start.get("flops_per_token") or resources.get("flops_per_token")
    return float(value) if value else None


def campaign_mfu(*, spec: Mapping[str, Any], hardware: Mapping[str, Any], starts: Mapping[str, Mapping[str, Any]],
                 doctor: DoctorReport | None, promoted: Verdict | None) -> dict[str, Any]:
    """Baseline and promoted MFU for the summary: ``starts`` maps trial ids to their start
    events, ``doctor`` and ``promoted`` are doctor's report and the promoted verdict. Every
    field is None where it cannot be measured (CPU, unknown device, no FLOPs)."""
    out: dict[str, Any] = {"baseline_mfu": None, "promoted_mfu": None, "mfu_basis": None}
    resources = spec.get("resources") or {}
    tokens = spec.get("contract", {}).get("global_batch_tokens")
    if doctor is None or not tokens:
        return out
    baseline_start = next((starts[t] for t in doctor.trial_ids if t in starts), {})
    basis = mfu_basis(resources, hardware, baseline_start)
    if basis is None:
        return out
    out["mfu_basis"] = asdict(basis)

    def of(start: Mapping[str, Any], step_time_s: float) -> float | None:
        flops = _flops_per_token(resources, start)
        if flops is None or not step_time_s:
            return None
        return mfu(flops_per_token=flops, tokens_per_step=tokens, step_time_s=step_time_s,
                   num_devices=basis.num_devices, peak_flops_per_device=basis.peak_flops_per_device)

    out["baseline_mfu"] = of(baseline_start, doctor.step_time_s)
    if promoted and promoted.candidate_times_s:
        candidate_ids = [c for _, c in promoted.pairs]
        start = next((starts[t] for t in candidate_ids if t in starts), starts.get(promoted.source_trial_id, {}))
        out["promoted_mfu"] = of(start, statistics.median(promoted.candidate_times_s))
    return out
