"""The report's pictures (matplotlib, PNG under the campaign's ``plots/``), drawn from
the campaign folder's records alone so ``infrarsi report DIR`` redraws them for any folder.

Each function draws one picture from plain data and returns False, drawing nothing, when
the data to draw it is absent (an old folder, a campaign stopped early): the report then
says what is missing instead of failing. ``learned`` draws what the search stage recorded
(``search.json``: the engine's fitted per-setting effects); it refits nothing.
"""

from __future__ import annotations

import math
import statistics
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from infrarsi.core.objective import job_time_s
from infrarsi.core.trial import Outcome, TrialResult
from infrarsi.record.doctor import DoctorReport
from infrarsi.record.verification import Verdict, VerificationReport
from infrarsi.stages.report.blocks import fmt_change
from infrarsi.stages.report.learned import log_interval

# One colour and marker per outcome, the trials table's colours too (templates/report.html.j2).
OUTCOME_STYLE = {
    "ok": ("#1f77b4", "o"), "oom": ("#d62728", ">"), "crash": ("#333333", "X"),
    "timeout": ("#9467bd", "s"), "contract_violation": ("#ff7f0e", "D"), "invalid": ("#8c564b", "P"),
}
KEPT, DROPPED, BASELINE, PROMOTED = "#2ca02c", "#9a9a9a", "#555555", "#2ca02c"
_WIDTH_IN, _DPI = 6.4, 150


@dataclass(frozen=True)
class Picture:
    path: str  # relative to the campaign folder, as the report links it
    title: str
    caption: str
    wide: bool = False  # drawn across the page, not in a column


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig: Any, path: Path) -> None:
    fig.savefig(path, dpi=_DPI, bbox_inches="tight")
    _pyplot().close(fig)


def time_unit(values: Sequence[float]) -> tuple[float, str]:
    """(scale, unit) that shows ``values`` (seconds) in ms below a second, else in s."""
    return (1000.0, "ms") if max(values, default=0.0) < 1 else (1.0, "s")


def _legend_below(ax: Any, ncol: int = 3, handles: Sequence[Any] | None = None) -> None:
    """The legend under the axes, where it hides no point (the figure's constrained layout
    makes room for it)."""
    handles = handles if handles is not None else ax.get_legend_handles_labels()[0]
    ax.figure.legend(handles=handles, fontsize=7, loc="outside lower center", ncol=ncol, frameon=False)


def _y_range(ax: Any, shown: Sequence[float], *, strip: bool = True) -> None:
    """A y axis that shows every value, logarithmic where they span more than a factor of
    8 (a 30 ms config beside an 8 s one), with room at the top for the failures' strip."""
    low, high = min(shown), max(shown)
    if low > 0 and high / low > 8:
        from matplotlib.ticker import FuncFormatter

        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _: f"{y:g}"))
        ax.set_ylim(low / 1.3, high * (2.5 if strip else 1.3))
        return
    span = (high - low) or high * 0.1
    ax.set_ylim(low - 0.05 * span, high + (0.2 if strip else 0.05) * span)


def _integer_axis(axis: Any) -> None:
    from matplotlib.ticker import MaxNLocator

    axis.set_major_locator(MaxNLocator(integer=True))


