"""compare: the campaigns of one MLflow store side by side, and their searches in one plot.

Reads only what campaigns logged to MLflow (a parent run per campaign, a child run per
trial), so it works on any store campaigns shared: the machine's default store, a file
store or a tracking server.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from infrarsi.adapters.mlflow_runs import campaign_runs, trial_runs
from infrarsi.core.errors import InfrarsiError

COLUMNS = (("campaign", "campaign_id"), ("job", "job"), ("hardware", "hardware"), ("proposer", "proposer"),
           ("budget", "budget"), ("status", "status"), ("baseline", "baseline_step_time_s"),
           ("best", "best_step_time_s"), ("speedup", "verified_speedup"), ("90% CI", "speedup_ci"),
           ("MFU", "mfu"), ("trials by outcome", "trials_by_outcome"), ("failed s", "failed_trial_seconds"),
           ("branch", "branch"))


def campaign_row(run: dict[str, Any]) -> dict[str, Any]:
    """One campaign's parent run as a row of the comparison."""
    params, tags, metrics = run["params"], run["tags"], run["metrics"]
    low, high = metrics.get("speedup_ci_low"), metrics.get("speedup_ci_high")
    return {
        "campaign_id": tags.get("infrarsi.campaign_id", run["run_name"]), "run_id": run["run_id"],
        "job": tags.get("infrarsi.job") or params.get("spec"),
        "hardware": tags.get("infrarsi.hardware_desc") or tags.get("infrarsi.hardware"),
        "hardware_hash": tags.get("infrarsi.hardware"),
        "proposer": params.get("proposer"), "budget": _int(params.get("num_trials")), "status": run["status"],
        "baseline_step_time_s": metrics.get("baseline_step_time_s"),
        "best_step_time_s": metrics.get("best_step_time_s"),
        "verified_speedup": metrics.get("verified_speedup"),
        "speedup_ci": [low, high] if low is not None and high is not None else None,
        # The summary's baseline_mfu / promoted_mfu, as the parent run logs them.
        "mfu": {k: v for k, v in sorted(metrics.items()) if "mfu" in k.lower().split("_")} or None,
        "trials_by_outcome": {k.removeprefix("trials/"): int(v) for k, v in sorted(metrics.items())
                              if k.startswith("trials/")},
        "failed_trial_seconds": metrics.get("failed_trial_seconds"),
        "branch": tags.get("infrarsi.branch") or None,
    }


def _int(value: str | None) -> int | None:
    return int(value) if value and value.isdigit() else None


def best_so_far(trials: list[dict[str, Any]]) -> list[float | None]:
    """Best ok step time after each search trial (final attempts, in trial order)."""
    final: dict[str, dict[str, Any]] = {}
    for t in trials:
        tags = t["tags"]
        if tags.get("infrarsi.role") != "search":
            continue
        tid, attempt = tags.get("infrarsi.trial_id", t["run_name"]), int(tags.get("infrarsi.attempt", "1"))
        if tid not in final or attempt > int(final[tid]["tags"].get("infrarsi.attempt", "1")):
            final[tid] = t
    best, out = float("inf"), []
    for tid in sorted(final):
        t = final[tid]
        if t["tags"].get("infrarsi.outcome") == "ok" and "step_time_s" in t["metrics"]:
            best = min(best, t["metrics"]["step_time_s"])
        out.append(best if best < float("inf") else None)
    return out


def compare(tracking_uri: str, *, job: str | None = None, hardware: str | None = None,
            plot_path: Path | None = None) -> tuple[list[dict[str, Any]], Path | None]:
    """The rows of every campaign in the store (filtered by job and by a substring of the
    hardware description or hash), and the best-so-far plot written to ``plot_path``."""
    if tracking_uri.startswith("sqlite:///") and not Path(tracking_uri.removeprefix("sqlite:///")).is_file():
        raise InfrarsiError(f"no MLflow store at {tracking_uri}: run a campaign first, or pass the store "
                            "campaigns logged to with --tracking-uri")
    rows = []
    for run in campaign_runs(tracking_uri):
        row = campaign_row(run)
        if job and row["job"] != job:
            continue
        if hardware and hardware not in f"{row['hardware']} {row['hardware_hash']}":
            continue
        row["best_so_far_s"] = best_so_far(trial_runs(tracking_uri, run["run_id"]))
        rows.append(row)
    plot = _plot(rows, plot_path) if plot_path else None
    return rows, plot


def _plot(rows: list[dict[str, Any]], path: Path) -> Path | None:
    curves = [(r, [(i, v * 1000) for i, v in enumerate(r["best_so_far_s"], 1) if v is not None]) for r in rows]
    curves = [(r, pts) for r, pts in curves if pts]
    if not curves:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for row, pts in curves:
        ax.step(*zip(*pts), where="post", label=f"{row['campaign_id']} ({row['proposer']})")
    ax.set(xlabel="search trial", ylabel="best step time so far (ms)", title="Best so far, by campaign")
    ax.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _fmt(key: str, value: Any) -> str:
    if value is None or value == {}:
        return "-"
    if key.endswith("step_time_s"):
        return f"{value * 1000:.1f} ms"
    if key == "verified_speedup":
        return f"{value:.2f}x"
    if key == "speedup_ci":
        return f"{value[0]:.2f}-{value[1]:.2f}"
    if key == "mfu":
        return ", ".join(f"{k} {v:.1%}" if v <= 1 else f"{k} {v:.3g}" for k, v in value.items())
    if key == "trials_by_outcome":
        return " ".join(f"{k}:{v}" for k, v in value.items())
    if isinstance(value, float):
        return f"{value:.1f}"
    return str(value)


def format_table(rows: list[dict[str, Any]]) -> str:
    """The rows as an aligned plain-text table."""
    if not rows:
        return "no campaigns in this store (or none match the filters)"
    cells = [[title for title, _ in COLUMNS]] + [[_fmt(key, r[key]) for _, key in COLUMNS] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(COLUMNS))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
