"""The report's first block: the answer a user reads before anything else.

The verified speedup and its interval, baseline -> promoted step time (and MFU where
known), what the campaign cost, whether it is safe (the loss contract: runs checked, the
tolerance, configs rejected, the canary, what the job's printed digits hide), the branch
with the command that shows it, each promoted change with what it contributes, and one
line for each thing the user must know (the
canary could not check, runs stayed contaminated, the budget was clipped, and every
warning a stage recorded in the campaign folder). Built from the summary and the folder's
records, like the rest of the report.
"""

from __future__ import annotations

import shlex
import statistics
from typing import Any, Iterable, Mapping, Sequence

from infrarsi.core.ledger import Ledger
from infrarsi.core.options import CampaignOptions
from infrarsi.core.spec import CampaignSpec
from infrarsi.contract.loss_reference import pct
from infrarsi.core.trial import Outcome, Role, TrialResult
from infrarsi.core.workspace import CampaignDir
from infrarsi.record.campaign import read_doctor
from infrarsi.record.doctor import DoctorReport
from infrarsi.record.verification import Verdict, VerificationReport
from infrarsi.stages.report.blocks import config_changes, fmt_change, fmt_s
from infrarsi.stages.report.promotion import ground


def outcome_counts(counts: Mapping[str, int]) -> str:
    """``31 ok, 3 oom, 3 crash``: ok first, then the failures, most frequent first."""
    order = sorted(counts.items(), key=lambda kv: (kv[0] != "ok", -kv[1], kv[0]))
    return ", ".join(f"{n} {k}" for k, n in order if n) or "none"


def promoted_step_time_s(promoted: Verdict | None) -> float | None:
    """The promoted config's step time: the median of its verification runs."""
    times = promoted.candidate_times_s if promoted else ()
    return statistics.median(times) if times else None


def _x(v: float) -> str:
    return f"{v:.2f}x"


def _change_row(c: Mapping[str, Any], kept: bool) -> dict[str, Any]:
    """One change as the headline lists it: ``knob: from -> to``, its contribution with its
    90% interval and where that figure comes from, and the ground it was kept or dropped on."""
    figure = "-"
    if c.get("contribution") is not None:
        ci = f" ({c['ci'][0]:.2f}-{c['ci'][1]:.2f})" if c.get("ci") else ""
        figure = f"{_x(c['contribution'])}{ci} {c.get('source', 'measured')}"
    return {"change": fmt_change(c["knob"] + ":", c["from"], c["to"]), "contribution": figure,
            "ground": ground(c) or "-", "kept": kept}


def _mfu(s: Mapping[str, Any], trials: Sequence[TrialResult], promoted: Verdict | None) -> str | None:
    """``MFU 25.6% -> 48.7%``: the summary's (from the device's peak), else the job's own
    reported MFU (a trial's ``extra["mfu"]``, which the simulator fills), said which."""
    if s.get("baseline_mfu") is not None:
        after = "-" if s.get("promoted_mfu") is None else f"{s['promoted_mfu']:.1%}"
        return f"MFU {s['baseline_mfu']:.1%} -> {after}"
    reported = {t.trial_id: t.extra.get("mfu") for t in trials if t.extra.get("mfu") is not None}
    before = [reported[t.trial_id] for t in trials if t.role is Role.DOCTOR and t.trial_id in reported]
    after = [reported[c] for _, c in (promoted.pairs if promoted else ()) if c in reported]
    if not before:
        return None
    tail = f"{statistics.median(after):.1%}" if after else "-"
    return f"MFU {statistics.median(before):.1%} -> {tail} (as the job reported it)"


def _payback_line(s: Mapping[str, Any]) -> str:
    """``cost: 412 device-seconds, repaid after 3,200 steps of the job (16% of its 20,000)``."""
    line = f"cost: {s['campaign_device_s']:,.0f} device-seconds"
    if s.get("payback_steps") is None:
        return line
    line += f", repaid after {s['payback_steps']:,.0f} steps of the job at the promoted config"
    if s.get("payback_fraction") is not None and s.get("job_steps"):
        line += f" ({s['payback_fraction']:.1%} of its {s['job_steps']:,.0f})"
    return line


def _branch_lines(s: Mapping[str, Any], repository: str | None) -> list[str]:
    if not s.get("branch"):
        return ["branch: not staged"] if s.get("verified_speedup") else []
    lines = [f"branch `{s['branch']}` (commit `{(s.get('commit') or '')[:10]}`)"]
    if repository:  # one command: the change and its audit; ``git merge`` of the same branch applies it
        lines.append(f"see it: `git -C {shlex.quote(repository)} show {s['branch']}` (merge the branch to apply it)")
    return lines


def safety(s: Mapping[str, Any], trials: Sequence[TrialResult], doctor: DoctorReport | None) -> str | None:
    """One line: how the loss contract held (runs checked, their tolerance, configs rejected,
    the canary) and what the job's printed digits hide; None before doctor calibrated one."""
    contract = doctor.loss_contract if doctor else None
    if contract is None:
        return None
    checked = sum(1 for t in trials if t.losses and t.outcome in (Outcome.OK, Outcome.CONTRACT_VIOLATION))
    rejected = sorted({str(dict(t.config)) for t in trials if t.outcome is Outcome.CONTRACT_VIOLATION})
    others = len(contract.classes) - 1
    line = (f"loss contract: {checked} runs checked on the {contract.signal} signal, tolerance "
            f"{pct(contract.tolerance)} in the baseline's numerics"
            + (f" ({others} other numerics class{'es' if others > 1 else ''} against their own reference)"
               if others else "")
            + f"; {len(rejected)} config{'s' if len(rejected) != 1 else ''} rejected")
    if s.get("canary_effective") is not None:
        line += "; canary seeds: " + ("the job honours them" if s["canary_effective"] else "could not check")
    resolution = contract.resolution()
    return line + (f"; {resolution}" if resolution else "")