def contributions(path: Path, changes: Sequence[Mapping[str, Any]], margin: float | None) -> bool:
    """Each change of the leader (``label``, ``contribution``, ``ci``, ``kept``, ``ground``,
    ``source``): a bar from 1 to its contribution (the objective without it over with it),
    its 90% interval, coloured kept or dropped, hatched where the time model predicted it
    rather than a leave-one-out arm measured it, labelled with its ground."""
    if not changes:
        return False
    plt = _pyplot()
    fig, ax = plt.subplots(layout="constrained", figsize=(_WIDTH_IN, 1.2 + 0.3 * len(changes)))
    ys = list(range(len(changes)))[::-1]
    figures = [c["contribution"] for c in changes if c["contribution"] is not None]
    highs = [c["ci"][1] for c in changes if c.get("ci")] + figures + [1 + (margin or 0)]
    lows = [c["ci"][0] for c in changes if c.get("ci")] + figures + [1.0]
    for y, c in zip(ys, changes):
        colour = KEPT if c["kept"] else DROPPED
        why = c["ground"] if len(c["ground"] or "") <= 36 else c["ground"][:34] + "..."
        note = f"{'kept' if c['kept'] else 'dropped'}: {why or '-'}"
        if c["contribution"] is None:
            ax.text(1.0, y, f"  {note} (no figure)", va="center", fontsize=8, color=colour)
            continue
        ax.barh(y, c["contribution"] - 1, left=1, height=0.6, color=colour, alpha=0.85,
                hatch="///" if c["source"] == "predicted" else None, edgecolor="white")
        if c.get("ci"):
            ax.errorbar(c["contribution"], y, xerr=[[c["contribution"] - c["ci"][0]], [c["ci"][1] - c["contribution"]]],
                        fmt="none", ecolor="black", capsize=3, lw=1)
        right = max(c["contribution"], (c.get("ci") or [0, 0])[1])
        ax.text(right, y, f"  {note}", va="center", fontsize=8)
    ax.axvline(1, color=BASELINE, lw=1)
    from matplotlib.patches import Patch

    handles = [Patch(facecolor=KEPT, label="kept"), Patch(facecolor=DROPPED, label="dropped"),
               Patch(facecolor="white", edgecolor=BASELINE, hatch="///", label="predicted (hatched)")]
    if margin:
        handles.append(ax.axvline(1 + margin, color=BASELINE, ls=":", lw=1, label=f"1 + practical margin {margin:.1%}"))
    _legend_below(ax, ncol=4, handles=handles)
    span = max(highs) - min(lows)
    ax.set_xlim(min(lows) - 0.05 * span, max(highs) + 0.75 * span)  # room for the labels on the right
    ax.set_yticks(ys, [c["label"] for c in changes], fontsize=9)
    ax.set_ylim(-0.7, len(changes) - 0.3)
    ax.set(xlabel="objective without the change / with it (> 1: it pays)",
           title="What each change of the leader buys (90% intervals)")
    _save(fig, path)
    return True


def best_so_far(path: Path, search: Sequence[TrialResult], baseline_s: float | None,
                promoted_s: float | None) -> bool:
    """Best step time so far against search trial number; each ok trial a dot, each failed
    trial a marker of its outcome along the top edge."""
    if not any(t.outcome is Outcome.OK for t in search):
        return False
    plt = _pyplot()
    times = [t.step_time_s for t in search if t.outcome is Outcome.OK]
    scale, unit = time_unit(times + [baseline_s or 0.0])
    fig, ax = plt.subplots(layout="constrained", figsize=(_WIDTH_IN, 3.6))
    best, xs, ys = math.inf, [], []
    for i, t in enumerate(search, 1):
        if t.outcome is Outcome.OK:
            best = min(best, t.step_time_s)
            ax.plot(i, t.step_time_s * scale, "o", color=OUTCOME_STYLE["ok"][0], alpha=0.35, ms=4)
        if best < math.inf:
            xs.append(i)
            ys.append(best * scale)
    ax.step(xs, ys, where="post", color=OUTCOME_STYLE["ok"][0], lw=2, label="best so far")
    if baseline_s:
        ax.axhline(baseline_s * scale, color=BASELINE, ls="--", lw=1, label=f"baseline {baseline_s * scale:.3g} {unit}")
    if promoted_s:
        ax.axhline(promoted_s * scale, color=PROMOTED, ls="-.", lw=1.2,
                   label=f"promoted {promoted_s * scale:.3g} {unit} (verified)")
    edge = ax.get_xaxis_transform()  # x in data, y in axes fraction
    for outcome in Outcome:
        failed = [i for i, t in enumerate(search, 1) if t.outcome is outcome and outcome is not Outcome.OK]
        if failed:
            colour, marker = OUTCOME_STYLE[outcome.value]
            ax.scatter(failed, [0.96] * len(failed), transform=edge, marker=marker, color=colour, s=36,
                       label=f"{outcome.value} ({len(failed)})", clip_on=False, zorder=3)
    ax.set_xlim(0.5, len(search) + 0.5)
    _y_range(ax, [x * scale for x in times + [baseline_s or min(times), promoted_s or min(times)]])
    _integer_axis(ax.xaxis)
    ax.set(xlabel="search trial", ylabel=f"step time ({unit})", title="Best step time so far")
    _legend_below(ax)
    _save(fig, path)
    return True


