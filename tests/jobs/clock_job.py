"""A job whose steps take a known time: it sleeps until each step's deadline and reports,
with every step, the interval it measured itself between two reports
(time.perf_counter), so a test can set the harness's clock against the job's own.

--via jsonl: JSON events to $INFRARSI_METRICS_FILE, opened once (--reopen: opened and
closed for every line). --via log: a line on stdout per step. --via burst: the log lines
all written at once at the end (a job whose output is buffered).
"""

import argparse
import json
import os
import sys
import time

p = argparse.ArgumentParser()
p.add_argument("--step-ms", type=float, required=True)
p.add_argument("--steps", type=int, required=True)
p.add_argument("--via", choices=["jsonl", "log", "burst"], default="jsonl")
p.add_argument("--reopen", action="store_true")
args = p.parse_args()
TOKENS = 1024

path = os.environ.get("INFRARSI_METRICS_FILE")
out = open(path, "a") if args.via == "jsonl" and not args.reopen else None
held = []


def emit(event: dict) -> None:
    if args.via == "jsonl":
        line = json.dumps(event) + "\n"
        if args.reopen:
            with open(path, "a") as f:
                f.write(line)
        else:
            out.write(line)
            out.flush()
    elif event["event"] == "step":
        line = f"iter {event['step']}: loss {event['loss']:.4f}, dt {event['step_time_s']:.7f} s\n"
        if args.via == "burst":
            held.append(line)
        else:
            sys.stdout.write(line)
            sys.stdout.flush()


print(f"tokens per iteration will be: {TOKENS:,}", flush=True)
emit({"event": "start", "seq_len": 128, "tokens_per_step": TOKENS})
# Deadlines on a fixed grid: a step that starts late is followed by a shorter one, so the
# steps' median stays the known step time even when the machine delays a wake-up.
t0 = last = time.perf_counter()
for step in range(args.steps):
    deadline = t0 + (step + 1) * args.step_ms / 1000
    while (left := deadline - time.perf_counter()) > 0:
        time.sleep(left)
    now = time.perf_counter()
    emit({"event": "step", "step": step, "loss": 3.0 - 0.01 * step, "tokens": TOKENS, "step_time_s": now - last,
          "written_at": time.monotonic()})
    last = now
emit({"event": "end"})
sys.stdout.write("".join(held))
