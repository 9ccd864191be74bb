"""A campaign's summary: what it concluded, in numbers (speedup and interval, trials and
seconds by outcome, what the campaign cost in device seconds and after how many of the
job's steps the promoted change repays it, the trial cap, MFU, the branch), from its
folder; and the same as
MLflow metrics and as rows for a Prefect table. ``build_report`` builds it once per report
and writes summary.json."""

from __future__ import annotations

import collections
import datetime as dt
import json
import statistics
from typing import Any

from infrarsi.contract.freeze import Contract
from infrarsi.core.ledger import Ledger
from infrarsi.core.trial import Outcome, Role, TrialResult
from infrarsi.core.workspace import CampaignDir
from infrarsi.record.campaign import final_verification, read_contract, read_doctor, read_minimize
from infrarsi.stages.budget import recorded_cap, trials_by_stage
from infrarsi.stages.report.mfu import campaign_mfu
from infrarsi.stages.report.promotion import promotion_summary


def cost_by_outcome(trials: list[TrialResult]) -> dict[str, dict[str, float]]:
    """Per outcome: ``count``, the trials whose final attempt ended so (a re-measured trial
    counts once); ``attempts``, every attempt that ended so; and the seconds all those
    attempts took (``wall_s``, ``device_s``): every attempt costs."""
    out: dict[str, dict[str, float]] = collections.defaultdict(
        lambda: {"count": 0, "attempts": 0, "wall_s": 0.0, "device_s": 0.0})
    for t in trials:
        row = out[t.outcome.value]
        row["count"] += 0 if t.extra.get("retried") else 1
        row["attempts"] += 1
        row["wall_s"] += t.wall_time_s
        row["device_s"] += t.device_seconds
    return dict(out)


def summarize(cdir: CampaignDir) -> dict[str, Any]:
    """The JSON summary of a campaign, from its folder (built once by ``build_report``, which
    writes it to summary.json; ``infrarsi.record.campaign.read_summary`` reads it back)."""
    contract = read_contract(cdir)
    trials = Ledger(cdir.ledger).trials()
    doctor = read_doctor(cdir)
    verification = final_verification(cdir)
    promoted = verification.promoted if verification else None
    ok_search = [t for t in trials if t.role is Role.SEARCH and t.outcome is Outcome.OK]
    costs = cost_by_outcome(trials)
    apply = cdir.read_json(cdir.root / "apply.json") if (cdir.root / "apply.json").exists() else {}
    promotion = promotion_summary(verification, read_minimize(cdir), doctor)
    return {
        "campaign_id": contract.campaign_id, "campaign_dir": str(cdir.root),
        "baseline_step_time_s": doctor.step_time_s if doctor else None,
        "best_step_time_s": min((t.step_time_s for t in ok_search), default=None),
        "verified_speedup": promoted.speedup if promoted else None,
        "speedup_ci": [promoted.ci_low, promoted.ci_high] if promoted else None,
        "promoted_config": dict(promoted.config) if promoted else None,
        "trials_by_outcome": {k: int(v["count"]) for k, v in sorted(costs.items()) if v["count"]},
        "attempts_by_outcome": {k: int(v["attempts"]) for k, v in sorted(costs.items())},
        "failed_trial_seconds": round(sum(v["wall_s"] for k, v in costs.items() if k != "ok"), 2),
        "failed_device_seconds": round(sum(v["device_s"] for k, v in costs.items() if k != "ok"), 2),
        **payback(costs, trials, doctor, promoted, promotion.get("job_steps")),
        "num_search_trials": sum(1 for t in trials if t.role is Role.SEARCH and not t.extra.get("retried")),
        "num_trials": sum(1 for t in trials if not t.extra.get("retried")),
        "trials_by_stage": trials_by_stage(trials),
        "max_trials": _max_trials(cdir, contract),
        "branch": apply.get("branch"), "commit": apply.get("commit"), "repository": apply.get("repository"),
        "mlflow_parent_run_id": apply.get("mlflow_parent_run_id") or contract.extra.get("mlflow_parent_run_id"),
        "report": str(cdir.report_html),
        # baseline_mfu, promoted_mfu (fractions; None on CPU) and mfu_basis (device, peak, count).
        **campaign_mfu(spec=contract.spec.model_dump(mode="json"), hardware=contract.hardware, doctor=doctor,
                       promoted=promoted, starts={t.trial_id: t.extra.get("start") or {} for t in trials}),
        "campaign_wall_s": _campaign_wall_s(cdir, contract),
        "warnings": [w["message"] for w in cdir.read_warnings()],
        **promotion,
    }


def payback(costs: dict[str, dict[str, float]], trials: list[TrialResult], doctor: Any, promoted: Any,
            job_steps: float | None) -> dict[str, float | None]:
    """``campaign_device_s``: the device seconds of every attempt, failed and re-measured ones
    included; ``payback_steps``: the job steps after which the promoted config has saved as
    much (the campaign's device seconds over the step time it saves, in device seconds: the
    devices a trial holds); ``payback_fraction``: that, over the job's declared length."""
    spent = round(sum(v["device_s"] for v in costs.values()), 2)
    out: dict[str, float | None] = {"campaign_device_s": spent, "payback_steps": None, "payback_fraction": None}
    held = [t.device_seconds / t.wall_time_s for t in trials if t.role is Role.DOCTOR and t.wall_time_s > 0]
    times = promoted.candidate_times_s if promoted else ()
    if not (doctor and times and held):
        return out
    saved = (doctor.step_time_s - statistics.median(times)) * statistics.median(held)
    if saved > 0:
        out["payback_steps"] = round(spent / saved)
        out["payback_fraction"] = round(spent / saved / job_steps, 4) if job_steps else None
    return out


def _max_trials(cdir: CampaignDir, contract: Contract) -> int:
    """The campaign's trial cap, as its runtime computed it (budget from options.json)."""
    return recorded_cap(contract.spec, cdir)


def _campaign_wall_s(cdir: CampaignDir, contract: Contract) -> float | None:
    """Seconds from the contract's creation to the last ledger record."""
    created = contract.created_at
    last = max((e["recorded_at"] for e in Ledger(cdir.ledger).events()), default=None)
    if not created or last is None:
        return None
    return round(last - dt.datetime.fromisoformat(created).timestamp(), 1)


def campaign_metrics(summary: dict[str, Any]) -> dict[str, float]:
    """The summary as MLflow metrics for the parent run: step times, speedup and its
    interval, trial counts by outcome (``trials/<outcome>``), seconds lost to failures,
    and any other number the summary carries (an MFU, where known)."""
    out = {k: float(v) for k, v in summary.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    if summary.get("speedup_ci"):
        out["speedup_ci_low"], out["speedup_ci_high"] = map(float, summary["speedup_ci"])
    out.update({f"trials/{k}": float(v) for k, v in summary.get("trials_by_outcome", {}).items()})
    return out


def summary_rows(summary: dict[str, Any]) -> list[dict[str, str]]:
    """The summary as a two-column table (field, value), e.g. for a Prefect table artifact."""
    return [{"field": k, "value": json.dumps(v, sort_keys=True) if isinstance(v, (dict, list)) else str(v)}
            for k, v in summary.items()]
