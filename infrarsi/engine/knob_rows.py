"""How the built-in tables name a knob and spell its values, whatever the script calls them.

A knob's kind names its table row (``micro_batch``, ``checkpointing``, ...); a knob without
a kind is looked up by its own name (the simulator's ``tp``, ``zero``, ``fused_ce``).
Values are compared in one spelling: booleans and their string forms as ``on`` / ``off``,
strings in lower case.
"""

from __future__ import annotations

from infrarsi.core.knobs import Knob, Value

# grad_accum has no row: kept in a fixed product with the micro-batch, the split's effect
# is the micro-batch's.
_KIND_ROWS = {"micro_batch": "micro_batch", "precision": "precision", "compile": "compile", "threads": "threads",
              "processes": "nproc", "checkpointing": "checkpointing", "attention": "attention",
              "optimizer": "optimizer", "sharding": "zero", "bucket": "bucket_mb"}
# Rows of ZeRO-style stage knobs (stage 0 is a value, not an absent count).
STAGE_ROWS = ("zero", "zero_stage", "fsdp", "fsdp_stage")


def knob_row(knob: Knob) -> str | None:
    """The table row for ``knob``: by its kind when it has one, else by its name."""
    return knob.name if knob.kind is None else _KIND_ROWS.get(knob.kind)


def normalise(value: Value) -> Value:
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, str) and value.lower() in ("true", "yes", "1", "enabled"):
        return "on"
    if isinstance(value, str) and value.lower() in ("false", "no", "0", "disabled"):
        return "off"
    return value.lower() if isinstance(value, str) else value