def time_vs_memory(path: Path, trials: Sequence[TrialResult], capacity_bytes: float | None,
                   baseline: tuple[float, float] | None, promoted: tuple[float, float] | None) -> bool:
    """Step time against peak memory of every trial that reached a step; OOMs (no step
    time, peak >= capacity) as right-pointing markers at the capacity line, along the top.
    ``baseline`` and ``promoted``: (peak bytes, step seconds), highlighted."""
    timed = [t for t in trials if t.step_time_s and t.peak_memory_bytes]
    ooms = [t for t in trials if t.outcome is Outcome.OOM]
    if not timed:
        return False
    plt = _pyplot()
    scale, unit = time_unit([t.step_time_s for t in timed])
    gib = 2.0**30
    fig, ax = plt.subplots(layout="constrained", figsize=(_WIDTH_IN, 3.6))
    for outcome in Outcome:
        pts = [(t.peak_memory_bytes / gib, t.step_time_s * scale) for t in timed if t.outcome is outcome]
        if pts:
            colour, marker = OUTCOME_STYLE[outcome.value]
            ax.scatter(*zip(*pts), color=colour, marker=marker, s=16, alpha=0.6, label=f"{outcome.value} ({len(pts)})")
    for point, colour, name in ((baseline, BASELINE, "baseline"), (promoted, PROMOTED, "promoted")):
        if point and point[0]:
            ax.scatter([point[0] / gib], [point[1] * scale], marker="*", s=220, color=colour, edgecolor="black",
                       zorder=4, label=name)
    if capacity_bytes:
        ax.axvline(capacity_bytes / gib, color=OUTCOME_STYLE["oom"][0], ls="--", lw=1,
                   label=f"capacity {capacity_bytes / gib:.3g} GiB")
        if ooms:  # censored: no step time, a peak of at least the capacity; drawn in the top strip
            edge = ax.get_xaxis_transform()
            ax.scatter([capacity_bytes / gib], [0.94], transform=edge, marker=">", color=OUTCOME_STYLE["oom"][0],
                       s=60, zorder=3, label=f"oom ({len(ooms)}): peak >= capacity, no step time")
            ax.text(capacity_bytes / gib, 0.94, f"{len(ooms)} OOM  ", transform=edge, ha="right", va="center",
                    fontsize=8, color=OUTCOME_STYLE["oom"][0])
        ax.set_xlim(0, max([capacity_bytes / gib * 1.08] + [t.peak_memory_bytes / gib * 1.05 for t in timed]))
    _y_range(ax, [t.step_time_s * scale for t in timed] + [p[1] * scale for p in (baseline, promoted) if p])
    ax.set(xlabel="peak memory (GiB)", ylabel=f"step time ({unit})", title="Step time against peak memory")
    _legend_below(ax)
    _save(fig, path)
    return True


