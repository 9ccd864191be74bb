"""The baseline is the user's command: doctor's first baseline run must print what the
command printed when ``infrarsi init`` ran it (``spec.reproduce``): the same first loss, the
same tokens per step, the same start-up lines about the model. A spec that renders the
command otherwise (a token moved, a value lost, a config file read after the overrides
instead of before) trains another job; this check stops the campaign before any search,
naming the first line that differs and where the rendered command departs from the typed
one. It catches rendering bugs of every kind, not only the ones known today.
"""

from __future__ import annotations

import difflib
import re
import shlex
from pathlib import Path

from infrarsi.core.spec import CampaignSpec
from infrarsi.core.trial import TrialResult

# Same command, same seed, same data: the first loss (before any update) may differ only by
# reduction order on a nondeterministic device, far below this.
FIRST_LOSS_RTOL = 1e-3
_NUMBER = re.compile(r"[-+]?\d[\d,.]*(?:[eE][-+]?\d+)?")


def differences(spec: CampaignSpec, run: TrialResult) -> list[str]:
    """What ``run`` (doctor's first baseline run) printed otherwise than the typed command did."""
    expected = spec.reproduce
    if expected is None:
        return []
    out = []
    if expected.first_loss is not None and run.losses:
        got = run.losses[0]
        if abs(got - expected.first_loss) > FIRST_LOSS_RTOL * max(abs(expected.first_loss), 1e-12):
            out.append(f"the first loss was {expected.first_loss:g} when you ran the command, {got:g} now")
    if expected.tokens_per_step is not None and run.tokens_per_step not in (None, expected.tokens_per_step):
        out.append(f"tokens per step were {expected.tokens_per_step:,} when you ran the command, "
                   f"{run.tokens_per_step:,} now")
    log = Path(run.log_path).read_text(errors="replace").splitlines() if run.log_path else []
    printed = {line.strip() for line in log}
    for line in expected.lines:
        if line not in printed:
            shape = _NUMBER.sub("#", line)
            now = next((p for p in printed if _NUMBER.sub("#", p) == shape), None)
            out.append(f"'{line}' was printed when you ran the command; now " + (f"'{now}'" if now else "it is missing"))
    return out


def explain(spec: CampaignSpec, rendered: tuple[str, ...], problems: list[str]) -> str:
    """One paragraph: what differs, and where the rendered command departs from the typed one."""
    typed = list(spec.reproduce.command) if spec.reproduce else []
    if typed and typed[0].rsplit("/", 1)[-1] == "env":  # `env NAME=value ... cmd`
        typed.pop(0)
    while typed and re.fullmatch(r"[A-Za-z_]\w*=.*", typed[0]):  # the environment prefix
        typed.pop(0)
    moved = []
    matcher = difflib.SequenceMatcher(a=typed, b=list(rendered), autojunk=False)
    fixed = {i for i, t in enumerate(spec.command) if re.search(r"\{(num_steps|last_step|seed|python)\}", t)}
    for op, a0, a1, b0, b1 in matcher.get_opcodes():
        if op != "equal" and not set(range(b0, b1)) <= fixed:
            moved.append(f"typed {shlex.join(typed[a0:a1]) or '(nothing)'} -> runs {shlex.join(rendered[b0:b1]) or '(nothing)'}")
    where = ("; the spec's command departs from the one you typed: " + "; ".join(moved[:4]) if moved else
             "; the spec's command renders as you typed it (but for the step count and seed), so the difference is "
             "in the environment or the files the job reads")
    return ("doctor's first baseline run does not reproduce what your command printed when `infrarsi init` ran it: "
            + "; ".join(problems) + where + ". The campaign would tune another job than yours: fix the spec's "
            "command (or env), or run `infrarsi init` again, then start the campaign again.")
