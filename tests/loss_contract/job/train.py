"""A small trainer that was not written for infrarsi's per-step loss: like many trainers
it reports the loss of its *last micro-batch* each step (sampled per micro-step, not
averaged over the global batch), and an eval loss on fixed held-out data every
--eval-every steps. Its per-step loss therefore depends on how the global batch is split,
while its eval loss does not. Metrics go to $INFRARSI_METRICS_FILE as JSON lines.

    python train.py --micro-batch 2 --steps 16
"""

import argparse
import json
import os
import sys
import time

import torch
from data import VOCAB, global_batch, held_out


class BigramMLP(torch.nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, width)
        self.hidden = torch.nn.Linear(width, width)
        self.out = torch.nn.Linear(width, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        inputs, targets = tokens[:, :-1], tokens[:, 1:]
        logits = self.out(torch.relu(self.hidden(self.embed(inputs))))
        return torch.nn.functional.cross_entropy(logits.float().reshape(-1, VOCAB), targets.reshape(-1))


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--seq-len", type=int, default=32)
    p.add_argument("--global-batch-tokens", type=int, default=512)
    p.add_argument("--steps", type=int, default=16)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--micro-batch", type=int, default=1)
    p.add_argument("--precision", choices=("fp32", "bf16"), default="fp32")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--eval-every", type=int, default=2)
    args = p.parse_args()
    sequences = args.global_batch_tokens // args.seq_len
    if sequences % args.micro_batch:
        print(f"invalid config: micro-batch {args.micro_batch} does not divide {sequences}", file=sys.stderr)
        return 2
    accum = sequences // args.micro_batch
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    model = BigramMLP(width=48)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.02)
    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.precision == "bf16")
    evaluation = held_out(16, args.seq_len)
    out = open(os.environ["INFRARSI_METRICS_FILE"], "a") if os.environ.get("INFRARSI_METRICS_FILE") else sys.stdout

    def report(**event) -> None:
        out.write(json.dumps(event) + "\n")
        out.flush()

    report(event="start", seq_len=args.seq_len, global_batch_tokens=args.global_batch_tokens)
    for step in range(args.steps):
        start = time.perf_counter()
        batch = global_batch(args.seed, step, sequences, args.seq_len)
        for micro_step in range(accum):
            with autocast:
                loss = model(batch[micro_step * args.micro_batch:(micro_step + 1) * args.micro_batch])
            (loss / accum).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        report(event="step", step=step, loss=loss.item(), tokens=sequences * args.seq_len,
               step_time_s=time.perf_counter() - start)
        if (step + 1) % args.eval_every == 0:
            with torch.no_grad(), autocast:
                eval_loss = model(evaluation).item()
            report(event="eval", step=step, eval_loss=eval_loss)
    report(event="end")
    return 0


if __name__ == "__main__":
    sys.exit(main())
