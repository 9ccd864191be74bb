"""A Hugging Face ``TrainerCallback`` that reports every optimizer step to infrarsi.

    from infrarsi.job.hf import InfrarsiCallback

    trainer = Trainer(..., callbacks=[InfrarsiCallback(seq_len=256)])

Each optimizer step's loss is the one the ``Trainer`` logs for that step (gathered over
processes): the callback asks the ``Trainer`` to log at every step, so ``logging_steps``
does not thin the reports. Tokens per step are counted by the
``Trainer`` when ``include_num_input_tokens_seen`` is on; otherwise the callback reports
the ``tokens_per_step`` it was given (or none). ``eval_loss`` goes out as eval events.
The loss goes out as the ``Trainer`` hands it to callbacks: whole from transformers 5 on
(only the console line is rounded); transformers 4 rounds it to 4 decimals first, and each
step event says so (``loss_quantum``), so that the loss contract compares no finer.
"""

from __future__ import annotations

import time
from typing import Any

import transformers
from transformers import TrainerCallback

from infrarsi.job.reporter import Reporter

__all__ = ["InfrarsiCallback"]

# transformers 4's Trainer rounds the loss it logs to 4 decimals (_maybe_log_save_evaluate).
_LOGGED_LOSS_QUANTUM = 1e-4 if int(transformers.__version__.split(".")[0]) < 5 else None


class InfrarsiCallback(TrainerCallback):
    def __init__(self, *, seq_len: int | None = None, tokens_per_step: int | None = None,
                 reporter: Reporter | None = None) -> None:
        self.seq_len, self.tokens_per_step = seq_len, tokens_per_step
        self._reporter = reporter
        self._tokens_seen = 0
        self._last_end_s = 0.0

    def _counting(self, args: Any) -> bool:
        return getattr(args, "include_num_input_tokens_seen", "no") not in ("no", False, None)

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        if self._reporter is None:
            self._reporter = Reporter(rank=0 if state.is_world_process_zero else 1)
        fields: dict[str, Any] = {
            "micro_batch": args.per_device_train_batch_size, "grad_accum_steps": args.gradient_accumulation_steps,
            "world_size": args.world_size, "device": str(args.device), "framework": "transformers"}
        if self.seq_len is not None:
            fields["seq_len"] = self.seq_len
        if self.tokens_per_step is not None:
            fields["tokens_per_step"] = self.tokens_per_step
        if model is not None:
            fields["num_params"] = sum(p.numel() for p in model.parameters())
        self._reporter.start(**fields)
        self._tokens_seen = state.num_input_tokens_seen
        self._last_end_s = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        control.should_log = True  # one loss per optimizer step, whatever logging_steps says
        return control

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not logs or "loss" not in logs or self._reporter is None:
            return
        now = time.perf_counter()
        tokens = self.tokens_per_step
        if self._counting(args):
            tokens, self._tokens_seen = state.num_input_tokens_seen - self._tokens_seen, state.num_input_tokens_seen
        rounded = {"loss_quantum": _LOGGED_LOSS_QUANTUM} if _LOGGED_LOSS_QUANTUM else {}
        self._reporter.step(state.global_step, logs["loss"], tokens=tokens, step_time_s=now - self._last_end_s,
                            **rounded)
        self._last_end_s = now

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        if self._reporter is not None and metrics and "eval_loss" in metrics:
            self._reporter.eval(state.global_step, metrics["eval_loss"])

    def on_train_end(self, args, state, control, **kwargs):
        if self._reporter is not None:
            self._reporter.end()
