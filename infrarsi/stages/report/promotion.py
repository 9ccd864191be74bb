"""The report's account of what was promoted and why: per-step and end-to-end speedups,
each promoted change's measured contribution, the noise estimate and whether the canary
could check anything. Read from the campaign folder alone (verification.json,
minimize.json, doctor.json), like the rest of the report."""

from __future__ import annotations

import re
import statistics
from typing import Any, Mapping

from infrarsi.record.doctor import DoctorReport
from infrarsi.record.minimize import Contribution, MinimizeReport
from infrarsi.record.verification import Verdict, VerificationReport
from infrarsi.stages.report.blocks import config_diff, details, fmt_change, fmt_value, table


def promotion_summary(verification: VerificationReport | None, minimize: MinimizeReport | None,
                      doctor: DoctorReport | None) -> dict[str, Any]:
    """Summary fields: the promoted verdict's speedups, its changes, the checks' standing
    (``verification``: what stands promoted, ``infrarsi.record.campaign.final_verification``)."""
    v = verification.promoted if verification else None
    job = v is not None and v.job_steps is not None
    contributions = minimize.contributions if minimize else ()
    return {
        "step_speedup": (v.speedup if v.step_speedup is None else v.step_speedup) if v else None,
        "end_to_end_speedup": v.speedup if job else None,
        "job_steps": minimize.job_steps if minimize else (v.job_steps if v else None),
        "promoted_changes": [_change(c) for c in contributions if c.kept],
        "dropped_changes": [_change(c) for c in contributions if not c.kept],
        "minimize_trials": minimize.num_trials if minimize else 0,
        "canary_effective": verification.canary_effective if verification else None,
        "canary_note": verification.canary_note if verification else "",
        "noise_cv": doctor.noise_cv if doctor else None,
        "practical_margin": verification.margin if verification else None,
        "noise_estimate_weak": doctor.noise.weak if doctor and doctor.noise else None,
    }


def _change(c: Contribution) -> dict[str, Any]:
    return {"knob": c.knob, "from": c.baseline_value, "to": c.value, "contribution": c.contribution,
            "ci": [c.ci_low, c.ci_high] if c.ci_low is not None else None, "inert": c.inert,
            "source": c.source, "ground": c.ground, "note": c.note}


def ground(c: Mapping[str, Any]) -> str:
    """Why a change was kept or dropped, in a few words: minimization's ``ground``, else
    (a folder written before it had one) the head of its note, else "inert"."""
    if c.get("ground"):
        return c["ground"]
    head = re.split(r"[:;]", c.get("note") or "", maxsplit=1)[0].strip()
    return head or ("inert" if c.get("inert") else "")


def contribution_rows(minimize: MinimizeReport | None) -> list[dict[str, Any]]:
    """Each change of the leader, kept and dropped, as the contributions picture draws it."""
    return [{"label": fmt_change(c.knob, c.baseline_value, c.value), "contribution": c.contribution,
             "ci": [c.ci_low, c.ci_high] if c.ci_low is not None else None, "kept": c.kept,
             "ground": ground(_change(c)), "source": c.source}
            for c in (minimize.contributions if minimize else ())]


def _x(v: float | None) -> str:
    return "-" if v is None else f"{v:.3f}x"


def result_bullets(s: dict[str, Any]) -> list[str]:
    """Under the headline speedup: per step and end to end, and the canary's standing."""
    out = []
    if s["verified_speedup"]:
        if s["end_to_end_speedup"] is not None:
            out.append(f"end to end over the declared job ({s['job_steps']:,.0f} steps, start-up included): "
                       f"{_x(s['end_to_end_speedup'])}; per step: {_x(s['step_speedup'])}")
        else:
            out.append(f"per step: {_x(s['step_speedup'])} (no job length declared: start-up is not counted; "
                       "set [objective] job_steps or job_hours to count it)")
    if s["canary_effective"] is False:
        out.append(f"**{s['canary_note']}**")
    elif s["canary_effective"]:
        out.append(f"canary check: {s['canary_note']}")
    if s.get("campaign_wall_s") is not None:
        out.append(f"campaign wall time {s['campaign_wall_s']:.0f} s")
    return out


