"""MLflow tracking: a campaign is a parent run, every trial attempt (OOMs included) a child.

With ``adapters.mlflow_runs`` (what a run holds, and reading runs back) and
``adapters.mlflow_bank`` (the experience bank's MLflow store), the only modules in infrarsi that
talk to MLflow. It uses ``MlflowClient`` with explicit run ids (no global active run), so
one ``Tracker`` may be shared by threads.

MLflow is for people; the ledger is the record. So an unreachable store never stops a
campaign: a call that fails with a store, network or database error is appended to a
JSON-lines spool and replayed, in order and idempotently, by ``catch_up`` once the store
answers again. While the spool is non-empty every new call queues behind it, and the store
is retried at most once per ``retry_interval_s``, after a quick probe of an HTTP server
(``adapters.mlflow_connect``, which also bounds MLflow's own retries): a dead server costs
one short probe when the tracker is made and one per interval, not minutes per call.
Going offline is reported once per outage through ``on_warning`` (console and report).
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from mlflow import MlflowClient
from mlflow.entities import Metric, Param, RunStatus, RunTag, ViewType
from mlflow.exceptions import MlflowException
from mlflow.utils.validation import (
    MAX_METRICS_PER_BATCH,
    MAX_PARAM_VAL_LENGTH,
    MAX_PARAMS_TAGS_PER_BATCH,
    MAX_TAG_VAL_LENGTH,
)

from infrarsi.adapters.mlflow_connect import STORE_ERRORS as _STORE_ERRORS
from infrarsi.adapters.mlflow_connect import bound_http_retries, describe, probe
from infrarsi.adapters.mlflow_runs import (
    EXPERIMENT_TAGS,
    TAG_ATTEMPT,
    TAG_CAMPAIGN_ID,
    TAG_KIND,
    TAG_PARENT,
    TAG_TRIAL_ID,
    clip,
    default_artifact_location,
    mark_training_experiment,
    now_ms,
    quote,
    trial_metrics,
    trial_params,
    trial_tags,
)
from infrarsi.adapters.mlflow_spool import Spool
from infrarsi.core.errors import InfrarsiError
from infrarsi.core.trial import TrialResult

__all__ = ["Tracker"]

log = logging.getLogger(__name__)

_END_STATUSES = ("FINISHED", "FAILED", "KILLED")


class Tracker:
    """Logs one experiment's campaigns and trials to MLflow, spooling while it is down.

    ``start_campaign`` creates (or, on resume, finds) the parent run; ``log_params`` adds
    params decided later (the search's trial count); ``log_trial`` adds a child run per
    trial attempt; ``end_campaign`` closes the parent. Every call is idempotent on replay.
    ``artifact_location`` defaults to ``mlartifacts/`` next to a SQLite database (MLflow's
    own default is the current directory).
    """

    def __init__(
        self,
        tracking_uri: str,
        experiment_name: str,
        spool_path: Path,
        *,
        artifact_location: str | None = None,
        retry_interval_s: float = 30.0,
        on_warning: Callable[[str], None] | None = None,
    ) -> None:
        bound_http_retries()
        self.tracking_uri = tracking_uri
        self.experiment_name = experiment_name
        self.spool_path = Path(spool_path)
        self._spool = Spool(self.spool_path)
        self.on_warning = on_warning
        self.artifact_location = artifact_location or default_artifact_location(tracking_uri)
        self.retry_interval_s = retry_interval_s
        self._lock = threading.RLock()
        self._client: MlflowClient | None = None
        self._experiment_id: str | None = None
        self._parent_ids: dict[str, str] = {}
        self._campaign_id: str | None = None
        self._offline = False  # the store failed; calls queue until it is retried and answers
        self._retry_after = 0.0  # time.monotonic() before which the store is not retried
        self._warned = False
        # Create the experiment now, from one process, before trials fan out: SQLite
        # migrations race when several processes create a fresh store at once.
        with self._lock:
            problem = probe(tracking_uri)
            try:
                if problem is None:
                    self._experiment()
                else:
                    self._offline_because(problem)
            except _STORE_ERRORS as exc:
                self._went_offline(exc)

    # ----------------------------------------------------------------- public calls
    def start_campaign(
        self, campaign_id: str, params: Mapping[str, Any], tags: Mapping[str, str]
    ) -> str | None:
        """Return the campaign's parent run id, creating the run unless it exists.

        Returns None when the store is unreachable (the call is spooled; the parent run
        is created on catch-up and later calls find it by its campaign id tag).
        """
        self._campaign_id = campaign_id
        return self._submit({
            "op": "start_campaign", "time_ms": now_ms(), "campaign_id": campaign_id,
            "params": {k: str(v) for k, v in params.items()},
            "tags": {k: str(v) for k, v in tags.items()},
        })

    def log_params(self, params: Mapping[str, Any], campaign_id: str | None = None) -> None:
        """Log params on the campaign's parent run; a key already logged keeps its value."""
        self._submit({"op": "log_params", "time_ms": now_ms(),
                      "campaign_id": campaign_id or self._campaign_id,
                      "params": {k: str(v) for k, v in params.items()}})

    def log_trial(
        self, result: TrialResult, log_file: Path | None, campaign_id: str
    ) -> None:
        """Log one trial attempt as a child run; a no-op if it is already there."""
        self._submit({
            "op": "log_trial", "time_ms": now_ms(), "campaign_id": campaign_id,
            "result": result.to_json(),
            "log_file": str(log_file) if log_file is not None else None,
        })

    def end_campaign(
        self,
        summary_metrics: Mapping[str, float],
        artifacts: Sequence[Path],
        status: str = "FINISHED",
        *,
        campaign_id: str | None = None,
        tags: Mapping[str, str] | None = None,
    ) -> None:
        """Log the summary, ``tags`` and the report files on the parent run and close it.

        ``campaign_id`` defaults to the one last passed to ``start_campaign``.
        """
        if status not in _END_STATUSES:
            raise ValueError(f"status {status!r}: expected one of {_END_STATUSES}")
        campaign_id = campaign_id or self._campaign_id
        if campaign_id is None:
            raise ValueError("end_campaign needs a campaign_id: call start_campaign first")
        self._submit({
            "op": "end_campaign", "time_ms": now_ms(), "campaign_id": campaign_id,
            "summary_metrics": {k: float(v) for k, v in summary_metrics.items()},
            "artifacts": [str(p) for p in artifacts], "status": status,
            "tags": {k: str(v) for k, v in (tags or {}).items()},
        })

    def catch_up(self) -> int:
        """Replay the spool in order; return the number of calls replayed.

        Stops at the first call the store refuses and keeps it and the rest for later.
        """
        with self._lock:
            records = self._spool.read()
            for done, record in enumerate(records):
                try:
                    self._apply(record)
                except _STORE_ERRORS as exc:
                    self._spool.write(records[done:])
                    self._went_offline(exc)
                    return done
            if records:
                self._spool.write([])
                log.info("MLflow at %s is back: replayed %d spooled calls",
                         self.tracking_uri, len(records))
                self._back_online()
            return len(records)

    @property
    def num_spooled(self) -> int:
        return len(self._spool.read())

    # ----------------------------------------------------------------- spooling
    def _submit(self, record: dict[str, Any]) -> Any:
        with self._lock:
            if self._offline and not self._may_retry():
                self._spool.append(record)
                return None
            if self._spool.nonempty():
                self.catch_up()
            if self._spool.nonempty():  # keep the order: queue behind what is spooled
                self._spool.append(record)
                return None
            try:
                result = self._apply(record)
            except _STORE_ERRORS as exc:
                self._went_offline(exc)
                self._spool.append(record)
                return None
            self._back_online()
            return result

    def _may_retry(self) -> bool:
        """Whether a store that failed may be asked again: ``retry_interval_s`` has passed
        and (an HTTP server) it answers a quick probe; else wait another interval."""
        if time.monotonic() < self._retry_after:
            return False
        if probe(self.tracking_uri) is not None:
            self._retry_after = time.monotonic() + self.retry_interval_s
            return False
        return True

    def _back_online(self) -> None:
        self._offline, self._warned, self._retry_after = False, False, 0.0

    def _went_offline(self, exc: BaseException) -> None:
        self._offline_because(describe(exc))

    def _offline_because(self, reason: str) -> None:
        self._offline = True
        self._retry_after = time.monotonic() + self.retry_interval_s
        if not self._warned:
            self._warned = True
            message = (f"MLflow at {self.tracking_uri} is unreachable ({reason}); "
                       f"the campaign goes on and its tracking calls are spooled to {self.spool_path}, "
                       "replayed when the store answers (the ledger is the record)")
            log.warning("%s", message)
            if self.on_warning is not None:
                self.on_warning(message)

    # ----------------------------------------------------------------- MLflow calls
    def _apply(self, record: Mapping[str, Any]) -> Any:
        op = record["op"]
        if op == "start_campaign":
            return self._apply_start(record)
        if op == "log_params":
            run_id = self._require_parent(record["campaign_id"])
            return self._log_batch(run_id, params=self._new_params(run_id, record["params"]))
        if op == "log_trial":
            return self._apply_trial(record)
        if op == "end_campaign":
            return self._apply_end(record)
        raise AssertionError(f"unknown spooled op {op!r}")

    def _connect(self) -> MlflowClient:
        if self._client is None:
            self._client = MlflowClient(tracking_uri=self.tracking_uri)
        return self._client

    def _experiment(self) -> str:
        if self._experiment_id is not None:
            return self._experiment_id
        client = self._connect()
        experiment = client.get_experiment_by_name(self.experiment_name)
        if experiment is None:
            try:
                self._experiment_id = client.create_experiment(
                    self.experiment_name, artifact_location=self.artifact_location, tags=EXPERIMENT_TAGS)
                return self._experiment_id
            except MlflowException:  # another process created it first
                experiment = client.get_experiment_by_name(self.experiment_name)
                if experiment is None:
                    raise
        if experiment.lifecycle_stage != "active":
            raise InfrarsiError(
                f"MLflow experiment {self.experiment_name!r} at {self.tracking_uri} is "
                "deleted; restore it (mlflow experiments restore) or choose another name")
        mark_training_experiment(client, experiment)
        self._experiment_id = experiment.experiment_id
        return self._experiment_id

    def _parent_run_id(self, campaign_id: str) -> str | None:
        if campaign_id in self._parent_ids:
            return self._parent_ids[campaign_id]
        runs = self._connect().search_runs(
            [self._experiment()],
            filter_string=(f"tags.`{TAG_KIND}` = 'campaign' and "
                           f"tags.`{TAG_CAMPAIGN_ID}` = {quote(campaign_id)}"),
            order_by=["attributes.start_time ASC"], max_results=1,
        )
        if runs:
            self._parent_ids[campaign_id] = runs[0].info.run_id
            return runs[0].info.run_id
        return None

    def _apply_start(self, record: Mapping[str, Any]) -> str:
        client, campaign_id = self._connect(), record["campaign_id"]
        run_id = self._parent_run_id(campaign_id)
        params = dict(record["params"])
        if run_id is None:
            run = client.create_run(
                self._experiment(), start_time=record["time_ms"], run_name=campaign_id,
                tags={TAG_KIND: "campaign", TAG_CAMPAIGN_ID: campaign_id},
            )
            run_id = self._parent_ids[campaign_id] = run.info.run_id
        else:  # a resumed campaign
            params = self._new_params(run_id, params)
            client.update_run(run_id, status="RUNNING")
        self._log_batch(run_id, params=params, tags=record["tags"])
        return run_id

    def _new_params(self, run_id: str, params: Mapping[str, str]) -> dict[str, str]:
        """The params the run does not hold yet: MLflow params are immutable, so a key
        logged before keeps its first value (a warning says so where they differ)."""
        logged = self._connect().get_run(run_id).data.params
        changed = sorted(k for k in params if k in logged and logged[k] != clip(params[k], MAX_PARAM_VAL_LENGTH))
        if changed:
            log.warning("MLflow run %s already holds params %s with other values; MLflow keeps the first",
                        run_id, changed)
        return {k: v for k, v in params.items() if k not in logged}

    def _require_parent(self, campaign_id: str) -> str:
        run_id = self._parent_run_id(campaign_id)
        if run_id is None:
            raise InfrarsiError(f"no MLflow run for campaign {campaign_id!r}: call start_campaign first")
        return run_id

    def _apply_trial(self, record: Mapping[str, Any]) -> None:
        client, campaign_id = self._connect(), record["campaign_id"]
        result = TrialResult.from_json(record["result"])
        parent_id = self._require_parent(campaign_id)
        for run in client.search_runs(
            [self._experiment()],
            filter_string=(f"tags.`{TAG_PARENT}` = '{parent_id}' and "
                           f"tags.`{TAG_TRIAL_ID}` = {quote(result.trial_id)} and "
                           f"tags.`{TAG_ATTEMPT}` = '{result.attempt}'"),
            run_view_type=ViewType.ACTIVE_ONLY,
        ):
            if run.info.status != "RUNNING":
                return  # already logged in full
            # A half-logged run (the store failed mid-call): replace it with a whole one.
            client.delete_run(run.info.run_id)

        end_ms = record["time_ms"]
        run = client.create_run(
            self._experiment(), start_time=end_ms - int(result.wall_time_s * 1000),
            run_name=result.trial_id, tags=trial_tags(result, campaign_id, parent_id),
        )
        run_id = run.info.run_id
        self._log_batch(run_id, params=trial_params(result),
                        metrics=trial_metrics(result, end_ms))
        client.log_dict(run_id, record["result"], "trial.json")
        log_file = record.get("log_file")
        if log_file is not None:
            if Path(log_file).is_file():
                client.log_artifact(run_id, log_file)
            else:
                log.warning("trial %s: log file %s is gone; logged without it",
                            result.trial_id, log_file)
        status = RunStatus.to_string(RunStatus.FAILED if result.outcome.failed
                                     else RunStatus.FINISHED)
        client.set_terminated(run_id, status=status, end_time=end_ms)

    def _apply_end(self, record: Mapping[str, Any]) -> None:
        client, campaign_id = self._connect(), record["campaign_id"]
        run_id = self._require_parent(campaign_id)
        metrics = [Metric(k, v, record["time_ms"], 0)
                   for k, v in record["summary_metrics"].items()]
        self._log_batch(run_id, metrics=metrics, tags=record.get("tags") or {})
        for artifact in map(Path, record["artifacts"]):
            if artifact.is_dir():
                client.log_artifacts(run_id, str(artifact), artifact.name)
            elif artifact.is_file():
                client.log_artifact(run_id, str(artifact))
            else:
                log.warning("campaign %s: artifact %s is gone; not logged", campaign_id, artifact)
        client.set_terminated(run_id, status=record["status"], end_time=record["time_ms"])

    def _log_batch(
        self,
        run_id: str,
        *,
        params: Mapping[str, str] | None = None,
        tags: Mapping[str, str] | None = None,
        metrics: Sequence[Metric] = (),
    ) -> None:
        # MLflow caps one batch at 100 params + tags and 1000 metrics.
        param_list = [Param(k, clip(v, MAX_PARAM_VAL_LENGTH)) for k, v in (params or {}).items()]
        tag_list = [RunTag(k, clip(v, MAX_TAG_VAL_LENGTH)) for k, v in (tags or {}).items()]
        client = self._connect()
        for i in range(0, len(param_list), MAX_PARAMS_TAGS_PER_BATCH):
            client.log_batch(run_id, params=param_list[i:i + MAX_PARAMS_TAGS_PER_BATCH])
        for i in range(0, len(tag_list), MAX_PARAMS_TAGS_PER_BATCH):
            client.log_batch(run_id, tags=tag_list[i:i + MAX_PARAMS_TAGS_PER_BATCH])
        for i in range(0, len(metrics), MAX_METRICS_PER_BATCH):
            client.log_batch(run_id, metrics=list(metrics[i:i + MAX_METRICS_PER_BATCH]))


