"""``infrarsi init``'s knobs: which of a command's flags are launch knobs, of what kind,
and with which candidate values (splits of the same global batch, precision levels,
optimizer implementations of one algorithm, ...); one knob per kind."""

from __future__ import annotations

from typing import Any, Callable

from infrarsi.discover.command import Flag

# Flag names (lower case, dashes as underscores) that say what a flag is.
KIND_NAMES = {
    "micro_batch": ("batch_size", "micro_batch", "micro_batch_size", "per_device_train_batch_size",
                    "train_micro_batch_size_per_gpu", "mbs"),
    "grad_accum": ("gradient_accumulation_steps", "grad_accum", "grad_accum_steps", "accumulate_grad_batches",
                   "accum_steps", "gradient_accumulation"),
    "precision": ("dtype", "precision", "bf16", "fp16", "mixed_precision", "amp"),
    "compile": ("compile", "torch_compile", "use_compile"),
    "threads": ("threads", "num_threads", "intra_op_threads", "torch_threads"),
    "checkpointing": ("gradient_checkpointing", "activation_checkpointing", "checkpointing", "recompute"),
    "attention": ("attention", "attn_implementation", "attn"),
    "optimizer": ("optim", "optimizer"),
}
# Optimizer choices that run one algorithm with another implementation (kernel, loop): the
# only optimizer values offered, since another optimizer (sgd, lion, 8-bit states, ...)
# changes what is trained. A value in none of these families makes no knob.
SAME_ALGORITHM = (
    ("forloop", "foreach", "fused"),         # torch.optim implementations (the built-in trainer's --optimizer)
    ("adamw_torch", "adamw_torch_fused"),    # Hugging Face TrainingArguments --optim: torch's AdamW
)
_PRECISION_LEVELS = {"float32": "fp32", "fp32": "fp32", "32": "fp32", "32-true": "fp32", "bfloat16": "bf16",
                     "bf16": "bf16", "bf16-true": "bf16",
                     "bf16-mixed": "bf16", "float16": "fp16", "fp16": "fp16", "16-mixed": "fp16"}


def kind_of(name: str) -> str | None:
    return next((k for k, names in KIND_NAMES.items() if name in names), None)


def flag_argv(flag: Flag, value: Any) -> list[str]:
    text = str(value)
    if flag.style == "equals":
        return [f"{flag.spelled}={text}"]
    if flag.style == "switch":
        return [flag.spelled] if value else []
    return [flag.spelled, text]


def powers_of_two(limit: int) -> list[int]:
    return [2 ** i for i in range(limit.bit_length()) if 2 ** i <= limit]


def _precision_values(flag: Flag) -> tuple[list, dict]:
    if isinstance(flag.value, bool):  # --bf16 / --fp16 switches
        level = "fp16" if flag.key == "fp16" else "bf16"
        return [flag.value, not flag.value], {"false": "fp32", "true": level}
    value = str(flag.value)
    families = (["float32", "bfloat16"], ["fp32", "bf16"], ["32", "bf16-mixed"], ["32-true", "bf16-mixed"],
                ["no", "bf16"])
    family = next((f for f in families if value in f or (value in ("float16", "fp16", "16-mixed") and f[0] != "no")),
                  None)
    if family is None:
        return [], {}
    values = list(dict.fromkeys([value, *family]))
    return values, {v: _PRECISION_LEVELS[v] for v in values if v in _PRECISION_LEVELS and _PRECISION_LEVELS[v] != v}


def _candidates(flag: Flag, kind: str, cpus: int) -> tuple[list, dict]:
    """Candidate values (the command's first) and levels for a knob of ``kind``."""
    v = flag.value
    if kind == "optimizer":
        first = v if v is not None or not flag.choices else flag.choices[0]
        family = next((f for f in SAME_ALGORITHM if first in f), ())
        return [first, *(c for c in family if c != first and (not flag.choices or c in flag.choices))], {}
    if flag.choices:
        first = v if v in flag.choices else flag.choices[0]
        return [first, *(c for c in flag.choices if c != first)], {}
    if kind == "precision":
        return _precision_values(flag)
    if kind in ("compile", "checkpointing"):
        if isinstance(v, bool) or v is None:
            return [bool(v), not bool(v)], {}
        if str(v).lower() in ("on", "off"):
            return [v, "on" if v == "off" else "off"], {}
        return [], {}
    if kind == "threads" and isinstance(v, int):
        return list(dict.fromkeys([v, *powers_of_two(cpus)])), {}
    if kind == "attention" and v in ("eager", "sdpa"):
        return [v, "sdpa" if v == "eager" else "eager"], {"eager": "naive"}
    return [], {}


def one_knob_per_kind(flags: list[Flag], given: set[str], knob_of: Callable[[Flag], dict | None]
                      ) -> dict[str, Flag]:
    """Flags left out so that each kind has one knob: name -> the flag kept for its kind.

    Two knobs of one kind can select settings that exclude each other (``--bf16 True
    --fp16 True``, which the Hugging Face Trainer rejects) or be aliases of one setting
    (``--gradient_checkpointing`` and ``--activation_checkpointing``). The knob kept is a
    switch the command turns on, else the first of the command's flags then the parser's,
    with fp16 last: CPUs run it poorly if at all, and bf16 covers the same question.
    ``knob_of`` says whether a flag would be a knob at all."""
    groups: dict[str, list[Flag]] = {}
    for flag in flags:
        knob = knob_of(flag)
        kind = knob.get("kind") if knob else None
        if kind not in (None, "micro_batch", "grad_accum", "other"):
            groups.setdefault(kind, []).append(flag)
    left_out: dict[str, Flag] = {}
    for group in groups.values():
        keep = min(group, key=lambda f: (not (f.name in given and f.value is True), f.name not in given,
                                         f.key == "fp16"))
        left_out.update({f.name: keep for f in group if f is not keep})
    return left_out


def draft_knob(flag: Flag, product: int | None, style: str, cpus: int) -> dict[str, Any] | None:
    """The knob table for ``flag`` (its ``baseline`` included), or None when it is no knob:
    no known kind, fewer than two candidates, or a micro-batch without an accumulation flag."""
    kind = kind_of(flag.key)
    if kind in ("micro_batch", "grad_accum"):
        if product is None:
            return None
        # powers of two that divide the product, and the product itself (no accumulation)
        values = [m for m in powers_of_two(product) if product % m == 0] + [product]
        if kind == "grad_accum":
            values = sorted({product // m for m in values})
        values, levels = list(dict.fromkeys([flag.value, *values])), {}
    elif kind:
        values, levels = _candidates(flag, kind, cpus)
    else:
        return None
    if len(values) < 2:
        return None
    first = values[0]
    if all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        values = sorted(values)
    knob: dict[str, Any] = {"values": values, "flag": flag.spelled, "kind": kind, "baseline": first}
    if flag.style != style:
        knob["flag_style"] = flag.style
    if levels:
        knob["levels"] = levels
    return knob
