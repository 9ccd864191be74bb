"""report: everything a campaign did, in Markdown and HTML, rebuilt from its folder alone.

Read top down: the answer (``headline``), the pictures (``plots``, PNGs under ``plots/``),
then the evidence, the trials table last. ``build_report(dir)`` reads only files the stages
wrote (contract, doctor, ledger, search, verification, minimization, apply, warnings), so
``infrarsi report DIR`` works on any finished or interrupted campaign, and on a folder an
older version wrote: what a missing record would have fed is named as missing.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from infrarsi.contract.loss_reference import pct
from infrarsi.contract.numerics import describe
from infrarsi.core.ledger import Ledger
from infrarsi.core.spec import CampaignSpec
from infrarsi.core.trial import Role, TrialResult
from infrarsi.core.workspace import CampaignDir
from infrarsi.record.campaign import final_verification, read_contract, read_doctor, read_minimize
from infrarsi.record.doctor import DoctorReport
from infrarsi.record.verification import VerificationReport
from infrarsi.stages.report import plots
from infrarsi.stages.report.blocks import config_diff, fmt_bytes, fmt_config, fmt_s, readable, table
from infrarsi.stages.report.headline import campaign_headline, outcome_counts
from infrarsi.stages.report.learned import learned_blocks, setting_effects
from infrarsi.stages.report.promotion import (
    contribution_rows,
    contribution_sections,
    noise_bullets,
    result_bullets,
    verification_blocks,
)
from infrarsi.stages.report.summary import cost_by_outcome, summarize


def _mfu_line(s: dict[str, Any]) -> str:
    basis = s["mfu_basis"]
    pct = lambda x: "-" if x is None else f"{x:.1%}"  # noqa: E731
    return (f"MFU: baseline {pct(s['baseline_mfu'])}, promoted {pct(s['promoted_mfu'])} "
            f"(against {basis['num_devices']} x {basis['accelerator']} at "
            f"{basis['peak_flops_per_device'] / 1e12:,.0f} TFLOP/s dense bf16, from the {basis['peak_source']})")


def _result_blocks(s: dict[str, Any]) -> list[dict[str, Any]]:
    """The headline's figures in full: how the speedup was measured, the checks' standing."""
    bullets = []
    if s["verified_speedup"]:
        lo, hi = s["speedup_ci"]
        bullets.append(f"**Verified speedup {s['verified_speedup']:.2f}x** (90% CI {lo:.2f}x - {hi:.2f}x; its lower "
                       "end is a one-sided 95% bound that holds whichever pair the sequential test stopped at), "
                       "paired A B A B against the baseline")
    bullets += result_bullets(s)
    if s.get("mfu_basis"):
        bullets.append(_mfu_line(s))
    bullets += [f"baseline step time {fmt_s(s['baseline_step_time_s'])}, "
                f"best search trial {fmt_s(s['best_step_time_s'])}",
                f"trials by outcome: {outcome_counts(s['trials_by_outcome'])}; seconds spent on failed trials: "
                f"{s['failed_trial_seconds']:,.1f}"]
    return [{"bullets": bullets}]


def _tolerances(doctor: DoctorReport) -> str:
    """Each numerics class's calibrated tolerance (one figure for a report made without classes)."""
    if not doctor.loss_contract:
        return pct(doctor.loss_tolerance)
    return ", ".join(f"{describe(c.settings)} {'no reference' if c.failure else pct(c.tolerance)}"
                     for c in doctor.loss_contract.classes)


def _doctor_blocks(doctor: DoctorReport | None, spec: CampaignSpec,
                   verification: VerificationReport | None) -> list[dict[str, Any]]:
    if not doctor:
        return [{"text": "Doctor has not finished."}]
    bullets = [f"baseline config: `{fmt_config(spec.baseline)}`",
               f"median step time {fmt_s(doctor.step_time_s)} over runs "
               + ", ".join(fmt_s(x) for x in doctor.run_step_times_s),
               *noise_bullets(doctor, verification if verification and verification.verdicts else None),
               f"start-up (launch to steady steps) {doctor.startup_s:.2f} s",
               f"peak memory {fmt_bytes(doctor.peak_memory_bytes)} (capacity {fmt_bytes(spec.device.memory_capacity)})",
               f"loss tolerance {_tolerances(doctor)} ({doctor.loss_tolerance_source})",
               "phases (median per step): " + (", ".join(f"{k} {fmt_s(v)}" for k, v in doctor.phases_s.items())
                                               or "not reported by the job")]
    # calibration rows are doctor's free-form table (infrarsi.stages.calibration), kept as written
    calibration = table(["calibration variant", "outcome", "max loss deviation"],
                       ([readable(c["config"], spec.baseline), c.get("outcome", "ok"),
                         "-" if c["deviation"] is None else f"{c['deviation']:.2e}"]
                        for c in doctor.calibration))
    return [{"bullets": bullets}, calibration]


