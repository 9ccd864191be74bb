"""What the LLM adapter (``adapters.llm``) asks: the system and user messages of the
priors question and of the patch question."""

from __future__ import annotations

import json
from typing import Mapping, Sequence

from infrarsi.core.knobs import KnobSpace, Value

_PRIORS_SYSTEM = (
    "You are an expert in the performance of LLM training on GPU clusters. For each knob "
    "setting listed, estimate how switching that one knob from the baseline's value to this "
    "value (all other knobs at baseline) changes the training step time and the peak device "
    "memory, as multipliers: 0.8 means 20% less, 1.0 no change, 1.5 50% more. Give a "
    "confidence from 0 (a guess) to 1 (certain) and a one-sentence rationale. Answer only "
    "for the listed settings, with knob names and values written exactly as listed."
)


def render_value(value: Value) -> str:
    return json.dumps(value) if isinstance(value, bool) else str(value)


def priors_messages(space: KnobSpace, baseline: Mapping[str, Value], workload_description: str,
                     hardware_description: str) -> list[dict[str, str]]:
    knob_lines = [
        f"- {k.name}: values {', '.join(render_value(v) for v in k.values)}; baseline {render_value(baseline[k.name])}"
        + (f" ({k.description})" if k.description else "")
        for k in space.knobs
    ]
    settings = [f"- {k.name} = {render_value(v)}" for k in space.knobs for v in k.values if v != baseline[k.name]]
    constraints = [f"- {c.expr}" for c in space.constraints] or ["- none"]
    user = "\n".join([
        f"Workload: {workload_description}", f"Hardware: {hardware_description}",
        "Knobs:", *knob_lines, "Constraints between knobs:", *constraints,
        "Settings to estimate:", *settings,
    ])
    return [{"role": "system", "content": _PRIORS_SYSTEM}, {"role": "user", "content": user}]


_PATCH_SYSTEM = (
    "You propose one code change that makes an LLM training job faster or lighter in device "
    "memory without changing what it computes: same model, data, seed and loss trajectory "
    "within noise. Change only files inside the editable scope. Reply with a unified diff "
    "that `git apply -p1` accepts in the folder of the files shown (their paths as shown, with "
    "a/ and b/ prefixes), the files it "
    "touches, its expected effect on step time and peak memory as multipliers (0.9 = 10% "
    "less), and the preconditions under which it is correct."
)


def patch_messages(task_description: str, files: Mapping[str, str],
                    editable_scope: Sequence[str]) -> list[dict[str, str]]:
    shown = [f"--- {path}\n```\n{content}\n```" for path, content in files.items()]
    user = "\n".join([
        f"Task: {task_description}",
        f"Editable scope (path globs): {', '.join(editable_scope)}",
        "Files:", *shown,
    ])
    return [{"role": "system", "content": _PATCH_SYSTEM}, {"role": "user", "content": user}]
