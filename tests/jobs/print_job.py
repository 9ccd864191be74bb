"""A training script that knows nothing of infrarsi: it only prints its own log lines, in
the style of nanoGPT (a start-up line with the tokens per iteration, one line per
iteration, an evaluation line now and then). Flags make it misbehave on request."""

import argparse
import sys
import time

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=6)
p.add_argument("--step-ms", type=float, default=20)
p.add_argument("--tokens", type=int, default=1024)
p.add_argument("--eval-every", type=int, default=3)
p.add_argument("--stream", choices=["stdout", "stderr"], default="stdout")
p.add_argument("--bad-loss-at", type=int, default=-1, help="print a loss that is not a number at this step")
p.add_argument("--restart-at", type=int, default=-1, help="the iteration counter starts again at this step")
p.add_argument("--quiet", action="store_true", help="print nothing the metrics patterns match")
args = p.parse_args()
out = sys.stdout if args.stream == "stdout" else sys.stderr


def log(text):
    print(text, file=out, flush=True)


log("initializing model with 0.1M parameters")
if not args.quiet:
    log(f"tokens per iteration will be: {args.tokens:,}")
it = 0
for step in range(args.steps):
    t0 = time.perf_counter()
    time.sleep(args.step_ms / 1000)
    loss = 4.0 * 0.95 ** step
    if step == args.restart_at:
        it = 0
    shown = "4.1.2" if step == args.bad_loss_at else f"{loss:.4f}"
    if args.quiet:
        log(f"[{step}] training... {shown}")
    else:
        log(f"iter {it}: loss {shown}, time {1000 * (time.perf_counter() - t0):.2f}ms")
    if not args.quiet and args.eval_every and (step + 1) % args.eval_every == 0:
        log(f"step {it}: train loss {loss:.4f}, val loss {loss + 0.1:.4f}")
    it += 1
log("done")
