"""What a campaign and its trials look like in MLflow: tag names, a trial's params, tags and
metrics, and reading the runs back (``infrarsi compare``). ``adapters.tracking`` writes them."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Any, Iterator

from mlflow import MlflowClient
from mlflow.entities import Metric, ViewType

from infrarsi.adapters.mlflow_connect import STORE_ERRORS, bound_http_retries, describe, probe
from infrarsi.core.errors import InfrarsiError, UnreachableError
from infrarsi.core.trial import TrialResult

TAG_KIND = "infrarsi.kind"  # "campaign" on the parent run, "trial" on children
TAG_CAMPAIGN_ID = "infrarsi.campaign_id"
TAG_TRIAL_ID = "infrarsi.trial_id"
TAG_ATTEMPT = "infrarsi.attempt"
TAG_OUTCOME = "infrarsi.outcome"
TAG_ROLE = "infrarsi.role"
TAG_REASON = "infrarsi.reason"
TAG_SIMULATED = "infrarsi.simulated"
TAG_CACHED_FROM = "infrarsi.cached_from"
TAG_PARENT = "mlflow.parentRunId"
# MLflow 3's UI picks an experiment's view from this tag; without it, it may open a training
# campaign's experiment in its GenAI view.
EXPERIMENT_TAGS = {"mlflow.experimentKind": "custom_model_development"}
MAX_REASON_CHARS = 1000
def trial_tags(result: TrialResult, campaign_id: str, parent_id: str) -> dict[str, str]:
    tags = {
        TAG_PARENT: parent_id,
        TAG_KIND: "trial",
        TAG_CAMPAIGN_ID: campaign_id,
        TAG_TRIAL_ID: result.trial_id,
        TAG_ATTEMPT: str(result.attempt),
        TAG_OUTCOME: result.outcome.value,
        TAG_ROLE: result.role.value,
    }
    if result.reason:
        tags[TAG_REASON] = clip(result.reason, MAX_REASON_CHARS)
    if result.extra.get("simulated"):
        tags[TAG_SIMULATED] = "true"
    if result.extra.get("cached_from"):  # doctor's run, measured by the campaign that filled the cache
        tags[TAG_CACHED_FROM] = str(result.extra["cached_from"])
    return tags


def trial_params(result: TrialResult) -> dict[str, str]:
    # Knob names are identifiers, so the dotted infrarsi.* names never collide with them.
    params = {name: str(value) for name, value in result.config.items()}
    params["infrarsi.role"] = result.role.value
    params["infrarsi.attempt"] = str(result.attempt)
    params["infrarsi.patches"] = ",".join(result.patches) or "none"
    return params


def trial_metrics(result: TrialResult, time_ms: int) -> list[Metric]:
    summary = {
        "step_time_s": result.step_time_s,
        "peak_memory_bytes": result.peak_memory_bytes,
        "memory_capacity_bytes": result.memory_capacity_bytes,
        "wall_time_s": result.wall_time_s,
        "device_seconds": result.device_seconds,
        "tokens_per_step": result.tokens_per_step,
        **{f"phase/{name}_s": seconds for name, seconds in result.phases_s.items()},
    }
    metrics = [Metric(k, float(v), time_ms, 0) for k, v in summary.items() if v is not None]
    # Per-step series live under "step/" so they do not clash with the summary metrics.
    metrics += [Metric("step/loss", float(v), time_ms, i) for i, v in enumerate(result.losses)]
    metrics += [Metric("step/step_time_s", float(v), time_ms, i)
                for i, v in enumerate(result.step_times_s)]
    return metrics


def mark_training_experiment(client: MlflowClient, experiment: Any) -> None:
    """Tag an existing ``experiment`` as a training one (``EXPERIMENT_TAGS``) where it is not:
    one made before infrarsi tagged, or one whose kind the UI guessed."""
    for key, value in EXPERIMENT_TAGS.items():
        if experiment.tags.get(key) != value:
            client.set_experiment_tag(experiment.experiment_id, key, value)


def default_artifact_location(tracking_uri: str) -> str | None:
    if tracking_uri.startswith("sqlite:///"):
        db_path = Path(tracking_uri.removeprefix("sqlite:///"))
        if not db_path.is_absolute():
            db_path = db_path.resolve()
        return (db_path.parent / "mlartifacts").as_uri()
    return None  # a tracking server decides where artifacts go


def quote(value: str) -> str:
    """Quote a string for an MLflow filter (which has no escape sequences)."""
    if "'" not in value:
        return f"'{value}'"
    if '"' not in value:
        return f'"{value}"'
    raise InfrarsiError(f"id {value!r} holds both quote characters; MLflow cannot search it")


def clip(text: str, max_chars: int) -> str:
    return text if len(text) <= max_chars else text[: max_chars - 3] + "..."


def now_ms() -> int:
    return int(time.time() * 1000)


# ----------------------------------------------------------------- reading a store back
def run_record(run: Any) -> dict[str, Any]:
    return {"run_id": run.info.run_id, "run_name": run.info.run_name, "status": run.info.status,
            "start_time_ms": run.info.start_time, "params": dict(run.data.params),
            "tags": dict(run.data.tags), "metrics": dict(run.data.metrics)}
@contextlib.contextmanager
def _reading(tracking_uri: str) -> Iterator[MlflowClient]:
    """A client for ``tracking_uri``; a store that does not answer is an ``UnreachableError``
    naming it (after MLflow's bounded retries, not its default minutes)."""
    bound_http_retries()
    try:
        yield MlflowClient(tracking_uri=tracking_uri)
    except STORE_ERRORS as exc:
        raise UnreachableError(f"MLflow store {tracking_uri}: {describe(exc)}; check that it answers, or pass the "
                               "store campaigns logged to with --tracking-uri") from None


def campaign_runs(tracking_uri: str) -> list[dict[str, Any]]:
    """Every campaign's parent run in the store, across experiments, oldest first: run id,
    name, status, start time, params, tags and (latest) metrics. A tracking server is
    probed first, so one that does not answer fails in seconds."""
    problem = probe(tracking_uri)
    if problem is not None:
        raise UnreachableError(f"no MLflow tracking server answers at {tracking_uri} ({problem}): start it, or "
                               "pass the store campaigns logged to with --tracking-uri")
    with _reading(tracking_uri) as client:
        experiments = [e.experiment_id for e in client.search_experiments()]
        if not experiments:
            return []
        runs = client.search_runs(experiments, filter_string=f"tags.`{TAG_KIND}` = 'campaign'",
                                  order_by=["attributes.start_time ASC"], max_results=50_000)
    return [run_record(r) for r in runs]


def trial_runs(tracking_uri: str, parent_run_id: str) -> list[dict[str, Any]]:
    """The trial runs under one campaign's parent run (every attempt), as records."""
    with _reading(tracking_uri) as client:
        parent = client.get_run(parent_run_id)
        runs = client.search_runs([parent.info.experiment_id],
                                  filter_string=f"tags.`{TAG_PARENT}` = '{parent_run_id}'",
                                  run_view_type=ViewType.ACTIVE_ONLY, max_results=50_000)
    return [run_record(r) for r in runs]
