"""The log adapter: read a job's progress from its own output, with no change to the job.

``[metrics] source = "log"`` in the spec names regular expressions for the lines the job
already prints (one per optimizer step, optionally an evaluation line and a start-up line
stating the tokens per step). Each matching line becomes the same event the JSON-lines
protocol carries; the harness stamps it with its own clock when the line arrives.
"""

from __future__ import annotations

import collections
import re
import statistics
from typing import Any

from infrarsi.core.errors import InfrarsiError
from infrarsi.core.spec_metrics import MetricsSpec

NUM_LINES_SHOWN = 8


class MetricsLineError(InfrarsiError):
    """A line matched a metrics pattern but does not make a valid event."""


class LogAdapter:
    """Turns output lines into metrics events, following one ``MetricsSpec``.

    Not thread-safe: the caller serialises ``feed`` (the launcher holds one lock for both streams).
    """

    def __init__(self, spec: MetricsSpec) -> None:
        assert spec.source == "log" and spec.step_pattern is not None, "a log adapter needs source = 'log'"
        self.spec = spec
        self._step = re.compile(spec.step_pattern)
        self._eval = re.compile(spec.eval_pattern) if spec.eval_pattern else None
        self._tokens_line = re.compile(spec.tokens_pattern) if spec.tokens_pattern else None
        self._tokens: int | None = spec.tokens_per_step
        self.num_lines = 0
        self.num_steps = 0
        self.last_lines: collections.deque[str] = collections.deque(maxlen=NUM_LINES_SHOWN)

    def initial_events(self) -> list[dict[str, Any]]:
        """Events known before the job prints anything: a declared tokens per step."""
        if self.spec.tokens_per_step is None:
            return []
        return [{"event": "start", "tokens_per_step": self.spec.tokens_per_step, "tokens_source": "declared"}]

    def feed(self, line: str) -> list[dict[str, Any]]:
        """The events ``line`` carries (usually none). Raises ``MetricsLineError`` naming the
        spec field whose pattern matched a line it cannot turn into an event."""
        self.num_lines += 1
        self.last_lines.append(line)
        events = []
        if self._tokens_line is not None and self._tokens is None:
            m = self._tokens_line.search(line)
            if m:
                self._tokens = _int(m, "tokens", "metrics.tokens_pattern", line)
                events.append({"event": "start", "tokens_per_step": self._tokens, "tokens_source": "log"})
        m = self._step.search(line)
        if m:
            events.append(self._step_event(m, line))
        elif self._eval is not None and (m := self._eval.search(line)):
            event: dict[str, Any] = {"event": "eval", "eval_loss": _float(m, "eval_loss", "metrics.eval_pattern", line),
                                     "eval_loss_quantum": printed_quantum(_text(m, "eval_loss"))}
            event["step"] = (_int(m, "step", "metrics.eval_pattern", line) if m.groupdict().get("step") is not None
                             else self.num_steps)
            events.append(event)
        return events

    def _step_event(self, m: re.Match, line: str) -> dict[str, Any]:
        where = "metrics.step_pattern"
        groups = m.groupdict()
        self.num_steps += 1
        step = _int(m, "step", where, line) if groups.get("step") is not None else self.num_steps
        event: dict[str, Any] = {"event": "step", "step": step, "loss": _float(m, "loss", where, line),
                                 "loss_quantum": printed_quantum(_text(m, "loss"))}
        if groups.get("tokens") is not None:
            event["tokens"] = _int(m, "tokens", where, line)
        elif self._tokens is not None:
            event["tokens"] = self._tokens
        if groups.get("step_time_s") is not None:
            event["step_time_s"] = _float(m, "step_time_s", where, line)
        return event

    def no_steps_reason(self, stream_name: str) -> str:
        """Why a run produced no step event, with the job's own last lines as evidence."""
        stream = f"metrics.stream = {self.spec.stream!r}"
        if not self.num_lines:
            return (f"the job wrote nothing to {stream_name} ({stream}); if it logs to the other stream, "
                    "set metrics.stream")
        shown = "\n".join(f"    {ln[:200]}" for ln in self.last_lines)
        return (f"metrics.step_pattern {self.spec.step_pattern!r} matched none of the {self.num_lines} lines the "
                f"job wrote to {stream_name} ({stream}); fix the pattern (it is searched in each line, "
                f"Python re syntax) or the stream. The job's last lines were:\n{shown}")


def printed_quantum(printed: str) -> float:
    """One unit of the last digit a number was printed with: 0.001 for '5.158', 1e-05 for
    '5.15e-03', 1.0 for '5'. A loss printed so cannot show a change smaller than this."""
    mantissa, _, exponent = printed.strip().lower().partition("e")
    decimals = len(mantissa.partition(".")[2])
    shift = int(exponent) if exponent.lstrip("+-").isdigit() else 0
    return 10.0 ** (shift - decimals)


def printed_unit(units: list[float | None]) -> float | None:
    """The unit of the last digit a run printed its losses with: the median over its lines
    (a format that drops trailing zeros prints '5.15' for 5.150 now and then), None where
    it reported them at full precision."""
    found = [u for u in units if u is not None]
    return statistics.median(found) if found else None


def _text(m: re.Match, group: str) -> str:
    return m.group(group).strip().replace(",", "")


def _number(m: re.Match, group: str, where: str, line: str, kind: type = float) -> Any:
    try:
        return kind(_text(m, group))
    except ValueError:
        noun = "an integer" if kind is int else "a number"
        raise MetricsLineError(f"{where} matched the line {line[:200]!r}, but its group `{group}` captured "
                               f"{m.group(group)!r}, which is not {noun}; fix the pattern") from None


def _float(m: re.Match, group: str, where: str, line: str) -> float:
    return _number(m, group, where, line, float)


def _int(m: re.Match, group: str, where: str, line: str) -> int:
    return _number(m, group, where, line, int)