def verification_picture(path: Path, verdicts: Sequence[Verdict], rounds: Sequence[Mapping[str, Any]],
                 margin: float | None) -> bool:
    """Each arm's ratio to the baseline run of its round (> 1: faster), round by round, and
    its final interval at the right; the line that a lower bound must clear."""
    arms = [v for v in verdicts if v.baseline_times_s and v.candidate_times_s]
    if not arms:
        return False
    plt = _pyplot()
    fig, ax = plt.subplots(layout="constrained", figsize=(_WIDTH_IN, 3.6))
    round_of = {r.get("baseline"): i for i, r in enumerate(rounds, 1)}
    last, shown = 0, []
    colours = plt.get_cmap("tab10").colors
    for k, v in enumerate(arms):
        steps = v.job_steps
        starts_b = list(v.baseline_startups_s) or [None] * len(v.baseline_times_s)
        starts_c = list(v.candidate_startups_s) or [None] * len(v.candidate_times_s)
        ratios = [job_time_s(b, sb, steps) / job_time_s(c, sc, steps)
                  for b, c, sb, sc in zip(v.baseline_times_s, v.candidate_times_s, starts_b, starts_c)]
        shown += ratios
        xs = [round_of.get(p[0], i) for i, p in enumerate(v.pairs[:len(ratios)], 1)]
        last = max([last, *xs])
        colour = PROMOTED if v.promoted else colours[(k + 1) % len(colours)]
        # an arm's name lists the changes it leaves out: wrapped, so the legend stays the picture's width
        name = textwrap.fill((v.arm or f"arm {k + 1}") + (" (promoted)" if v.promoted else ""), 90)
        ax.plot(xs, ratios, "o-", color=colour, lw=2.2 if v.promoted else 1, ms=4, label=name,
                alpha=1 if v.promoted else 0.75)
    for k, v in enumerate(arms):
        if v.ci_low is not None and v.speedup is not None:
            colour = PROMOTED if v.promoted else colours[(k + 1) % len(colours)]
            x = last + 0.5 + 0.15 * k
            shown += [v.ci_low, v.ci_high]
            ax.errorbar(x, v.speedup, yerr=[[v.speedup - v.ci_low], [max(v.ci_high - v.speedup, 0)]],
                        fmt="s", color=colour, capsize=3, ms=4)
    ax.axhline(1, color=BASELINE, lw=1)
    if margin:
        ax.axhline(1 + margin, color=BASELINE, ls=":", lw=1, label=f"1 + practical margin {margin:.1%}")
    _y_range(ax, [*shown, 1.0], strip=False)
    _integer_axis(ax.xaxis)
    ax.set(xlabel="round (squares: each arm's final 90% interval)", ylabel="baseline / arm (> 1: faster)",
           title="Verification: each arm against the baseline, round by round")
    _legend_below(ax, ncol=1 if any(len(v.arm or "") > 30 for v in arms) else 2)
    _save(fig, path)
    return True


def learned(path: Path, effects: Sequence[Mapping[str, Any]], baseline: Mapping[str, Any],
            promoted: Mapping[str, Any] | None) -> bool:
    """A forest plot of the fitted models: each knob setting's effect on step time (x the
    baseline's, log axis) and its memory price (GiB against the baseline's peak), with 90%
    intervals; the promoted config's settings in green."""
    rows = [e for e in effects if e.get("log_time_effect") is not None and e.get("log_time_sd") is not None]
    if not rows:
        return False
    plt = _pyplot()
    fig, (left, right) = plt.subplots(1, 2, sharey=True, layout="constrained",
                                      figsize=(_WIDTH_IN * 1.5, 0.9 + 0.24 * len(rows)))
    ys = list(range(len(rows)))[::-1]
    gib = 2.0**30
    base = next((b for b in map(_model_baseline_bytes, rows) if b), None)
    for y, e in zip(ys, rows):
        on = promoted is not None and promoted.get(e["knob"]) == e["value"]
        colour = PROMOTED if on else "#1f77b4"
        factor, lo, hi = log_interval(e["log_time_effect"], e["log_time_sd"])
        left.errorbar(factor, y, xerr=[[factor - lo], [hi - factor]], fmt="o", color=colour, ms=4, capsize=2, lw=1)
        if base is not None and e.get("log_memory_sd") is not None:
            # bytes against the model's baseline peak: peak x (factor - 1)
            factor, lo, hi = (base * (x - 1) / gib for x in log_interval(e["log_memory_effect"], e["log_memory_sd"]))
            right.errorbar(factor, y, xerr=[[factor - lo], [hi - factor]], fmt="o", color=colour, ms=4, capsize=2,
                           lw=1)
    left.axvline(1, color=BASELINE, lw=1)
    left.set_xscale("log")
    from matplotlib.ticker import FuncFormatter, LogLocator

    left.xaxis.set_major_locator(LogLocator(base=10, subs=(0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.2, 1.5, 2.0, 3.0)))
    left.xaxis.set_minor_locator(LogLocator(base=10, subs=()))
    left.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:.2g}"))
    right.axvline(0, color=BASELINE, lw=1)
    left.set_yticks(ys, [fmt_change(e["knob"], baseline.get(e["knob"]), e["value"]) for e in rows], fontsize=8)
    left.set_ylim(-0.7, len(rows) - 0.3)
    left.set(xlabel="step time effect (x baseline, log scale)", title="Fitted time effect")
    right.set(xlabel="memory price (GiB against the baseline's peak)", title="Fitted memory price")
    fig.suptitle("What the search learned (90% intervals; green: in the promoted config)", fontsize=10)
    _save(fig, path)
    return True


