"""Everything a trial's job writes, as it arrives.

Its stdout and stderr are teed to the trial's log.txt; its metrics events come from the
FIFO named by ``$INFRARSI_METRICS_FILE`` (JSON lines) or, with ``[metrics] source = "log"``,
from its own output lines through the log adapter. Each event carries the instant its
line arrived (``stamped_reader``).
"""

from __future__ import annotations

import subprocess
import threading
from pathlib import Path
from typing import BinaryIO

from infrarsi.core.spec_metrics import MetricsSpec
from infrarsi.harness.log_adapter import LogAdapter, MetricsLineError
from infrarsi.harness.metrics_events import RecordedEvents
from infrarsi.harness.stamped_reader import StampedReaders
from infrarsi.job.reporter import METRICS_FILE_ENV


class JobOutput:
    """Everything the job writes, as it arrives: its output teed to log.txt, its metrics
    events (from the FIFO, or from its output through the log adapter) stamped on arrival."""

    def __init__(self, metrics: MetricsSpec, log: BinaryIO, fifo_path: Path, *, name: str) -> None:
        self.metrics, self.log, self.name = metrics, log, name
        self.recorded = RecordedEvents()
        self.adapter = LogAdapter(metrics) if metrics.source == "log" else None
        self.readers = StampedReaders()
        self._log_lock = threading.Lock()
        self._num_json_lines = 0
        if self.adapter is None:
            self.readers.add_fifo(fifo_path, self._on_json_line, name=f"{name}-metrics")

    def attach(self, proc: subprocess.Popen, launched_at: float) -> None:
        """Read ``proc``'s stdout and stderr (pipes) from now on."""
        for e in self.adapter.initial_events() if self.adapter else []:
            self.recorded.add(e, launched_at, "metrics.tokens_per_step")
        for stream, pipe in (("stdout", proc.stdout), ("stderr", proc.stderr)):
            wanted = self.adapter is not None and self.metrics.stream in (stream, "both")
            self.readers.add(pipe.fileno(), self._on_log_line if wanted else _ignore, tee=self._tee,
                             name=f"{self.name}-{stream}")

    def _tee(self, chunk: bytes) -> None:
        with self._log_lock:
            self.log.write(chunk)
            self.log.flush()

    def _on_json_line(self, line: str, stamp: float) -> None:
        with self.recorded.lock:
            self._num_json_lines += 1
            self.recorded.add_json_line(line, stamp, f"line {self._num_json_lines} of ${METRICS_FILE_ENV}")

    def _on_log_line(self, line: str, stamp: float) -> None:
        assert self.adapter is not None
        with self.recorded.lock:
            try:
                events = self.adapter.feed(line)
            except MetricsLineError as exc:
                self.recorded.problems.append(str(exc))
                return
            for e in events:
                field_name = {"step": "step_pattern", "eval": "eval_pattern"}.get(e["event"], "tokens_pattern")
                self.recorded.add(e, stamp, f"metrics.{field_name}, line {line[:200]!r}")

    def no_steps_reason(self) -> str:
        if self.adapter is not None:
            streams = {"both": "stdout or stderr"}.get(self.metrics.stream, self.metrics.stream)
            return self.adapter.no_steps_reason(streams)
        if not self.recorded.events:
            return (f"no metrics line arrived through ${METRICS_FILE_ENV}: the job does not speak the metrics "
                    "protocol (use infrarsi.job.reporter or a framework callback), or set [metrics] source = 'log' "
                    "to read its own output with the log adapter")
        return "it reported no step event"


def _ignore(line: str, stamp: float) -> None:
    pass
