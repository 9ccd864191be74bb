"""What a GPT workload run reports: one JSON object per line.

LOCKED by the harness. This module owns the numbers a run is judged on, so that a tuned
trainer cannot report them differently: the step clock, the loss averaged over the whole
global batch, the tokens (taken from the data module's counter, not from the trainer),
and peak memory.

Events, written by global rank 0 only, appended and flushed line by line to the file
named by INFRARSI_METRICS_FILE (stdout when unset):

- start: flavour, num_params, flops_per_token (model FLOPs of one training token, for
  MFU), world_size, seq_len, global_batch_tokens, micro_batch, grad_accum_steps, device,
  device_name (the accelerator's name as its driver reports it; absent on CPU),
  comm_in_backward, knobs (every knob value of the run).
- step: step, loss, step_time_s, tokens, peak_memory_bytes, phases. `phases` holds the
  trainer's own split of the step (data_s, forward_s, backward_s, optimizer_s, comm_s);
  with DDP the gradient all-reduce overlaps backward, so its time is inside backward_s,
  comm_s is 0 and the start event says comm_in_backward = true.
- end.

Peak memory is torch.cuda.max_memory_allocated() on CUDA and the process's peak
resident set on CPU (VmHWM of /proc/self/status: the high-water mark of this program's
own address space), the maximum over ranks; both are peaks since the process started, so
each step reports the peak so far. Not ru_maxrss: Linux carries it over from the parent
through fork and exec, so a job launched from a 1 GB process would report 1 GB.
"""

import json
import os
import resource
import sys
import time
from typing import Any, TextIO

import torch
import torch.distributed as dist

from workloads.gpt.data import SyntheticCorpus

__all__ = ["METRICS_FILE_ENV", "MetricsWriter", "peak_memory_bytes"]

METRICS_FILE_ENV = "INFRARSI_METRICS_FILE"


def peak_memory_bytes(device: torch.device) -> int:
    """This process's peak memory so far on `device`."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device)
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * (1 if sys.platform == "darwin" else 1024)


class MetricsWriter:
    """Times optimizer steps and writes the run's events.

    Every rank calls every method in the same order (step totals are all-reduced);
    only global rank 0 writes.
    """

    def __init__(
        self, *, device: torch.device, corpus: SyntheticCorpus, rank: int, world_size: int
    ):
        self.device = device
        self.corpus = corpus
        self.rank = rank
        self.world_size = world_size
        self._step_start_s: float | None = None
        self._out: TextIO | None = None
        if rank == 0:
            path = os.environ.get(METRICS_FILE_ENV)
            self._out = open(path, "a", encoding="utf-8") if path else sys.stdout

    def start(
        self,
        *,
        flavour: str,
        num_params: int,
        num_layers: int,
        flops_per_token: int,
        seq_len: int,
        global_batch_tokens: int,
        micro_batch: int,
        grad_accum_steps: int,
        knobs: dict[str, Any],
    ) -> None:
        self._write(
            {
                "event": "start",
                "flavour": flavour,
                "num_params": num_params,
                "num_layers": num_layers,
                "flops_per_token": flops_per_token,
                "world_size": self.world_size,
                "seq_len": seq_len,
                "global_batch_tokens": global_batch_tokens,
                "micro_batch": micro_batch,
                "grad_accum_steps": grad_accum_steps,
                "device": str(self.device),
                **(
                    {"device_name": torch.cuda.get_device_name(self.device)}
                    if self.device.type == "cuda"
                    else {}
                ),
                "comm_in_backward": self.world_size > 1,
                "knobs": knobs,
            }
        )
        # Tokens served before the first step (e.g. a warm-up) must not count towards it.
        self.corpus.take_num_tokens_served()

    def begin_step(self) -> None:
        """Start the clock of one optimizer step; call before its first micro-batch is fetched."""
        self._synchronize()
        self._step_start_s = time.perf_counter()

    def end_step(
        self, *, step: int, loss: torch.Tensor, phases: dict[str, float]
    ) -> dict[str, Any]:
        """Stop the clock after the optimizer step and report it.

        `loss` is this rank's mean loss over its share of the global batch.
        """
        assert self._step_start_s is not None, "end_step without begin_step"
        self._synchronize()
        step_time_s = time.perf_counter() - self._step_start_s
        self._step_start_s = None

        num_tokens = self.corpus.take_num_tokens_served()
        # float64 keeps loss * tokens exact enough and token sums exact (below 2**53).
        totals = torch.tensor(
            [loss.detach().double().item() * num_tokens, float(num_tokens)], dtype=torch.float64
        )
        peak = torch.tensor([peak_memory_bytes(self.device)], dtype=torch.int64)
        if self.world_size > 1:
            totals, peak = totals.to(self.device), peak.to(self.device)
            dist.all_reduce(totals, op=dist.ReduceOp.SUM)
            dist.all_reduce(peak, op=dist.ReduceOp.MAX)
        loss_sum, total_tokens = totals.tolist()
        record = {
            "event": "step",
            "step": step,
            "loss": loss_sum / total_tokens if total_tokens else float("nan"),
            "step_time_s": step_time_s,
            "tokens": int(total_tokens),
            "peak_memory_bytes": int(peak.item()),
            "phases": phases,
        }
        self._write(record)
        return record

    def end(self) -> None:
        self._write({"event": "end"})
        if self._out is not None and self._out is not sys.stdout:
            self._out.close()
        self._out = None

    def _synchronize(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _write(self, event: dict[str, Any]) -> None:
        if self._out is not None:
            self._out.write(json.dumps(event) + "\n")
            self._out.flush()
