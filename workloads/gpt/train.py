"""Train the reference GPT on the synthetic corpus: the job that infrarsi tunes.

    python workloads/gpt/train.py --flavour debug --micro-batch 4
    python -m torch.distributed.run --standalone --nproc-per-node 2 workloads/gpt/train.py

What is trained is fixed by --flavour, --seq-len, --global-batch-tokens, --steps, --seed
and --lr. Every other flag is a launch knob: it may change speed and memory but not the
loss trajectory (up to floating-point reordering). Gradient accumulation is derived from
the micro-batch so the global batch never changes. A knob combination that cannot run
exits with code 2 and one stderr line starting "invalid config:".
"""

import argparse
import contextlib
import gc
import os
import sys
import time
from collections import defaultdict
from dataclasses import asdict, dataclass
from pathlib import Path

if __package__ in (None, ""):
    # Launched by path (python or torchrun): `workloads.gpt` is this script's own folder,
    # so a snapshot or a patched worktree runs its own model.py, never an installed copy.
    import types

    _here = Path(__file__).resolve().parent
    sys.modules["workloads"] = types.ModuleType("workloads")
    sys.modules["workloads"].__path__ = []
    sys.modules["workloads.gpt"] = types.ModuleType("workloads.gpt")
    sys.modules["workloads.gpt"].__path__ = [str(_here)]
    sys.modules["workloads"].gpt = sys.modules["workloads.gpt"]

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from workloads.gpt.data import SyntheticCorpus
from workloads.gpt.flavours import FLAVOURS, flops_per_token, get_flavour
from workloads.gpt.metrics import MetricsWriter
from workloads.gpt.model import ATTENTION_IMPLEMENTATIONS, CHECKPOINTING_MODES, GPT

INVALID_CONFIG_EXIT_CODE = 2
# How several processes hold the model: ddp replicates parameters, gradients and optimizer
# state and all-reduces gradients; fsdp shards all three (FSDP2's fully_shard on each
# block and the root), all-gathering parameters around each block's forward and backward
# and reduce-scattering gradients. Both average the same gradients. One process: no-op.
SHARDING_MODES = ("ddp", "fsdp")


class InvalidConfigError(Exception):
    """A knob combination this workload cannot run (exit code 2, not a crash)."""


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    # What is trained.
    flavour: str = "debug"
    seq_len: int = 128
    global_batch_tokens: int = 2048
    steps: int = 10
    seed: int = 1234
    lr: float = 1e-3  # 3e-3 spikes the debug loss to 8.2 at step 2
    # Launch knobs. The defaults are the untuned baseline: memory-frugal and slow.
    micro_batch: int = 2  # sequences per micro-step per rank
    checkpointing: str = "full"
    precision: str = "fp32"
    compile: str = "off"
    optimizer: str = "forloop"
    attention: str = "naive"
    threads: int = 0  # 0 = leave torch's default (torchrun sets 1 per process)
    bucket_mb: int = 25  # DDP's default bucket size
    sharding: str = "ddp"  # ddp: replicate parameters; fsdp: FSDP2 fully_shard per block


def parse_args(argv: list[str] | None = None) -> TrainConfig:
    defaults = TrainConfig()
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add = parser.add_argument
    add("--flavour", choices=sorted(FLAVOURS), default=defaults.flavour)
    add("--seq-len", type=int, default=defaults.seq_len)
    add("--global-batch-tokens", type=int, default=defaults.global_batch_tokens)
    add("--steps", type=int, default=defaults.steps)
    add("--seed", type=int, default=defaults.seed)
    add("--lr", type=float, default=defaults.lr)
    add("--micro-batch", type=int, default=defaults.micro_batch)
    add("--checkpointing", choices=CHECKPOINTING_MODES, default=defaults.checkpointing)
    add("--precision", choices=("fp32", "bf16"), default=defaults.precision)
    add("--compile", choices=("off", "on"), default=defaults.compile)
    add("--optimizer", choices=("forloop", "foreach", "fused"), default=defaults.optimizer)
    add("--attention", choices=sorted(ATTENTION_IMPLEMENTATIONS), default=defaults.attention)
    add("--threads", type=int, default=defaults.threads)
    add("--bucket-mb", type=int, default=defaults.bucket_mb)
    add("--sharding", choices=SHARDING_MODES, default=defaults.sharding)
    return TrainConfig(**vars(parser.parse_args(argv)))


