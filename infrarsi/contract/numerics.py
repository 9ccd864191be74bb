"""Numerics classes: which knob settings keep the job's arithmetic and which change it.

A knob *keeps* the numerics when any of its values computes the same numbers up to
floating-point reordering (how the global batch is split into micro-batches, threads,
processes, the optimizer's implementation, the attention kernel, recompute). It *changes*
them when a value computes different numbers on purpose (precision). The numerics class
of a config is its settings of numerics-changing knobs that differ from the baseline's:
the empty class is the baseline's own numerics. A config is compared with a reference run
in its own class (see ``infrarsi.contract.loss_contract``), so the noise of bf16 never loosens the
check of an fp32 config.

A knob says which it is with ``numerics = "keeps" | "changes"`` in the spec; unset, its
kind (where the spec gives one) or its name decides: precision-like knobs change the
numerics, every other knob keeps them and is held to the near-exact tolerance.
"""

from __future__ import annotations

import re
from typing import Any, Iterable, Mapping

from infrarsi.backends import backend_of
from infrarsi.core.knobs import Config, KnobSpace, Value
from infrarsi.core.spec import CampaignSpec

KEEPS, CHANGES = "keeps", "changes"
# Kinds and names whose values compute different numbers by design. Compile and fused
# kernels only reorder reductions (far below the near-exact tolerance in fp32); a spec
# whose compiled or fused path does change the numerics declares it.
_CHANGING_KINDS = frozenset({"precision", "dtype", "quantization"})
_CHANGING_NAME = re.compile(r"precision|dtype|\bamp\b|_amp\b|^amp|fp8|fp16|bf16|mixed|quant", re.IGNORECASE)

NumericsClass = tuple[tuple[str, Value], ...]  # sorted (knob, value) pairs; () = the baseline's numerics


def default_numerics(name: str, kind: str | None = None) -> str:
    """``changes`` for precision-like knobs (by kind where given, else by name), else ``keeps``."""
    if kind:
        return CHANGES if kind.lower() in _CHANGING_KINDS else KEEPS
    return CHANGES if _CHANGING_NAME.search(name) else KEEPS


def changing_knobs(knob_specs: Mapping[str, Any]) -> tuple[str, ...]:
    """Names of the spec's knobs that change the numerics (declared, or by default)."""
    out = []
    for name, spec in knob_specs.items():
        declared = getattr(spec, "numerics", None)
        if (declared or default_numerics(name, getattr(spec, "kind", None))) == CHANGES:
            out.append(name)
    return tuple(out)


def campaign_changing_knobs(spec: CampaignSpec) -> tuple[str, ...]:
    """The knobs that change a campaign's numerics: none where its backend runs no code
    (the simulator computes no losses to compare)."""
    return changing_knobs(spec.knobs) if backend_of(spec).runs_code else ()


def class_of(config: Mapping[str, Value], baseline: Mapping[str, Value], knobs: Iterable[str]) -> NumericsClass:
    """The settings of ``knobs`` where ``config`` leaves the baseline's numerics."""
    return tuple(sorted((k, config[k]) for k in knobs if k in config and config[k] != baseline.get(k)))


def describe(cls: NumericsClass) -> str:
    return ", ".join(f"{k}={v}" for k, v in cls) if cls else "the baseline's numerics"


def feasible_classes(space: KnobSpace, baseline: Config, knobs: Iterable[str]) -> list[NumericsClass]:
    """Every numerics class some feasible config of ``space`` falls in, the baseline's first."""
    knobs = [k for k in knobs if k in space.names]
    if not knobs:
        return [()]
    cols = [space.names.index(k) for k in knobs]
    rows = {tuple(row) for row in space.feasible_index_matrix[:, cols].tolist()}
    classes = {class_of({k: space.knob(k).values[i] for k, i in zip(knobs, row)}, baseline, knobs) for row in rows}
    return sorted(classes, key=lambda c: (len(c), str(c)))


def class_config(baseline: Config, cls: NumericsClass) -> Config:
    """The baseline run in the numerics of ``cls``: its reference config."""
    return {**baseline, **dict(cls)}
