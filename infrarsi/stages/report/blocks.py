"""The report's building blocks, shared by its sections: a table block, a config as its
changes from the baseline, bytes and seconds as a reader wants them."""

from __future__ import annotations

from typing import Any, Iterable


def fmt_bytes(n: float | None) -> str:
    return "-" if n is None else f"{n / 2**20:,.0f} MiB"


def fmt_s(x: float | None) -> str:
    return "-" if x is None else f"{x * 1000:.1f} ms"


def config_diff(config: dict, baseline: dict) -> str:
    # A patch knob added during the run is off in a baseline recorded before it existed.
    changed = [f"{k}={v}" for k, v in config.items() if baseline.get(k, False if k.startswith("patch_") else None) != v]
    return ", ".join(changed) or "(baseline)"


def table(headers: list[str], rows: Iterable[Iterable[Any]]) -> dict[str, Any]:
    return {"table": {"headers": list(headers), "rows": [[str(c) for c in row] for row in rows]}}
