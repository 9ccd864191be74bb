"""How the harness reads a job's progress: the spec's ``[metrics]`` table, validated."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class MetricsSpec(_Model):
    """How the harness reads the job's progress (the metrics protocol).

    ``jsonl``: the job appends JSON events to the file named by ``$INFRARSI_METRICS_FILE``
    (``infrarsi.job.reporter``, a framework callback, or its own code). ``log``: the harness reads
    the job's own output lines (the log adapter); the job needs no change.
    """

    source: Literal["jsonl", "log"] = "jsonl"
    stream: Literal["stdout", "stderr", "both"] = Field(default="stdout", description="log only: the stream to read")
    step_pattern: str | None = Field(
        default=None, description="log only, required: a regular expression with a named group `loss` (and "
        "optionally `step`, `tokens`, `step_time_s`) that matches the line the job prints once per optimizer step")
    eval_pattern: str | None = Field(default=None, description="log only: named groups `eval_loss` and "
                                     "optionally `step`")
    tokens_pattern: str | None = Field(default=None, description="log only: a start-up line stating the tokens "
                                       "per optimizer step, named group `tokens` (commas allowed)")
    tokens_per_step: int | None = Field(default=None, gt=0, description="log only: tokens per optimizer step, "
                                        "declared; must equal contract.global_batch_tokens")

    @field_validator("step_pattern")
    @classmethod
    def _step_groups(cls, v: str | None) -> str | None:
        return _pattern(v, required={"loss"}, optional={"step", "tokens", "step_time_s"})

    @field_validator("eval_pattern")
    @classmethod
    def _eval_groups(cls, v: str | None) -> str | None:
        return _pattern(v, required={"eval_loss"}, optional={"step"})

    @field_validator("tokens_pattern")
    @classmethod
    def _tokens_groups(cls, v: str | None) -> str | None:
        return _pattern(v, required={"tokens"}, optional=set())

    @model_validator(mode="after")
    def _complete(self) -> "MetricsSpec":
        log_only = [f for f in ("step_pattern", "eval_pattern", "tokens_pattern", "tokens_per_step")
                    if getattr(self, f) is not None]
        if self.source == "jsonl":
            if log_only or self.stream != "stdout":
                raise ValueError(f"metrics.{(log_only or ['stream'])[0]} applies to source = 'log' only (found "
                                 "source = 'jsonl'); set metrics.source = 'log' or remove it")
            return self
        if self.step_pattern is None:
            raise ValueError("metrics.step_pattern is required with source = 'log': a regular expression with "
                             "a named group `loss` that matches the line the job prints once per optimizer step "
                             "(found none)")
        if self.tokens_pattern is None and self.tokens_per_step is None:
            raise ValueError("source = 'log' needs metrics.tokens_pattern (a start-up line stating the tokens "
                             "per step) or metrics.tokens_per_step (a declared constant), so that tokens per step "
                             "can be checked against the contract (found neither)")
        return self


def _pattern(value: str | None, *, required: set[str], optional: set[str]) -> str | None:
    if value is None:
        return None
    try:
        groups = set(re.compile(value).groupindex)
    except re.error as exc:
        raise ValueError(f"is not a valid regular expression ({exc})") from None
    if not required <= groups:
        raise ValueError(f"needs the named group(s) {sorted(required)}, e.g. (?P<{min(required)}>[-+0-9.eE]+) "
                         f"(found groups {sorted(groups)})")
    unknown = groups - required - optional
    if unknown:
        raise ValueError(f"has unknown named group(s) {sorted(unknown)}; allowed: {sorted(required | optional)}")
    return value
