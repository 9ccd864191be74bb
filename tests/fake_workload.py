"""A stand-in training job for fault injection: it speaks the metrics protocol of the
reference workload and misbehaves on request (real processes, real signals, real memory)."""

import argparse
import json
import os
import subprocess
import sys
import time

p = argparse.ArgumentParser()
p.add_argument("--mode", default="ok")
p.add_argument("--steps", type=int, default=4)
p.add_argument("--sleep", type=float, default=0.05)
p.add_argument("--alloc-mb", type=int, default=0)
p.add_argument("--tokens", type=int, default=2048)
p.add_argument("--echo", default="")
p.add_argument("--noop", default="", help="accepted and ignored: a knob that does nothing")
p.add_argument("--compile", default="off", help="on: sleep --compile-s before the first step (a compile "
               "stand-in), then every step takes half --sleep")
p.add_argument("--compile-s", type=float, default=1.0)
p.add_argument("--seed", type=int, default=0)
p.add_argument("--seed-mode", default="ignore", help="use: the losses depend on --seed")
p.add_argument("--split", type=int, default=1, help="an honest split that is not bit-identical: every loss "
               "moves by (split - 1) x 1e-6 relative, 10x that at seeds >= 1500 (a seed whose trajectory "
               "amplifies rounding, as a loss spike does)")
args = p.parse_args()

out = open(os.environ["INFRARSI_METRICS_FILE"], "a")


def emit(event):
    out.write(json.dumps(event) + "\n")
    out.flush()


if args.echo:
    print("ECHO", json.dumps(sys.argv[1:]))
if args.mode == "invalid":
    print("invalid config: micro-batch 3 does not divide 8 sequences", file=sys.stderr)
    sys.exit(2)
if args.mode == "oomtext":
    print("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", file=sys.stderr)
    sys.exit(1)
if args.mode == "gpus":
    print("CUDA_VISIBLE_DEVICES", os.environ.get("CUDA_VISIBLE_DEVICES"), flush=True)
if args.mode == "kill-actor" and not os.path.exists("actor-killed"):
    open("actor-killed", "w").close()
    os.kill(os.getppid(), 9)  # the Ray actor that launched this trial
    time.sleep(30)
if args.mode == "kill-actor-always":  # every attempt: the pool's own retry is lost too
    os.kill(os.getppid(), 9)
    sys.exit(1)
if args.mode == "silent":  # exits cleanly without a single metrics line
    sys.exit(0)
if args.mode in ("hang", "hang-own-session"):
    # torchrun starts each worker in a session of its own: the harness must find it anyway.
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                             start_new_session=args.mode == "hang-own-session")
    print("CHILD", child.pid, flush=True)
    time.sleep(600)
if args.compile == "on":
    time.sleep(args.compile_s)
    args.sleep /= 2
offset = 0.001 * (args.seed % 97) if args.seed_mode == "use" else 0.0
emit({"event": "start", "seq_len": 128, "global_batch_tokens": args.tokens})
hog = []
for step in range(args.steps):
    t0 = time.perf_counter()
    time.sleep(args.sleep)
    if args.alloc_mb:
        hog.append(bytearray(os.urandom(1)) * (args.alloc_mb * 2**20 // args.steps))
    if args.mode == "crash" and step == 1:
        raise RuntimeError("injected failure in step 1")
    if args.mode == "garbage" and step == 1:
        out.write("loss=1.0 this is not json\n")
        out.flush()
    if args.mode == "tamper" and step == 1:
        with open("locked.txt", "a") as f:
            f.write("tampered\n")
    reported = 0.001 if args.mode == "liar" else time.perf_counter() - t0
    loss = (5.0 - 0.1 * step + offset) * (1 + (args.split - 1) * 1e-6 * (10.0 if args.seed >= 1500 else 1.0))
    emit({"event": "step", "step": step, "loss": loss, "step_time_s": reported,
          "tokens": args.tokens, "peak_memory_bytes": 0})
emit({"event": "end"})
