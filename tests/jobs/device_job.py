"""A job that "holds device memory" where a test's stand-in for NVML can see it: each of its
processes (real ones: the job and the children it starts) writes <root>/<device>/<pid>
holding its bytes, as NVML lists per-process memory. Speaks the metrics protocol."""

import argparse
import json
import os
import subprocess
import sys
import time

MB = 2**20
p = argparse.ArgumentParser()
p.add_argument("--root", required=True)
p.add_argument("--hold", default="1:150", help="device:MB this process holds")
p.add_argument("--children", default="", help="comma-separated device:MB, one child process each")
p.add_argument("--grow-mb", type=int, default=0, help="MB this process adds at every step")
p.add_argument("--steps", type=int, default=6)
p.add_argument("--child", action="store_true")
p.add_argument("--oom-message", action="store_true")
args = p.parse_args()


def hold(spec: str, extra_mb: int = 0) -> None:
    device, mb = spec.split(":")
    os.makedirs(os.path.join(args.root, device), exist_ok=True)
    path = os.path.join(args.root, device, str(os.getpid()))
    with open(path + ".tmp", "w") as f:
        f.write(str((int(mb) + extra_mb) * MB))
    os.replace(path + ".tmp", path)


hold(args.hold)
if args.child:
    time.sleep(60)  # until the job ends it
    sys.exit(0)
children = [subprocess.Popen([sys.executable, __file__, "--root", args.root, "--hold", c, "--child"])
            for c in args.children.split(",") if c]
while sum(len(files) for _, _, files in os.walk(args.root)) < 1 + len(children):
    time.sleep(0.01)
if args.oom_message:
    print("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", file=sys.stderr)
    sys.exit(1)
out = open(os.environ["INFRARSI_METRICS_FILE"], "a")
for step in range(args.steps):
    time.sleep(0.08)
    hold(args.hold, extra_mb=args.grow_mb * (step + 1))
    out.write(json.dumps({"event": "step", "step": step, "loss": 1.0, "tokens": 64}) + "\n")
    out.flush()
for c in children:
    c.kill()
    c.wait()
