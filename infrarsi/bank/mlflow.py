"""The experience bank in an MLflow tracking store a team shares (``BankStore``): the
records of ``infrarsi.bank.records`` kept as runs by ``infrarsi.adapters.mlflow_bank``."""

from __future__ import annotations

from typing import Any

from infrarsi.adapters.mlflow_bank import MlflowBankRuns
from infrarsi.bank.records import CampaignRecord, record_from_json, record_to_json

__all__ = ["MlflowBank"]


class MlflowBank:
    """The bank as runs of the ``infrarsi-bank`` experiment at ``tracking_uri``."""

    def __init__(self, tracking_uri: str) -> None:
        self._runs = MlflowBankRuns(tracking_uri)

    @property
    def location(self) -> str:
        return self._runs.location

    def add(self, rec: CampaignRecord) -> None:
        """Store (or replace) one campaign."""
        self._runs.add(record_to_json(rec))

    def forget(self, campaign_id: str) -> bool:
        return self._runs.forget(campaign_id)

    def list(self) -> list[dict[str, Any]]:
        """One summary row per campaign, newest first."""
        return self._runs.list()

    def get(self, campaign_id: str) -> CampaignRecord | None:
        data = self._runs.get(campaign_id)
        return record_from_json(data) if data is not None else None

    def records(self) -> list[CampaignRecord]:
        return [r for r in (self.get(row["id"]) for row in self.list()) if r is not None]
