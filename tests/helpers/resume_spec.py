"""The resume job's campaign spec (tests/resume_job): the SIGKILL-and-resume tests share it."""

import json
from pathlib import Path

JOB = Path(__file__).resolve().parents[1] / "resume_job"
SPEC = f"""name = "resume-job"
workload_dir = {json.dumps(str(JOB))}
repository = "copy"
command = ["{{python}}", "train.py", "--steps", "{{num_steps}}", "--seed", "{{seed}}"]
baseline = {{ speed = 1, pad = 0 }}
[knobs.speed]
values = [1, 2, 3, 4]
flag = "--speed"
[knobs.pad]
values = [0, 1]
flag = "--pad"
[contract]
seq_len = 8
global_batch_tokens = 64
num_steps = 4
warmup_steps = 1
editable = ["train.py"]
locked = ["data.txt"]
[device]
memory_capacity = "4GiB"
[resources]
cpus_per_trial = 1
concurrency = 2
max_remeasures = 0
[budget]
num_trials = 24
doctor_max_repeats = 3
num_finalists = 1
verify_pairs = 2
[search]
proposer = "engine"
"""
