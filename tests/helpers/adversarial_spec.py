"""The adversarial campaign's spec and a reference run of its baseline: the tiny GPT with
its cheats as patch knobs (tests/adversarial), shared by the adversarial and patch-round tests."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tiny_gpt import GPT_DIR

from infrarsi.contract.spec_load import load_spec
from infrarsi.core.trial import Outcome, Role
from infrarsi.harness.launcher import TrialRequest, run_process_trial

# The baseline's micro-batch (4) is not train.py's default (2): it stands in the command.
ARGV = ["train.py", "--flavour", "tiny", "--seq-len", "{seq_len}", "--global-batch-tokens",
        "{global_batch_tokens}", "--steps", "{num_steps}", "--seed", "{seed}", "--threads", "1",
        "--micro-batch", "{micro_batch}"]



KNOBS = ('[knobs.micro_batch]\nvalues = [4, 8]\nplaceholder = true\n'
         '[knobs.precision]\nvalues = ["fp32", "bf16"]\nflag = "--precision"\nnumerics = "changes"')


def write_spec(tmp: Path, patches: list[str], **overrides: str) -> Path:
    knob = overrides.get("knob", KNOBS)
    text = "\n".join([
        'name = "gpt-tiny-adversarial"', f"workload_dir = {json.dumps(str(GPT_DIR))}", 'repository = "copy"',
        f'command = {json.dumps(["{python}", *ARGV])}', "baseline = { micro_batch = 4, precision = \"fp32\" }"
        if knob == KNOBS else "baseline = { micro_batch = 4 }",
        # As the built-in campaign: an honest split and the other precision calibrate.
        'calibration = [{ micro_batch = 8 }, { precision = "bf16" }]' if knob == KNOBS else "",
        f"patches = {json.dumps(patches)}", knob,
        "[contract]", "seq_len = 128", "global_batch_tokens = 2048", "num_steps = 5", "warmup_steps = 1",
        'editable = ["model.py", "train.py"]',
        'locked = ["data.py", "metrics.py", "flavours.py"]',
        "[device]", 'memory_capacity = "4GiB"',
        "[budget]", "trial_timeout_s = 120", "verify_pairs = 2", "num_finalists = 2", ""])
    path = tmp / "adversarial.toml"
    path.write_text(text)
    return path


def reference_run(tmp: Path, env: dict | None = None):
    """The baseline at the contract's seed, straight from the workload folder: what a cheat
    author could have recorded before the campaign."""
    spec = write_spec(tmp, [])
    s = load_spec(spec)
    argv = [a.format(seq_len=128, global_batch_tokens=2048, num_steps=5, seed=s.contract.seed, micro_batch=4)
            for a in ARGV]
    r = run_process_trial(TrialRequest(
        trial_id="reference", config={}, role=Role.DOCTOR,
        argv=(sys.executable, *argv),
        env=env or {}, cwd=str(GPT_DIR), trial_dir=str(tmp / "reference"), memory_capacity_bytes=2**40,
        emulate_capacity=False, timeout_s=120, warmup_steps=1, num_steps=5))
    assert r.outcome is Outcome.OK, r.reason
    return r
