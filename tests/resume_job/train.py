"""A fast stand-in training job for the resume and retry tests: it speaks the metrics
protocol, its step time falls with --speed, and its losses depend only on the seed (every
config trains the same model). With --kill-actor-in TRIAL it SIGKILLs the Ray actor that
launched it (its parent) whenever it runs as that trial, every attempt: an actor lost
beyond the pool's own retry."""

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, required=True)
p.add_argument("--seed", type=int, required=True)
p.add_argument("--speed", type=int, default=1)
p.add_argument("--pad", type=int, default=0)
p.add_argument("--kill-actor-in", default="")
args = p.parse_args()

# The harness's metrics FIFO lives in the trial's folder: t0005, then t0005-a2 for attempt 2.
trial_folder = Path(os.environ["INFRARSI_METRICS_FILE"]).parent.name
if args.kill_actor_in and trial_folder.split("-a")[0] == args.kill_actor_in:
    os.kill(os.getppid(), signal.SIGKILL)
    sys.exit(1)

out = open(os.environ["INFRARSI_METRICS_FILE"], "a")


def emit(event):
    out.write(json.dumps(event) + "\n")
    out.flush()


emit({"event": "start", "seq_len": 8, "global_batch_tokens": 64})
for step in range(args.steps):
    t0 = time.perf_counter()
    time.sleep(0.2 / args.speed)
    emit({"event": "step", "step": step, "loss": 5.0 + (args.seed % 7) * 0.01 - 0.1 * step,
          "step_time_s": time.perf_counter() - t0, "tokens": 64, "peak_memory_bytes": 0})
emit({"event": "end"})
