"""The report's building blocks, shared by its sections: a table block, a config as its
changes from the baseline, values, bytes and seconds as a reader wants them (never a
Python repr: a dict or a list is spelled out)."""

from __future__ import annotations

from typing import Any, Iterable, Mapping


def fmt_bytes(n: float | None) -> str:
    return "-" if n is None else f"{n / 2**20:,.0f} MiB"


def fmt_s(x: float | None) -> str:
    """A duration: milliseconds below a second (``312.5 ms``), seconds above (``7.10 s``)."""
    if x is None:
        return "-"
    return f"{x * 1000:.1f} ms" if abs(x) < 1 else f"{x:.2f} s"


def fmt_value(v: Any) -> str:
    """A knob value: on/off for a switch, four significant digits for a float."""
    if isinstance(v, bool):
        return "on" if v else "off"
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def fmt_change(knob: str, before: Any, after: Any) -> str:
    return f"{knob} {fmt_value(before)} -> {fmt_value(after)}"


def _baseline_value(baseline: Mapping[str, Any], knob: str) -> Any:
    # A patch knob added during the run is off in a baseline recorded before it existed.
    return baseline.get(knob, False if knob.startswith("patch_") else None)


def config_changes(config: Mapping[str, Any], baseline: Mapping[str, Any], sep: str = "") -> list[str]:
    """Each knob ``config`` sets differently from ``baseline``, as ``micro_batch 2 -> 4``
    (``micro_batch: 2 -> 4`` with ``sep=":"``)."""
    return [fmt_change(k + sep, _baseline_value(baseline, k), v) for k, v in config.items()
            if _baseline_value(baseline, k) != v]


def config_diff(config: Mapping[str, Any], baseline: Mapping[str, Any]) -> str:
    return ", ".join(config_changes(config, baseline)) or "(baseline)"


def fmt_config(config: Mapping[str, Any]) -> str:
    """A whole config (the baseline's own), as ``micro_batch 2, compile off, ...``."""
    return ", ".join(f"{k} {fmt_value(v)}" for k, v in config.items())


def readable(v: Any, baseline: Mapping[str, Any] | None = None) -> str:
    """Any JSON value as prose: a config as its changes from ``baseline``, another mapping
    as ``key value`` pairs, a (knob, value) pair as ``knob=value``, a list joined."""
    if isinstance(v, Mapping):
        if baseline and v and set(v) <= set(baseline) | {k for k in v if str(k).startswith("patch_")}:
            return config_diff(v, baseline)
        return "; ".join(f"{k} {readable(x, baseline)}" for k, x in v.items()) or "-"
    if isinstance(v, (list, tuple)):
        if len(v) == 2 and isinstance(v[0], str) and not isinstance(v[1], (list, tuple, Mapping)):
            return f"{v[0]}={fmt_value(v[1])}"
        return ", ".join(readable(x, baseline) for x in v) or "-"
    if v is None:
        return "-"
    return fmt_value(v)


def table(headers: list[str], rows: Iterable[Iterable[Any]], row_classes: Iterable[str] | None = None,
          fold: Iterable[str] = ()) -> dict[str, Any]:
    """A table block; ``row_classes`` (one per row) lets the HTML colour a row, e.g. by
    outcome; a long cell of a column named in ``fold`` (prose: a reason, a note) is folded
    in the HTML under its first words."""
    rows = [[str(c) for c in row] for row in rows]
    fold = set(fold)
    return {"table": {"headers": list(headers), "rows": rows, "fold": [h in fold for h in headers],
                      "row_classes": list(row_classes) if row_classes is not None else [""] * len(rows)}}


def details(summary: str, text: str) -> dict[str, Any]:
    """A long explanation, folded in the HTML under ``summary`` (the Markdown prints both)."""
    return {"details": {"summary": summary, "text": text}}
