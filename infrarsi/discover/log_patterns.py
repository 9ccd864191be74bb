"""Guess the log adapter's regular expressions from a job's own output.

``infrarsi init`` runs the command once and hands its output here. Lines are grouped by
their shape (the text with every number blanked out); the most frequent shape that
carries a loss becomes ``step_pattern``, one that carries a validation/eval loss becomes
``eval_pattern``, and each line stating tokens per step or iteration a candidate
``tokens_pattern`` (``infrarsi init`` keeps one only where its number checks out). Each
pattern keeps the line's literal text up to the value it captures, so it reads like the
line it came from. The first step line's loss and the start-up lines that state a
parameter count are what a later run of the same command must print again.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

NUMBER = r"[-+0-9.eE]+"
_NUM = re.compile(r"[-+]?\d(?:[\d,]*\d)?(?:\.\d+)?(?:[eE][-+]?\d+)?")
_EVAL_WORDS = re.compile(r"\b(val|valid|validation|eval|test)", re.I)
_STEP_WORDS = ("iter", "step", "it", "global_step", "steps", "iteration")


@dataclass(frozen=True, kw_only=True)
class TokensLine:
    """A line that states tokens per step or iteration, and the regex that reads it."""

    line: str
    pattern: str
    tokens: int


@dataclass(frozen=True, kw_only=True)
class GuessedPatterns:
    step_pattern: str | None = None
    eval_pattern: str | None = None
    tokens_lines: tuple[TokensLine, ...] = ()  # every line that states tokens per step
    step_example: str | None = None
    num_step_lines: int = 0
    first_loss: float | None = None  # the loss the first step line carries
    fact_lines: tuple[str, ...] = ()  # lines before the first step line that state a parameter count


def _shape(line: str) -> str:
    return _NUM.sub("#", line.strip())


_GROUP_TESTS = {
    "loss": lambda before: "loss" in before.lower() and not _EVAL_WORDS.search(before),
    "eval_loss": lambda before: "loss" in before.lower() and bool(_EVAL_WORDS.search(before)),
    "tokens": lambda before: True,
}


def _pattern(line: str, groups: tuple[str, ...]) -> str | None:
    """A regex for ``line`` up to its last captured number: each of ``groups`` captures the
    first number whose preceding text (since the previous number) fits it (``loss``: says
    loss; ``eval_loss``: says val/eval and loss); a first number after a step word becomes
    ``(?P<step>\\d+)``. None when a group finds no number."""
    line = line.strip()
    out, pos, captured, last_capture_end = [], 0, set(), 0
    for i, m in enumerate(_NUM.finditer(line)):
        before = line[pos:m.start()]
        out.append(re.escape(before))
        group = next((g for g in groups if g not in captured and _GROUP_TESTS[g](before)), None)
        words = re.findall(r"[A-Za-z_]+", before)
        if group is None and i == 0 and words and words[-1].lower() in _STEP_WORDS:
            group = "step"
        if group == "step":
            out.append(r"(?P<step>\d+)")
        elif group == "tokens":
            out.append(r"(?P<tokens>[\d,]+)")
        elif group:
            out.append(f"(?P<{group}>{NUMBER})")
        else:
            out.append(NUMBER)
        if group:
            captured.add(group)
            last_capture_end = len(out)
        pos = m.end()
    if not set(groups) <= captured:
        return None
    return "".join(out[:last_capture_end]).replace(r"\ ", " ")


def guess_patterns(output: str) -> GuessedPatterns:
    """Patterns for the log adapter from one run's output (stdout and stderr together)."""
    lines = [ln for ln in output.splitlines() if ln.strip()]
    lossy = [ln for ln in lines if re.search(r"loss", ln, re.I) and _NUM.search(ln)]
    # An eval line has an eval word in the text just before a loss figure ("val loss 4.2");
    # a training line has a loss figure after text without one ("loss train: 5.7, val: n/a").
    evals = [ln for ln in lossy if _pattern(ln, ("eval_loss",))]
    train = [ln for ln in lossy if ln not in evals and _pattern(ln, ("loss",))]
    found: dict = {}
    shapes = Counter(_shape(ln) for ln in train)
    if shapes:
        shape, count = shapes.most_common(1)[0]
        example = next(ln for ln in train if _shape(ln) == shape)
        found.update(step_pattern=_pattern(example, ("loss",)), step_example=example.strip(),
                     num_step_lines=count)
    if evals:
        found["eval_pattern"] = _pattern(evals[0], ("eval_loss",))
    for ln in lines:
        if re.search(r"tokens?\b.*\b(per|/)\s*(iter|step|batch)", ln, re.I) and _NUM.search(ln):
            pattern = _pattern(ln, ("tokens",))
            m = re.search(pattern, ln) if pattern else None
            if m:
                found.setdefault("tokens_lines", []).append(
                    TokensLine(line=ln.strip(), pattern=pattern, tokens=int(m["tokens"].replace(",", ""))))
    found["tokens_lines"] = tuple(found.get("tokens_lines", ()))
    if found.get("step_pattern"):
        first = next((i for i, ln in enumerate(lines) if re.search(found["step_pattern"], ln)), None)
        if first is not None:
            found["first_loss"] = float(re.search(found["step_pattern"], lines[first])["loss"])
            found["fact_lines"] = tuple(ln.strip() for ln in lines[:first]
                                        if re.search(r"param", ln, re.I) and _NUM.search(ln))
    return GuessedPatterns(**found)
