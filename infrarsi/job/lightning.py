"""A Lightning ``Callback`` that reports every optimizer step to infrarsi.

    from infrarsi.job.lightning import InfrarsiCallback

    trainer = L.Trainer(..., callbacks=[InfrarsiCallback(seq_len=256)])

A step's loss is the mean of ``training_step``'s loss over the step's micro-batches
(Lightning hands each one to the callback already divided by ``accumulate_grad_batches``)
and over processes. Tokens are counted from each micro-batch and summed over processes:
by ``count_tokens(batch)`` when given, else the elements of the batch's token tensor
(the batch itself, its first element, or its ``input_ids``); ``tokens_per_step`` is a
declared constant used when nothing can be counted. The validation loss logged under
``eval_key`` goes out as an eval event.
"""

from __future__ import annotations

import time
from typing import Any, Callable

import torch
from lightning.pytorch.callbacks import Callback

from infrarsi.job.reporter import Reporter

__all__ = ["InfrarsiCallback"]


def _token_tensor(batch: Any) -> torch.Tensor | None:
    if isinstance(batch, torch.Tensor):
        return batch
    if isinstance(batch, (list, tuple)) and batch and isinstance(batch[0], torch.Tensor):
        return batch[0]
    if isinstance(batch, dict) and isinstance(batch.get("input_ids"), torch.Tensor):
        return batch["input_ids"]
    return None


class InfrarsiCallback(Callback):
    def __init__(self, *, seq_len: int | None = None, tokens_per_step: int | None = None,
                 count_tokens: Callable[[Any], int] | None = None, eval_key: str = "val_loss",
                 reporter: Reporter | None = None) -> None:
        self.seq_len, self.tokens_per_step, self.count_tokens = seq_len, tokens_per_step, count_tokens
        self.eval_key = eval_key
        self._reporter = reporter
        self._loss_sum = 0.0
        self._tokens: int | None = 0
        self._last_global_step = 0
        self._last_end_s = 0.0

    def on_train_start(self, trainer, pl_module):
        if self._reporter is None:
            self._reporter = Reporter(rank=trainer.global_rank)
        fields: dict[str, Any] = {
            "grad_accum_steps": trainer.accumulate_grad_batches, "world_size": trainer.world_size,
            "device": str(pl_module.device), "num_params": sum(p.numel() for p in pl_module.parameters()),
            "framework": "lightning"}
        if self.seq_len is not None:
            fields["seq_len"] = self.seq_len
        if self.tokens_per_step is not None:
            fields["tokens_per_step"] = self.tokens_per_step
        self._reporter.start(**fields)
        self._last_global_step = trainer.global_step
        self._last_end_s = time.perf_counter()

    def _micro_tokens(self, batch: Any) -> int | None:
        if self.count_tokens is not None:
            return int(self.count_tokens(batch))
        tensor = _token_tensor(batch)
        return None if tensor is None else tensor.numel()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        self._loss_sum += float(loss.detach()) if isinstance(loss, torch.Tensor) else float(loss)
        micro = self._micro_tokens(batch)
        self._tokens = None if micro is None or self._tokens is None else self._tokens + micro
        if trainer.global_step == self._last_global_step:
            return  # still accumulating: the optimizer has not stepped yet
        # Every rank takes part in the reduction; only global rank 0's reporter writes.
        totals = torch.tensor([self._loss_sum, float(self._tokens or 0)], dtype=torch.float64,
                              device=pl_module.device)
        totals = trainer.strategy.reduce(totals, reduce_op="sum")
        loss_mean, tokens = totals[0].item() / trainer.world_size, int(totals[1].item())
        now = time.perf_counter()
        self._reporter.step(trainer.global_step, loss_mean,
                            tokens=tokens if self._tokens is not None else self.tokens_per_step,
                            step_time_s=now - self._last_end_s)
        self._last_global_step, self._last_end_s = trainer.global_step, now
        self._loss_sum, self._tokens = 0.0, 0

    def on_validation_epoch_end(self, trainer, pl_module):
        value = trainer.callback_metrics.get(self.eval_key)
        if self._reporter is not None and value is not None and not trainer.sanity_checking:
            self._reporter.eval(trainer.global_step, float(value))

    def on_train_end(self, trainer, pl_module):
        if self._reporter is not None:
            self._reporter.end()