def _trials_table(trials: list[TrialResult], baseline: dict) -> dict[str, Any]:
    return table(["trial", "role", "outcome", "step time", "start-up", "wall", "peak memory", "config (vs baseline)",
                  "reason"],
                 ([t.trial_id + (f"#{t.attempt}" if t.attempt > 1 else ""), t.role.value, t.outcome.value,
                   fmt_s(t.step_time_s), "-" if t.startup_s is None else f"{t.startup_s:.2f} s",
                   f"{t.wall_time_s:.1f} s", fmt_bytes(t.peak_memory_bytes), config_diff(dict(t.config), baseline),
                   t.reason or "-"] for t in trials),
                 [f"outcome-{t.outcome.value}" for t in trials], fold=["reason"])


def report_context(cdir: CampaignDir) -> dict[str, Any]:
    """What the report shows, as data: the ``headline`` (headline.headline), the
    ``pictures`` (plots.Picture) and why any is missing, then the evidence as sections, each
    a list of blocks (``text``, ``bullets``, ``table`` {headers, rows, row_classes},
    ``heading``, ``details`` {summary, text}). Both templates render the same context, so a
    row added here shows in both."""
    s = summarize(cdir)
    contract = read_contract(cdir)
    spec = contract.spec
    trials = Ledger(cdir.ledger).trials()
    final = [t for t in trials if not t.extra.get("retried")]
    doctor = read_doctor(cdir)
    search = cdir.read_json(cdir.search) if cdir.search.exists() else {}
    minimize = read_minimize(cdir)
    verification = final_verification(cdir)
    baseline = spec.baseline
    hw = contract.hardware
    intro = (f"Workload `{spec.name}` ({spec.backend} backend) on {hw.get('cpu')}, {hw.get('num_cpus')} CPUs, "
             f"GPUs: {hw.get('gpus') or 'none'}. Proposer: `{search.get('proposer', spec.search.proposer)}`.")
    top = campaign_headline(cdir, s, spec=spec, trials=trials, verification=verification, search=search)
    pictures, missing = plots.draw(
        cdir.plots, search=[t for t in final if t.role is Role.SEARCH], runs=final, doctor=doctor,
        verification=verification, effects=setting_effects(search), baseline=baseline,
        capacity_bytes=spec.device.memory_capacity,
        contributions_rows=contribution_rows(minimize if minimize and minimize.winner else None))
    costs = cost_by_outcome(trials)
    sections = [
        {"id": "result", "title": "Result in detail", "blocks": _result_blocks(s)},
        *contribution_sections(minimize),
        {"id": "verification", "title": "Verification", "blocks": verification_blocks(verification, baseline)},
        {"id": "doctor", "title": "Doctor (baseline)", "blocks": _doctor_blocks(doctor, spec, verification)},
        *([{"id": "learned", "title": "What the search learned, in detail",
            "blocks": learned_blocks(search["describe"], baseline)}] if search.get("describe") else []),
        {"id": "cost", "title": "Cost by outcome", "blocks": [table(
            ["outcome", "trials", "attempts", "wall s", "device s"],
            ([k, int(v["count"]), int(v["attempts"]), f"{v['wall_s']:.1f}", f"{v['device_s']:.1f}"]
             for k, v in sorted(costs.items())),
            [f"outcome-{k}" for k in sorted(costs)])]},
        {"id": "trials", "title": "Trials", "blocks": [_trials_table(trials, baseline)]},
    ]
    return {"title": f"infrarsi campaign `{s['campaign_id']}`", "campaign_id": s["campaign_id"],
            "intro": intro, "summary": s, "headline": top, "pictures": pictures, "missing_pictures": missing,
            "sections": sections}


_INLINE = re.compile(r"\*\*(.+?)\*\*|`([^`]*)`")


def _inline_html(text: Any) -> Any:
    """The two inline marks the report's text uses, **bold** and `code`, as HTML; the
    rest escaped."""
    from markupsafe import Markup, escape

    out, pos = [], 0
    for m in _INLINE.finditer(str(text)):
        out.append(escape(m.string[pos:m.start()]))
        out.append(Markup("<strong>{}</strong>").format(m[1]) if m[1] is not None
                   else Markup("<code>{}</code>").format(m[2]))
        pos = m.end()
    out.append(escape(str(text)[pos:]))
    return Markup("").join(out)


def _environment(*, html: bool) -> Any:
    import jinja2

    env = jinja2.Environment(loader=jinja2.PackageLoader("infrarsi.stages.report", "templates"), autoescape=html,
                             keep_trailing_newline=True, trim_blocks=True, lstrip_blocks=True,
                             undefined=jinja2.StrictUndefined)
    # A "|" or a line break would end a Markdown table cell.
    env.filters["md_cell"] = lambda c: str(c).replace("|", "/").replace("\n", " ")
    env.filters["inline"] = _inline_html
    return env


def render_markdown(cdir: CampaignDir, context: dict[str, Any] | None = None) -> str:
    return _environment(html=False).get_template("report.md.j2").render(context or report_context(cdir))


def render_html(cdir: CampaignDir, context: dict[str, Any] | None = None) -> str:
    return _environment(html=True).get_template("report.html.j2").render(context or report_context(cdir))


def build_report(root: Path | str) -> Path:
    cdir = CampaignDir(Path(root).resolve())
    context = report_context(cdir)
    cdir.report_md.write_text(render_markdown(cdir, context))
    cdir.report_html.write_text(render_html(cdir, context))
    cdir.write_json(cdir.summary, context["summary"])
    return cdir.report_html