def derive_grad_accum_steps(config: TrainConfig, world_size: int) -> int:
    """Micro-steps per optimizer step that keep the global batch at global_batch_tokens."""
    max_seq_len = get_flavour(config.flavour).max_seq_len
    if not 0 < config.seq_len <= max_seq_len:
        raise InvalidConfigError(
            f"--seq-len {config.seq_len} must be in 1..{max_seq_len} for flavour {config.flavour}"
        )
    if config.global_batch_tokens <= 0 or config.global_batch_tokens % config.seq_len:
        raise InvalidConfigError(
            f"--global-batch-tokens {config.global_batch_tokens} is not a positive multiple "
            f"of --seq-len {config.seq_len}"
        )
    if config.steps <= 0:
        raise InvalidConfigError(f"--steps must be positive, got {config.steps}")
    global_batch_sequences = config.global_batch_tokens // config.seq_len
    if config.micro_batch <= 0 or global_batch_sequences % (world_size * config.micro_batch):
        raise InvalidConfigError(
            f"global batch of {global_batch_sequences} sequences does not split into "
            f"{world_size} rank(s) x micro-batch {config.micro_batch}; "
            f"choose a micro-batch that divides {global_batch_sequences // world_size}"
        )
    return global_batch_sequences // (world_size * config.micro_batch)


def make_optimizer(model: torch.nn.Module, config: TrainConfig) -> torch.optim.AdamW:
    """AdamW in the implementation chosen by --optimizer; all three compute the same update."""
    # As in GPT-2: decay matrices and embeddings, not gains and biases.
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    implementation = {
        "forloop": {"foreach": False},
        "foreach": {"foreach": True},
        "fused": {"fused": True},
    }[config.optimizer]
    try:
        return torch.optim.AdamW(groups, lr=config.lr, betas=(0.9, 0.95), **implementation)
    except RuntimeError as error:
        if config.optimizer != "fused":
            raise
        raise InvalidConfigError(f"--optimizer fused is not supported here: {error}") from error


class PhaseTimer:
    """Seconds spent per phase of a step, summed over its micro-steps.

    On CUDA it records events instead of synchronising, so that timing does not change
    what it measures.
    """

    def __init__(self, device: torch.device):
        self.use_events = device.type == "cuda"
        self._spans: dict[str, list] = defaultdict(list)
        self._last_mark = None

    @contextlib.contextmanager
    def phase(self, name: str):
        start = self._mark()
        yield
        self._spans[name].append((start, self._mark()))

    def seconds(self) -> dict[str, float]:
        """Per-phase totals since the previous call."""
        if self.use_events and self._last_mark is not None:
            self._last_mark.synchronize()  # events complete in order: the last one suffices
        totals = {
            name: sum(self._elapsed_s(start, end) for start, end in spans)
            for name, spans in self._spans.items()
        }
        self._spans.clear()
        return totals

    def _mark(self):
        if self.use_events:
            self._last_mark = torch.cuda.Event(enable_timing=True)
            self._last_mark.record()
        else:
            self._last_mark = time.perf_counter()
        return self._last_mark

    def _elapsed_s(self, start, end) -> float:
        return start.elapsed_time(end) / 1000 if self.use_events else end - start


@dataclass(frozen=True, kw_only=True)
class Placement:
    """Where this process runs: its rank among world_size and its device."""

    rank: int
    local_rank: int
    world_size: int
    device: torch.device

    @classmethod
    def from_environment(cls) -> "Placement":
        # torchrun sets these; a plain `python train.py` is a world of one.
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        cuda = torch.cuda.is_available()
        return cls(
            rank=int(os.environ.get("RANK", "0")),
            local_rank=local_rank,
            world_size=int(os.environ.get("WORLD_SIZE", "1")),
            device=torch.device("cuda", local_rank) if cuda else torch.device("cpu"),
        )