def contribution_sections(minimize: MinimizeReport | None) -> list[dict[str, Any]]:
    """Each change of the verified winner: what it contributes, kept or dropped, and why
    (one report section, none before minimization ran or when nothing was promoted)."""
    if not minimize or not minimize.winner:
        return []
    rows = []
    for c in minimize.contributions:
        ci = f"{c.ci_low:.3f} - {c.ci_high:.3f}" if c.ci_low is not None else "-"
        rows.append([c.knob, f"{fmt_value(c.baseline_value)} -> {fmt_value(c.value)}",
                     "kept" if c.kept else "dropped",
                     ground(_change(c)) or "-", _x(c.contribution), ci, _x(c.step_contribution),
                     c.source, c.note or "-"])
    what = ("step time" if minimize.job_steps is None
            else f"total time over the declared job ({minimize.job_steps:,.0f} steps)")
    margin = minimize.margin
    text = (f"Each change of the verified winner: its contribution is the winner's {what} without it over "
            f"with it (> 1: it pays), *predicted* by the time model fitted on every run at the contract seed "
            f"(90% interval), or *measured* by leaving it out ({minimize.num_trials} runs in verification's "
            f"rounds, beside the winner and sharing its baseline runs, at canary seeds). The fastest verified arm "
            f"(its pairs against the winner weighed with the time model's prediction) is promoted unless there is "
            f"evidence to drop a change: leaving it out shown to cost less than the "
            f"practical margin ({margin:.1%}; *equivalent*) or to save time (*costs*), doctor's calibration "
            f"seeing it change neither losses nor speed (*inert*), or, for a change of the numerics or a code "
            f"patch, not being shown to pay at least the margin. "
            f"{minimize.note[0].upper() + minimize.note[1:]}.")
    blocks = []
    if rows:
        blocks.append(table(["knob", "change", "promoted", "ground", "contribution", "90% CI", "per step", "source",
                             "note"],
                            rows, ["kept" if c.kept else "dropped" for c in minimize.contributions],
                            fold=["note"]))
    blocks.append(details("How contributions are measured, and when a change is dropped", text))
    return [{"id": "changes", "title": "Promoted changes", "blocks": blocks}]


def noise_bullets(doctor: DoctorReport, verification: VerificationReport | None) -> list[str]:
    n = doctor.noise
    if not n:
        return [f"noise: CV {doctor.noise_cv:.2%}, within-run CV {doctor.within_run_cv:.2%}"]
    out = [f"noise of one run's median step time {n.noise_cv:.2%}: the larger of the between-run CV's 90% "
           f"upper bound {n.between_run_cv_upper:.2%} (measured {n.between_run_cv:.2%} over {n.num_runs} "
           f"runs) and the within-run spread {n.within_run_cv:.2%} as the error of a run's median "
           f"({n.within_run_median_cv:.2%})"]
    if n.weak:
        out.append(f"**the noise estimate is weak**: {n.num_runs} baseline runs (budget.doctor_max_repeats "
                   "allowed no more); treat small speedups with care")
    if verification and verification.observed_noise_cv is not None:
        seen = verification.observed_noise_cv
        verdict = ("above doctor's estimate" if seen > n.noise_cv else "within doctor's estimate")
        out.append(f"the largest per-run noise the verification pairs showed: {seen:.2%} ({verdict})")
    return out


def verification_blocks(verification: VerificationReport | None, baseline: Mapping[str, Any]) -> list[dict[str, Any]]:
    if not verification or not verification.verdicts:
        return [{"text": "No finalist: no search trial beat the baseline by more than the practical margin, so "
                         "nothing was verified."}]
    rows = []
    for v in verification.verdicts:
        job = v.job_steps is not None
        rows.append([v.arm or "-", config_diff(v.config, baseline), len(v.pairs),
                     _x(v.step_speedup or v.speedup), _x(v.speedup) if job else "-",
                     f"{v.ci_low:.3f} - {v.ci_high:.3f}" if v.ci_low else "-",
                     _startups(v), "yes" if v.promoted else "no", v.reason])
    blocks = [table(["arm", "config (vs baseline)", "pairs", "per step", "end to end", "interval (objective)",
                     "start-up base / cand.", "promoted", "why"], rows,
                    ["kept" if v.promoted else "" for v in verification.verdicts], fold=["why"])]
    if verification.note:
        blocks.append(details("How the arms were run and stopped",
                              "Each arm ran until the sequential test decided it (infrarsi.stages.run.sequential): "
                              + verification.note + "."))
    return blocks


def _startups(v: Verdict) -> str:
    b, c = v.baseline_startups_s, v.candidate_startups_s
    return f"{statistics.median(b):.2f} s / {statistics.median(c):.2f} s" if b and c else "-"
