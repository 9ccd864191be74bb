"""The experience bank's records in an MLflow tracking store a team shares, as JSON
(``infrarsi.bank.mlflow.MlflowBank`` turns them into ``CampaignRecord`` s).

Selected by ``--bank mlflow+<tracking URI>`` (``mlflow+http://host:5000``,
``mlflow+sqlite:///path/mlflow.db``). Each campaign is one run in the experiment
``infrarsi-bank``: tags hold its id, name, backend, the hardware and workload features (as
JSON, and one ``infrarsi.bank.hw.*`` / ``infrarsi.bank.wl.*`` tag per feature, so
``search_runs`` can filter on them), metrics the baseline and best step times and the trial
count, and the artifact ``bank_record.json`` the full record (``bank.records.record_to_json``:
the fields the SQLite store keeps). ``list`` reads tags and metrics only; ``get`` downloads one
record. Recording a campaign again deletes its earlier run; ``forget`` deletes the run
(MLflow's delete marks it deleted, ``mlflow gc`` purges it from the store).

With ``tracking`` and ``mlflow_runs``, the only modules in infrarsi that talk to MLflow.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from mlflow import MlflowClient
from mlflow.entities import ViewType
from mlflow.exceptions import MlflowException

from infrarsi.adapters.mlflow_connect import STORE_ERRORS, bound_http_retries, describe, probe
from infrarsi.adapters.mlflow_runs import default_artifact_location, quote
from infrarsi.core.errors import BankUnavailableError, InfrarsiError

__all__ = ["EXPERIMENT", "MlflowBankRuns"]

EXPERIMENT = "infrarsi-bank"
ARTIFACT = "bank_record.json"
TAG_CAMPAIGN_ID = "infrarsi.bank.campaign_id"
_MAX_RUNS = 50_000


class MlflowBankRuns:
    """Campaign records (JSON: ``bank.records.record_to_json``) as runs of the
    ``infrarsi-bank`` experiment at ``tracking_uri``."""

    def __init__(self, tracking_uri: str) -> None:
        if not tracking_uri:
            raise InfrarsiError("--bank mlflow+ needs a tracking URI after it, e.g. mlflow+http://host:5000")
        self.tracking_uri = tracking_uri
        bound_http_retries()
        problem = probe(tracking_uri)
        if problem is not None:
            raise BankUnavailableError(f"experience bank {self.location}: no MLflow server answers ({problem}); "
                                       "start it, or pass another bank (--bank for a campaign, --path for "
                                       "infrarsi bank): a SQLite file, or 'off'")
        self._client = MlflowClient(tracking_uri=tracking_uri)
        self._experiment_id = self._call(self._experiment)

    @property
    def location(self) -> str:
        return f"mlflow+{self.tracking_uri}"

    def _call(self, fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except STORE_ERRORS as exc:
            raise BankUnavailableError(f"experience bank {self.location}: {describe(exc)}; check that the MLflow "
                                       "store answers, or pass another bank (--bank for a campaign, --path for "
                                       "infrarsi bank; or 'off')") from None

    def _experiment(self) -> str:
        experiment = self._client.get_experiment_by_name(EXPERIMENT)
        if experiment is None:
            try:
                return self._client.create_experiment(
                    EXPERIMENT, artifact_location=default_artifact_location(self.tracking_uri))
            except MlflowException:  # another process created it first
                experiment = self._client.get_experiment_by_name(EXPERIMENT)
                if experiment is None:
                    raise
        if experiment.lifecycle_stage != "active":
            raise InfrarsiError(f"MLflow experiment {EXPERIMENT!r} at {self.tracking_uri} is deleted; restore it "
                                "(mlflow experiments restore) or use another store")
        return experiment.experiment_id

    def _runs(self, campaign_id: str | None = None) -> list[Any]:
        flt = f"tags.`{TAG_CAMPAIGN_ID}` = {quote(campaign_id)}" if campaign_id is not None else ""
        return self._call(lambda: self._client.search_runs(
            [self._experiment_id], filter_string=flt, run_view_type=ViewType.ACTIVE_ONLY,
            order_by=["attributes.start_time DESC"], max_results=_MAX_RUNS))

    def add(self, data: dict[str, Any]) -> None:
        """Store (or replace) one campaign's record: a new run, then the earlier runs deleted."""
        campaign_id = data["id"]
        earlier = self._runs(campaign_id)
        tags = {TAG_CAMPAIGN_ID: campaign_id, "infrarsi.bank.name": data["name"],
                "infrarsi.bank.backend": data["backend"], "infrarsi.bank.proposer": data["proposer"],
                "infrarsi.bank.hardware": json.dumps(data["hardware"]),
                "infrarsi.bank.workload": json.dumps(data["workload"])}
        tags.update({f"infrarsi.bank.hw.{k}": json.dumps(v) for k, v in data["hardware"].items()})
        tags.update({f"infrarsi.bank.wl.{k}": json.dumps(v) for k, v in data["workload"].items()})
        metrics = {"baseline_step_time_s": data["baseline_step_time_s"], "best_step_time_s": data["best_step_time_s"],
                   "num_trials": len(data["trials"])}

        def write() -> None:
            run = self._client.create_run(self._experiment_id, run_name=campaign_id, tags=tags)
            run_id = run.info.run_id
            for k, v in metrics.items():
                if v is not None:
                    self._client.log_metric(run_id, k, float(v))
            self._client.log_dict(run_id, data, ARTIFACT)
            self._client.set_terminated(run_id, "FINISHED")
            for old in earlier:
                self._client.delete_run(old.info.run_id)

        self._call(write)

    def forget(self, campaign_id: str) -> bool:
        runs = self._runs(campaign_id)
        for run in runs:
            self._call(self._client.delete_run, run.info.run_id)
        return bool(runs)

    def list(self) -> list[dict[str, Any]]:
        """One summary row per campaign, newest first (from tags and metrics)."""
        rows, seen = [], set()
        for run in self._runs():
            tags, metrics = run.data.tags, run.data.metrics
            cid = tags.get(TAG_CAMPAIGN_ID)
            if cid is None or cid in seen:
                continue
            seen.add(cid)
            num_trials = metrics.get("num_trials")
            rows.append({"id": cid, "recorded_at": run.info.start_time / 1000, "name": tags.get("infrarsi.bank.name"),
                         "backend": tags.get("infrarsi.bank.backend"),
                         "hardware": json.loads(tags.get("infrarsi.bank.hardware", "{}")),
                         "workload": json.loads(tags.get("infrarsi.bank.workload", "{}")),
                         "baseline_step_time_s": metrics.get("baseline_step_time_s"),
                         "best_step_time_s": metrics.get("best_step_time_s"),
                         "num_trials": int(num_trials) if num_trials is not None else 0})
        return rows

    def get(self, campaign_id: str) -> dict[str, Any] | None:
        """The campaign's record as stored, or None."""
        runs = self._runs(campaign_id)
        if not runs:
            return None
        with tempfile.TemporaryDirectory(prefix="infrarsi-bank-") as tmp:
            path = self._call(self._client.download_artifacts, runs[0].info.run_id, ARTIFACT, tmp)
            return json.loads(Path(path).read_text())