def build_model(config: TrainConfig, placement: Placement):
    """(model, runner, gradient_sync): runner is what the loop calls (DDP or FSDP2,
    possibly compiled); gradient_sync(is_last) is the context of one micro-step's
    forward and backward, which skips the gradient exchange on all but the last."""
    torch.manual_seed(config.seed)
    model = GPT(
        get_flavour(config.flavour), attention=config.attention, checkpointing=config.checkpointing
    ).to(placement.device)
    runner = model

    def gradient_sync(is_last: bool):
        return contextlib.nullcontext()

    if placement.world_size > 1 and config.sharding == "fsdp":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh(placement.device.type, (placement.world_size,))
        for block in model.blocks:
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)

        @contextlib.contextmanager
        def gradient_sync(is_last: bool):
            model.set_requires_gradient_sync(is_last)
            yield

    elif placement.world_size > 1:
        runner = ddp_model = DistributedDataParallel(
            model,
            device_ids=[placement.local_rank] if placement.device.type == "cuda" else None,
            bucket_cap_mb=config.bucket_mb,
        )

        def gradient_sync(is_last: bool):
            return contextlib.nullcontext() if is_last else ddp_model.no_sync()

    if config.compile == "on":
        runner = torch.compile(runner)
    return model, runner, gradient_sync


def train(config: TrainConfig, placement: Placement, grad_accum_steps: int) -> None:
    device, rank, world_size = placement.device, placement.rank, placement.world_size
    model, runner, gradient_sync = build_model(config, placement)
    optimizer = make_optimizer(model, config)
    corpus = SyntheticCorpus(
        seed=config.seed,
        vocab_size=model.config.vocab_size,
        seq_len=config.seq_len,
        global_batch_sequences=config.global_batch_tokens // config.seq_len,
    )
    metrics = MetricsWriter(device=device, corpus=corpus, rank=rank, world_size=world_size)
    workload_fields = ("flavour", "seq_len", "global_batch_tokens", "steps", "seed", "lr")
    knobs = {name: value for name, value in asdict(config).items() if name not in workload_fields}
    knobs.update(nproc=world_size, threads_effective=torch.get_num_threads())
    metrics.start(
        flavour=config.flavour,
        num_params=model.num_params,  # a sharded parameter counts its global size
        num_layers=model.config.num_layers,
        flops_per_token=flops_per_token(model.config, config.seq_len),
        seq_len=config.seq_len,
        global_batch_tokens=config.global_batch_tokens,
        micro_batch=config.micro_batch,
        grad_accum_steps=grad_accum_steps,
        knobs=knobs,
    )

    autocast = torch.autocast(
        device_type=device.type, dtype=torch.bfloat16, enabled=config.precision == "bf16"
    )
    timer = PhaseTimer(device)
    for step in range(config.steps):
        metrics.begin_step()
        loss_sum = torch.zeros((), device=device)
        for micro_step in range(grad_accum_steps):
            with timer.phase("data_s"):
                inputs, targets = corpus.micro_batch(
                    step=step,
                    rank=rank,
                    world_size=world_size,
                    micro_step=micro_step,
                    micro_batch=config.micro_batch,
                )
                inputs = inputs.to(device, non_blocking=True)
                targets = targets.to(device, non_blocking=True)
            # Only the last micro-step all-reduces gradients; the others just accumulate.
            is_last = micro_step == grad_accum_steps - 1
            with gradient_sync(is_last):
                with timer.phase("forward_s"), autocast:
                    loss = runner(inputs, targets)
                with timer.phase("backward_s"):
                    # Scaled so the accumulated gradient is the mean over the global batch.
                    (loss / grad_accum_steps).backward()
            loss_sum += loss.detach()
        with timer.phase("optimizer_s"):
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        # DDP's all-reduce and FSDP's gathers and reduce-scatters are inside forward_s and
        # backward_s.
        phases = {**timer.seconds(), "comm_s": 0.0}
        metrics.end_step(step=step, loss=loss_sum / grad_accum_steps, phases=phases)
    metrics.end()


def main(argv: list[str] | None = None) -> int:
    config = parse_args(argv)
    placement = Placement.from_environment()
    try:
        grad_accum_steps = derive_grad_accum_steps(config, placement.world_size)
        if placement.device.type == "cuda":
            torch.cuda.set_device(placement.device)
        if config.threads > 0:
            torch.set_num_threads(config.threads)
        if placement.world_size > 1:
            backend = "nccl" if placement.device.type == "cuda" else "gloo"
            dist.init_process_group(backend=backend)
        try:
            train(config, placement, grad_accum_steps)
        finally:
            if placement.world_size > 1:
                # Free the DDP reducer before its process group: with gloo (torch 2.13) a
                # reducer still alive at interpreter exit aborts the process now and then.
                gc.collect()
                dist.destroy_process_group()
    except InvalidConfigError as error:
        print(f"invalid config: {error}", file=sys.stderr)
        return INVALID_CONFIG_EXIT_CODE
    return 0


if __name__ == "__main__":
    sys.exit(main())
