"""A job that does almost no work: 50 ms steps, so a trial's time is mostly process
start-up. Used by overhead.py."""

import json
import os
import sys
import time

steps = int(sys.argv[sys.argv.index("--steps") + 1])
tokens = int(sys.argv[sys.argv.index("--global-batch-tokens") + 1])
with open(os.environ["INFRARSI_METRICS_FILE"], "a") as out:
    out.write(json.dumps({"event": "start", "seq_len": 128, "global_batch_tokens": tokens}) + "\n")
    for step in range(steps):
        t0 = time.perf_counter()
        time.sleep(0.05)
        out.write(json.dumps({"event": "step", "step": step, "loss": 1.0, "step_time_s": time.perf_counter() - t0,
                              "tokens": tokens, "peak_memory_bytes": 0}) + "\n")
        out.flush()
