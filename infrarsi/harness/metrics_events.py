"""The events a trial reported, each with the harness's arrival stamp, checked as they come.

Both ways in (JSON lines through ``$INFRARSI_METRICS_FILE`` and the log adapter) end
here. A step event needs a finite ``loss`` and, when it carries a ``step``, a counter that
increases, and its optional fields must have their types (``tokens`` and
``peak_memory_bytes`` integers, ``step_time_s`` a number, ``phases`` seconds by name); an
eval event needs a finite ``eval_loss``; a start event's ``tokens_per_step`` and
``seq_len`` are integers. An event with a problem is not recorded; the problem is, with
where it came from, so the trial's reason can name the line and the spec field.
"""

from __future__ import annotations

import json
import math
import threading
from dataclasses import dataclass, field
from typing import Any

from infrarsi.core.trial import Outcome, TrialResult

NUM_MALFORMED_KEPT = 5
PROTOCOL_HINT = (
    "infrarsi reads a job's steps through the metrics protocol (docs/metrics-protocol.md): either the job "
    "writes JSON lines to the file named by $INFRARSI_METRICS_FILE (infrarsi.job.reporter.Reporter, or the callbacks "
    "infrarsi.job.hf / infrarsi.job.lightning), or the spec's [metrics] section sets "
    "source = \"log\" and a step_pattern, and the log adapter reads the job's own output")


@dataclass
class RecordedEvents:
    events: list[dict[str, Any]] = field(default_factory=list)
    arrivals: list[float] = field(default_factory=list)  # monotonic instant each event's line arrived
    problems: list[str] = field(default_factory=list)
    malformed: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    _last_step: int | None = None

    def add(self, event: dict[str, Any], stamp: float, origin: str) -> None:
        """Record ``event`` (arrived at ``stamp``); ``origin`` says where it came from
        (e.g. "metrics.step_pattern, line '...'"), for the problem message."""
        problem = self._problem(event)
        if problem:  # kept as the problem, not as an event: nothing downstream reads a bad value
            self.problems.append(f"{problem} ({origin})")
            return
        self.events.append(event)
        self.arrivals.append(stamp)

    def add_json_line(self, line: str, stamp: float, origin: str) -> None:
        try:
            event = json.loads(line)
            if not isinstance(event, dict):
                raise ValueError("not an object")
        except ValueError:
            if len(self.malformed) < NUM_MALFORMED_KEPT:
                self.malformed.append(line[:200])
            return
        self.add(event, stamp, origin)

    def _problem(self, event: dict[str, Any]) -> str | None:
        kind = event.get("event")
        if kind == "step":
            if "loss" not in event:
                return "a step event has no loss"
            if not _finite(event["loss"]):
                return f"the loss {event['loss']!r} is not a finite number"
            wrong = _wrong_optional_fields(event)
            if wrong:
                return wrong
            step = event.get("step")
            if step is None:
                return None
            if isinstance(step, bool) or not isinstance(step, int):
                return f"the step counter {step!r} is not an integer"
            last, self._last_step = self._last_step, step
            if last is not None and step <= last:
                return f"the step counter went from {last} to {step}; it must increase with every optimizer step"
        elif kind == "eval" and not _finite(event.get("eval_loss")):
            return f"the eval_loss {event.get('eval_loss')!r} is not a finite number"
        elif kind == "start":
            return _wrong_optional_fields(event, ("tokens_per_step", "seq_len"))
        return None

    def steps(self) -> list[tuple[dict[str, Any], float]]:
        return [(e, t) for e, t in zip(self.events, self.arrivals) if e.get("event") == "step"]

    def start(self) -> dict[str, Any]:
        """Every start event merged (the log adapter may emit a declared one, then one from the log)."""
        merged: dict[str, Any] = {}
        for e in self.events:
            if e.get("event") == "start":
                merged.update(e)
        return merged


def _wrong_optional_fields(event: dict[str, Any], integers=("tokens", "peak_memory_bytes")) -> str | None:
    for name in integers:
        if name in event and (isinstance(event[name], bool) or not isinstance(event[name], int)):
            return f"{name} {event[name]!r} is not an integer"
    if "step_time_s" in event and not _finite(event["step_time_s"]):
        return f"step_time_s {event['step_time_s']!r} is not a finite number"
    if "loss_quantum" in event and not (_finite(event["loss_quantum"]) and event["loss_quantum"] > 0):
        return f"loss_quantum {event['loss_quantum']!r} is not a positive number (the unit of the loss's last digit)"
    phases = event.get("phases")
    if phases is not None and not (isinstance(phases, dict) and all(_finite(v) for v in phases.values())):
        return f"phases {phases!r:.100} is not a mapping of phase names to seconds"
    return None


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


# What to do about a baseline that failed in doctor, by outcome: only an OOM is about memory
# and only a timeout about time.
_BASELINE_ADVICE = {
    Outcome.OOM: "Raise device.memory_capacity, or start from a baseline config that fits",
    Outcome.TIMEOUT: "Raise budget.trial_timeout_s, or lower contract.num_steps so that a trial ends sooner",
    Outcome.INVALID: "The job refused the baseline config: set the baseline to what the job runs today",
    Outcome.CONTRACT_VIOLATION: "The baseline itself breaks the contract: make [contract] say what the job trains "
                                "(and contract.locked name no file the job writes)",
    Outcome.CRASH: "The job failed (the reason ends with its last lines): fix the command or the baseline config "
                   "so that it runs as it does without infrarsi",
}


def explain_baseline_failure(result: TrialResult) -> str:
    """What doctor says when the baseline fails, with advice that fits the cause: a run that
    reported no step is about the metrics protocol, a clean exit with unusable metrics
    (bad values, steps that arrived together) about what the job reports, and only an OOM
    or a timeout about memory or time limits."""
    where = f"({result.outcome.value}: {result.reason}); log: {result.log_path}"
    exited_cleanly = result.outcome is Outcome.CRASH and result.extra.get("returncode") == 0
    if result.extra.get("num_steps_reported") == 0 and (exited_cleanly or result.outcome is Outcome.TIMEOUT):
        tail = (" If the job is still starting up when the timeout ends it, raise budget.trial_timeout_s."
                if result.outcome is Outcome.TIMEOUT else "")
        return f"the baseline produced no metric lines in doctor {where}. {PROTOCOL_HINT}.{tail}"
    if exited_cleanly:
        advice = ("The job ran and exited 0, but what it reported cannot be measured (the reason says why); "
                  "docs/metrics-protocol.md, 'When the events are wrong', says what each event needs")
    else:
        advice = _BASELINE_ADVICE.get(result.outcome, _BASELINE_ADVICE[Outcome.CRASH])
    return f"the baseline config failed in doctor {where}. {advice}."