def warnings(s: Mapping[str, Any], trials: Sequence[TrialResult], *, search_budget: int | None,
             asked_budget: int | None, llm_warnings: Sequence[str] = ()) -> list[str]:
    """Everything the user must know that the numbers above do not say, each once."""
    out = []
    if s.get("canary_effective") is False:
        out.append(s.get("canary_note") or "the canary check could not tell whether the job honours its seed")
    contaminated = [t.trial_id for t in trials if t.extra.get("contaminated") and not t.extra.get("retried")]
    if contaminated:
        out.append(f"{len(contaminated)} run(s) stayed contaminated by other load after their re-measurements "
                   f"({', '.join(contaminated[:6])}{', ...' if len(contaminated) > 6 else ''}): their times are "
                   "less certain")
    if search_budget is not None and asked_budget is not None and search_budget < asked_budget:
        out.append(f"budget clipped: the search ran {search_budget} of the {asked_budget} trials asked for, "
                   f"so that verification fits the trial cap ({s.get('max_trials')})")
    if s.get("noise_estimate_weak"):
        out.append("doctor's noise estimate is weak (too few baseline runs): treat small speedups with care")
    out += list(llm_warnings) + list(s.get("warnings") or [])
    return list(dict.fromkeys(out))


def headline(s: Mapping[str, Any], *, trials: Sequence[TrialResult], promoted: Verdict | None,
             baseline: Mapping[str, Any], repository: str | None, warning_lines: Sequence[str],
             num_verified: int, safety_line: str | None = None) -> dict[str, Any]:
    """The headline as data: ``answer`` and ``interval`` (the big line), ``facts`` and
    ``warnings`` (inline-marked strings), ``changes`` (kept, then dropped: ``_change_row``)."""
    base_s, best_s = s.get("baseline_step_time_s"), s.get("best_step_time_s")
    if s.get("verified_speedup"):
        lo, hi = s["speedup_ci"]
        what = "end to end" if s.get("end_to_end_speedup") is not None else "per step"
        answer = f"{_x(s['verified_speedup'])} faster {what}, verified"
        interval = f"90% CI {_x(lo)} - {_x(hi)} over {len(promoted.pairs if promoted else ())} interleaved pairs"
        if s.get("end_to_end_speedup") is not None:
            interval += f"; per step {_x(s['step_speedup'])}"
        facts = [f"step time {fmt_s(base_s)} -> {fmt_s(promoted_step_time_s(promoted))} (baseline -> promoted)"]
    else:
        answer = "No verified speedup: the baseline stands"
        interval = (f"none of the {num_verified} verified configs cleared the bar" if num_verified else
                    "no search trial beat the baseline by enough to be verified")
        facts = [f"step time: baseline {fmt_s(base_s)}, best search trial {fmt_s(best_s)}"]
    mfu = _mfu(s, trials, promoted)
    facts += [mfu] if mfu else []
    wall = "" if s.get("campaign_wall_s") is None else f"{s['campaign_wall_s']:,.0f} s wall time, "
    facts.append(f"campaign: {wall}{s['num_trials']} trials ({outcome_counts(s['trials_by_outcome'])})")
    facts += [_payback_line(s)] if s.get("campaign_device_s") is not None else []
    facts += [safety_line] if safety_line else []
    facts += _branch_lines(s, repository)
    changes = [_change_row(c, True) for c in s.get("promoted_changes") or []]
    if not changes and s.get("promoted_config"):  # minimization did not run: the changes, no figures
        changes = [{"change": c, "contribution": "-", "ground": "-", "kept": True}
                   for c in config_changes(s["promoted_config"], baseline, sep=":")]
    changes += [_change_row(c, False) for c in s.get("dropped_changes") or []]
    return {"answer": answer, "interval": interval, "facts": facts, "changes": changes,
            "warnings": list(warning_lines), "promoted": bool(s.get("verified_speedup"))}


def llm_warnings(events: Iterable[Mapping[str, Any]]) -> list[str]:
    """What the search's priors event recorded about the LLM (a fallback, a dropped answer)."""
    return [w for e in events if e.get("kind") == "priors" for w in (e.get("warnings") or [])]


def campaign_headline(cdir: CampaignDir, s: Mapping[str, Any], *, spec: CampaignSpec, trials: Sequence[TrialResult],
                      verification: VerificationReport | None, search: Mapping[str, Any]) -> dict[str, Any]:
    """The headline of the campaign in ``cdir``, from its summary ``s``, its ``spec``, its
    ledger's ``trials``, its final verification and its search record (each may be empty)."""
    apply_json = cdir.root / "apply.json"
    repository = cdir.read_json(apply_json).get("repository") if apply_json.exists() else None
    lines = warnings(s, trials, search_budget=search.get("budget"),
                     asked_budget=CampaignOptions().resumed(cdir).search_budget(spec),
                     llm_warnings=llm_warnings(Ledger(cdir.ledger).events()))
    final = [t for t in trials if not t.extra.get("retried")]
    return headline(s, trials=final, promoted=verification.promoted if verification else None,
                    baseline=spec.baseline, repository=repository, warning_lines=lines,
                    num_verified=len(verification.verdicts) if verification else 0,
                    safety_line=safety(s, final, read_doctor(cdir)))
