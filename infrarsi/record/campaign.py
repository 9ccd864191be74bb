"""The campaign folder's records, read and written typed: every reader (the report, the bank,
the command line, the flow, apply) gets the objects the stages wrote, and what stands
promoted is decided here once.

``CampaignDir`` (``infrarsi.core.workspace``) says where each file lives; a reader asks
here for what it says. A record a stage has not written yet reads as None.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

from infrarsi.contract.freeze import Contract
from infrarsi.core.serial import Record
from infrarsi.core.workspace import CampaignDir
from infrarsi.record.doctor import DoctorReport
from infrarsi.record.minimize import MinimizeReport
from infrarsi.record.verification import Verdict, VerificationPlan, VerificationReport

R = TypeVar("R", bound=Record)


def _read(cdir: CampaignDir, path: Path, cls: type[R]) -> R | None:
    return cls.from_json(cdir.read_json(path)) if path.exists() else None


def write(cdir: CampaignDir, path: Path, record: Record) -> None:
    """``record`` to ``path`` in ``cdir`` (atomically: ``CampaignDir.write_json``)."""
    cdir.write_json(path, record.to_json())


def read_contract(cdir: CampaignDir) -> Contract:
    """The locked contract init wrote: every campaign folder has one."""
    return Contract.from_json(cdir.read_json(cdir.contract))


def read_doctor(cdir: CampaignDir) -> DoctorReport | None:
    return _read(cdir, cdir.doctor, DoctorReport)


def read_plan(cdir: CampaignDir) -> VerificationPlan | None:
    return _read(cdir, cdir.plan, VerificationPlan)


def read_verification(cdir: CampaignDir) -> VerificationReport | None:
    return _read(cdir, cdir.verification, VerificationReport)


def read_minimize(cdir: CampaignDir) -> MinimizeReport | None:
    return _read(cdir, cdir.minimize, MinimizeReport)


def read_summary(cdir: CampaignDir) -> dict[str, Any]:
    """The campaign's summary as the report stage last wrote it
    (``infrarsi.stages.report.report.build_report``: the report builds it once)."""
    return cdir.read_json(cdir.summary)


def final_verification(cdir: CampaignDir) -> VerificationReport | None:
    """What stands promoted: minimization's final report where it ran, else verification's."""
    minimize = read_minimize(cdir)
    return minimize.final if minimize else read_verification(cdir)


def promoted(cdir: CampaignDir) -> Verdict | None:
    """The promoted verdict of the campaign in ``cdir`` (None: nothing is promoted)."""
    final = final_verification(cdir)
    return final.promoted if final else None
