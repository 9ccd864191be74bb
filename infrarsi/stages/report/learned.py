"""What the search learned, as the report's evidence: the proposer's own account
(``search.json``'s ``describe``: fitted effects and memory prices, interactions, crash
evidence, prior revisions, pairing decisions) as tables and sentences a person reads.

The fitted per-setting effects are the engine's record (``describe["memory_prices"]``); the
report draws them (``plots.learned``) and tabulates them here without refitting any model.
A key this module does not know is still shown, spelled out by ``blocks.readable``.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Mapping, Sequence

from infrarsi.stages.report.blocks import config_diff, fmt_change, fmt_value, readable, table

Z90 = 1.6449  # a 90% two-sided interval from a normal sd


def log_interval(mean: float, sd: float) -> tuple[float, float, float]:
    """A log-scale effect as a factor with its 90% interval: (factor, low, high)."""
    return math.exp(mean), math.exp(mean - Z90 * sd), math.exp(mean + Z90 * sd)


def setting_effects(search: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Each knob setting's fitted time effect and memory price, as the search recorded them."""
    return list((search.get("describe") or {}).get("memory_prices") or [])


def _setting(knob: str, value: Any) -> str:
    return f"{knob}={fmt_value(value)}"


def _times(mean: float | None, sd: float | None) -> str:
    if mean is None or sd is None:
        return "-"
    return "x{:.3f} ({:.3f}-{:.3f})".format(*log_interval(mean, sd))


def _effects_table(rows: Sequence[Mapping[str, Any]], baseline: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [table(["setting", "step time, x baseline (90%)", "peak memory, x baseline (90%)", "memory price"],
                  ([fmt_change(r["knob"], baseline.get(r["knob"]), r["value"]),
                    _times(r.get("log_time_effect"), r.get("log_time_sd")),
                    _times(r.get("log_memory_effect"), r.get("log_memory_sd")),
                    "-" if r.get("bytes_vs_baseline") is None else f"{r['bytes_vs_baseline'] / 2**30:+,.2f} GiB"]
                   for r in rows))]


def _settings(pairs: Sequence[Sequence[Any]]) -> str:
    return " + ".join(_setting(k, v) for k, v in pairs)


def _interactions(rows: Sequence[Mapping[str, Any]], _: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [{"bullets": [f"{_settings(r['settings'])} together: step time x{math.exp(r['log_time_effect']):.3f} "
                         f"beyond their separate effects (log sd {r['sd']:.3f})" for r in rows]}]


def _crashes(rows: Sequence[Mapping[str, Any]], _: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [{"bullets": [f"{_settings(r['settings'])}: P(crash) {r['crash_probability']:.2f}, from "
                         f"{r['num_trials']} trial(s) ({', '.join(r.get('crashed_trials') or [])}; "
                         f"{', '.join(r.get('reasons') or [])})" for r in rows]}]


def _revisions(rows: Sequence[Mapping[str, Any]], _: Mapping[str, Any]) -> list[dict[str, Any]]:
    flagged = [r for r in rows if r.get("miscalibrated")]
    if not flagged:
        return [{"text": f"No prior of the {len(rows)} settings was flagged miscalibrated: the fitted effects "
                         "landed where the priors expected."}]
    def side(r: Mapping[str, Any], what: str) -> str:
        d = r.get(what) or {}
        if d.get("prior_log_mean") is None:
            return "-"
        mark = " (miscalibrated)" if d.get("miscalibrated") else ""
        return f"prior x{math.exp(d['prior_log_mean']):.3f}, fitted x{math.exp(d['posterior_log_mean']):.3f}{mark}"
    return [table(["setting", "source", "step time", "peak memory"],
                  ([_setting(r["knob"], r["value"]), r.get("source", "-"), side(r, "time"), side(r, "memory")]
                   for r in flagged))]


def _pairings(rows: Sequence[Mapping[str, Any]], baseline: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [{"bullets": [f"predicted fastest `{config_diff(r['fast_config'], baseline)}` had P(fit) "
                         f"{r['fast_fit_probability']:.2f}: its memory-hungry setting "
                         f"{_setting(**r['hungry_setting'])} was paired with savers: "
                         f"`{config_diff(r['paired_config'], baseline)}`" for r in rows]}]


_KNOWN: dict[str, tuple[str, Callable[[Any, Mapping[str, Any]], list[dict[str, Any]]]]] = {
    "memory_prices": ("Fitted effects and memory prices", _effects_table),
    "time_interactions": ("Interactions the time model found", _interactions),
    "crash_evidence": ("Crash evidence", _crashes),
    "prior_revision": ("Priors against what was measured", _revisions),
    "pairing_decisions": ("Memory-hungry configs paired with savers", _pairings),
}
# Summarised elsewhere in the report (the best trial) or too fine-grained to read.
_SKIP = {"best_so_far", "trial_cost_effects"}


def learned_blocks(describe: Mapping[str, Any], baseline: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The proposer's account as report blocks; scalars as one line of bullets."""
    out: list[dict[str, Any]] = []
    scalars = []
    for key, value in describe.items():
        if key in _SKIP or value in (None, [], {}):
            continue
        if key in _KNOWN:
            title, render = _KNOWN[key]
            out += [{"heading": title}, *render(value, baseline)]
        elif isinstance(value, list) and all(isinstance(v, Mapping) for v in value):
            headers = list(dict.fromkeys(k for v in value for k in v))
            out += [{"heading": key.replace("_", " ").capitalize()},
                    table(headers, ([readable(v.get(h), baseline) for h in headers] for v in value))]
        else:
            scalars.append(f"{key.replace('_', ' ')}: {readable(value, baseline)}")
    return ([{"bullets": scalars}] if scalars else []) + out
