"""What a campaign folder says was decided, read once for every reader."""

from __future__ import annotations

from typing import Any

from infrarsi.core.workspace import CampaignDir


def _read(cdir: CampaignDir, path) -> Any:
    return cdir.read_json(path) if path.exists() else None


def final_verification(cdir: CampaignDir) -> dict | None:
    """What stands promoted: minimization's final report where it ran, else verification's."""
    minimize = _read(cdir, cdir.minimize)
    return minimize["final"] if minimize else _read(cdir, cdir.verification)


def promoted_verdict(verification: dict | None) -> dict | None:
    winners = [v for v in (verification or {}).get("verdicts", []) if v["promoted"]]
    return max(winners, key=lambda v: v["speedup"]) if winners else None
