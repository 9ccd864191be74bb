"""Small real campaigns on the tiny GPT flavour, for end-to-end tests."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from infrarsi.launcher import TrialRequest, run_process_trial
from infrarsi.stages.init import builtin_spec_path
from infrarsi.trial import Role

GPT_DIR = builtin_spec_path().parent


def measure_peak_rss(micro_batch: int, tmp: Path) -> int:
    """Peak RSS of one short tiny run: capacities are set from it, not guessed."""
    argv = (sys.executable, str(GPT_DIR / "train.py"), "--flavour", "tiny", "--seq-len", "128",
            "--global-batch-tokens", "8192", "--steps", "3", "--micro-batch", str(micro_batch),
            "--checkpointing", "full", "--threads", "1")
    r = run_process_trial(TrialRequest(
        trial_id=f"probe{micro_batch}", config={}, role=Role.DOCTOR, argv=argv, env={}, cwd=str(GPT_DIR),
        trial_dir=str(tmp / f"probe{micro_batch}"), memory_capacity_bytes=2**40, emulate_capacity=False,
        timeout_s=300, warmup_steps=1, num_steps=3))
    assert r.outcome.value == "ok", r.reason
    return r.peak_memory_bytes


def tiny_spec(tmp: Path, *, capacity_bytes: int, num_trials: int, proposer: str = "random",
              verify_pairs: int = 3) -> Path:
    """A campaign over 8 configs of the tiny flavour in which micro-batch 64 does not fit."""
    knobs = {
        "micro_batch": {"values": [2, 64], "flag": "--micro-batch"},
        "checkpointing": {"values": ["full", "none"], "flag": "--checkpointing"},
        "attention": {"values": ["naive", "sdpa"], "flag": "--attention"},
    }
    lines = [
        'name = "gpt-tiny"', f'workload_dir = {json.dumps(str(GPT_DIR))}', 'repository = "copy"',
        'command = ["{python}", "train.py", "--flavour", "tiny", "--seq-len", "{seq_len}", '
        '"--global-batch-tokens", "{global_batch_tokens}", "--steps", "{num_steps}", "--seed", "{seed}", '
        '"--threads", "1"]',
        'baseline = { micro_batch = 2, checkpointing = "full", attention = "naive" }',
        'calibration = [{ attention = "sdpa" }]',
    ]
    for name, k in knobs.items():
        lines += [f"[knobs.{name}]", f"values = {json.dumps(k['values'])}", f"flag = {json.dumps(k['flag'])}"]
    lines += [
        "[contract]", "seq_len = 128", "global_batch_tokens = 8192", "num_steps = 6", "warmup_steps = 2",
        'editable = ["model.py", "train.py"]', 'locked = ["data.py", "metrics.py", "flavours.py"]',
        "[device]", f"memory_capacity = {capacity_bytes}",
        "[resources]", "cpus_per_trial = 1",
        "[budget]", f"num_trials = {num_trials}", "trial_timeout_s = 120", "num_finalists = 1",
        f"verify_pairs = {verify_pairs}",
        "[search]", f'proposer = "{proposer}"',
    ]
    path = tmp / "tiny.toml"
    path.write_text("\n".join(lines) + "\n")
    return path
