"""Report a training job's progress to infrarsi: one call per optimizer step.

Import-light on purpose (standard library only), so that any training script can use it
without pulling in infrarsi's orchestration stack::

    from infrarsi.job.reporter import Reporter

    rep = Reporter()
    rep.start(seq_len=256, tokens_per_step=8192)
    for step in range(num_steps):
        loss = train_one_step()
        rep.step(step, loss, tokens=8192)
    rep.end()

Events are JSON objects, one per line, appended and flushed to the file named by
``$INFRARSI_METRICS_FILE`` (set by the harness for every trial); without that variable
they go to stdout, so the script runs the same outside infrarsi. Only global rank 0
(``$RANK`` unset or 0) writes; other ranks' calls do nothing.
"""

from __future__ import annotations

import json
import math
import os
import sys
from typing import Any, TextIO

__all__ = ["METRICS_FILE_ENV", "Reporter"]

METRICS_FILE_ENV = "INFRARSI_METRICS_FILE"
_DIVERGED = "the run has diverged; stop the job (infrarsi records the trial as a crash) instead of reporting it"


def _number(name: str, value: Any, if_not_finite: str) -> float:
    """``value`` as a finite float (a 0-d tensor, numpy scalar or Python number); a clear
    error otherwise, ending with ``if_not_finite`` for NaN and infinities."""
    if isinstance(value, bool):
        raise TypeError(f"{name} must be a number, got a bool ({value!r})")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise TypeError(f"{name} must be a number, got {type(value).__name__} {value!r:.60}") from None
    if not math.isfinite(number):
        raise ValueError(f"{name} must be a finite number, got {number}: {if_not_finite}")
    return number


class Reporter:
    """Writes the metrics protocol's events: ``start``, ``step``, ``eval``, ``end``.

    ``path`` overrides ``$INFRARSI_METRICS_FILE``; ``rank`` overrides ``$RANK``.
    """

    def __init__(self, path: str | None = None, *, rank: int | None = None) -> None:
        self.rank = int(os.environ.get("RANK", "0")) if rank is None else rank
        self._last_step: int | None = None
        self._out: TextIO | None = None
        self._owns_out = False
        if self.rank != 0:
            return
        path = path or os.environ.get(METRICS_FILE_ENV)
        if path:
            # Append mode works on a regular file and on the FIFO the harness makes.
            self._out, self._owns_out = open(path, "a", encoding="utf-8"), True
        else:
            self._out = sys.stdout

    @property
    def enabled(self) -> bool:
        """Whether this process writes (global rank 0)."""
        return self._out is not None

    def start(self, **fields: Any) -> None:
        """Once, before the first step: e.g. ``seq_len``, ``tokens_per_step`` (or
        ``global_batch_tokens``), ``micro_batch``, ``grad_accum_steps``, ``world_size``,
        ``device``, ``num_params``, ``flops_per_token``, ``knobs``."""
        self._write({"event": "start", **fields})

    def step(self, step: int, loss: Any, *, tokens: int | None = None, step_time_s: float | None = None,
             **fields: Any) -> None:
        """Once per optimizer step, after it finished. ``loss`` is the step's loss over the
        whole global batch; ``tokens`` the tokens this step trained on; ``step_time_s`` the
        job's own measure (the harness cross-checks it against its clock). Extra fields
        (``peak_memory_bytes``, ``phases``) are passed through."""
        if not self.enabled:
            return
        if isinstance(step, bool) or not isinstance(step, int):
            raise TypeError(f"step must be an int, got {type(step).__name__} {step!r}")
        if self._last_step is not None and step <= self._last_step:
            raise ValueError(f"step {step} does not increase on the previous step {self._last_step}; "
                             "report each optimizer step once, in order")
        event: dict[str, Any] = {"event": "step", "step": step, "loss": _number("loss", loss, _DIVERGED)}
        if tokens is not None:
            event["tokens"] = int(tokens)
        if step_time_s is not None:
            event["step_time_s"] = _number("step_time_s", step_time_s,
                                           "pass the seconds the step took, or leave step_time_s out")
        self._last_step = step  # only once the step is accepted, so a refused step can be reported again
        self._write({**event, **fields})

    def eval(self, step: int, eval_loss: Any, **fields: Any) -> None:
        """An evaluation loss measured after optimizer step ``step``."""
        if self.enabled:
            self._write({"event": "eval", "step": int(step), "eval_loss": _number("eval_loss", eval_loss, _DIVERGED),
                         **fields})

    def end(self) -> None:
        """Once, after the last step; closes the file."""
        self._write({"event": "end"})
        if self._owns_out and self._out is not None:
            self._out.close()
        self._out = None

    def _write(self, event: dict[str, Any]) -> None:
        if self._out is None:
            return
        # The numbers checked above are finite. A NaN in a passed-through field (phases, ...)
        # is written as NaN, so that the harness's message names the field and the line.
        self._out.write(json.dumps(event, allow_nan=True, default=_jsonable) + "\n")
        self._out.flush()


def _jsonable(value: Any) -> Any:
    """Numbers that are not Python numbers (tensors, numpy scalars) as floats or ints."""
    if hasattr(value, "item"):
        item = value.item()
        return item if isinstance(item, (int, float)) else str(item)
    return str(value)