def _model_baseline_bytes(e: Mapping[str, Any]) -> float | None:
    """The memory model's baseline peak, which ``bytes_vs_baseline`` is priced against
    (``bytes = peak x (exp(log effect) - 1)``); None for a setting that moves no memory."""
    if e.get("bytes_vs_baseline") is None or abs(math.expm1(e.get("log_memory_effect") or 0.0)) < 1e-9:
        return None
    return e["bytes_vs_baseline"] / math.expm1(e["log_memory_effect"])


def median_or_none(xs: Sequence[float]) -> float | None:
    return statistics.median(xs) if xs else None


# The pictures in the order the report shows them, with what each says.
CAPTIONS = {
    "contributions": ("What each change buys",
                      "Each change of the verified leader, kept (green) and dropped (grey): the objective without it "
                      "over with it (> 1: it pays), measured by leaving it out or predicted by the time model, "
                      "with the ground it was kept or dropped on."),
    "best_so_far": ("Search progress",
                    "Best step time after each search trial; dots: ok trials; markers along the top: failed trials "
                    "by outcome."),
    "time_vs_memory": ("Time against memory",
                       "Search trials that ran a step, baseline and promoted starred; an OOM has no step time and a "
                       "peak of at least the capacity: drawn at the capacity line."),
    "verification": ("Verification",
                     "Each arm's run over the baseline run of its round; squares: each arm's final 90% interval. "
                     "An arm is promoted when its lower bound clears the dotted line."),
    "learned": ("What the search learned",
                "The engine's time and memory models, fitted on every run the search saw, doctor's included "
                "(search.json): each knob setting against its knob's baseline value."),
}


def draw(plots_dir: Path, *, search: Sequence[TrialResult], runs: Sequence[TrialResult], doctor: DoctorReport | None,
         verification: VerificationReport | None, effects: Sequence[Mapping], capacity_bytes: float, baseline: Mapping,
         contributions_rows: Sequence[Mapping]) -> tuple[list[Picture], list[str]]:
    """Every picture the records allow, under ``plots_dir``; the pictures drawn, and for
    each one that could not be, why. A picture not drawn this time is removed, so the
    folder never shows one from an earlier state."""
    plots_dir.mkdir(exist_ok=True)
    verdicts = verification.verdicts if verification else ()
    margin = verification.margin if verification else None  # what a lower bound had to clear, over 1
    promoted = verification.promoted if verification else None
    peaks = {t.trial_id: t.peak_memory_bytes for t in runs}
    promoted_peaks = [peaks[c] for _, c in (promoted.pairs if promoted else ()) if peaks.get(c)]
    promoted_s = median_or_none(promoted.candidate_times_s if promoted else ())
    baseline_s = doctor.step_time_s if doctor else None
    jobs = {
        "contributions": (lambda p: contributions(p, contributions_rows, margin),
                          "minimization has not run (no minimize.json), or nothing was promoted"),
        "best_so_far": (lambda p: best_so_far(p, search, baseline_s, promoted_s), "no search trial finished ok"),
        "time_vs_memory": (lambda p: time_vs_memory(
            p, search, capacity_bytes, (doctor.peak_memory_bytes, baseline_s) if doctor else None,
            (median_or_none(promoted_peaks), promoted_s) if promoted_peaks and promoted_s else None),
            "no search trial recorded both a step time and a peak memory"),
        "verification": (lambda p: verification_picture(p, verdicts, verification.rounds if verification else (),
                                                         margin), "nothing was verified"),
        "learned": (lambda p: learned(p, effects, baseline, promoted.config if promoted else None),
                    "the search recorded no fitted model (only the engine proposer fits one)"),
    }
    drawn, missing = [], []
    for name, (job, why) in jobs.items():
        path = plots_dir / f"{name}.png"
        if job(path):
            drawn.append(Picture(f"{plots_dir.name}/{path.name}", *CAPTIONS[name], wide=name == "learned"))
        else:
            path.unlink(missing_ok=True)
            missing.append(f"{CAPTIONS[name][0]}: not drawn, {why}.")
    return drawn, missing
