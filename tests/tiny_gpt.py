"""Small real campaigns on the tiny GPT flavour, for tests and benchmarks.

Capacities are set from a measured peak (``measure_peak_rss``), never guessed, so the
same spec OOMs where it should on any machine of a kind.
"""

from __future__ import annotations

import functools
import json
import sys
import tempfile
from pathlib import Path

from infrarsi.core.knobs import Knob, KnobSpace
from infrarsi.core.trial import Role, TrialResult
from infrarsi.harness.launcher import TrialRequest, run_process_trial
from infrarsi.stages.init import builtin_spec_path

GPT_DIR = builtin_spec_path().parent


def run_tiny(config: dict, tmp: Path, name: str, *, role: Role = Role.DOCTOR, warmup_steps: int = 1) -> TrialResult:
    """One short run of the tiny flavour with ``config``'s knobs as flags, no capacity."""
    argv = [sys.executable, str(GPT_DIR / "train.py"), "--flavour", "tiny", "--seq-len", "128",
            "--global-batch-tokens", "8192", "--steps", "6", "--threads", "1"]
    for knob, value in config.items():
        argv += [f"--{knob.replace('_', '-')}", str(value)]
    return run_process_trial(TrialRequest(
        trial_id=name, config=dict(config), role=role, argv=tuple(argv), env={}, cwd=str(GPT_DIR),
        trial_dir=str(tmp / name), memory_capacity_bytes=2**40, emulate_capacity=False, timeout_s=300,
        warmup_steps=warmup_steps, num_steps=6))


def measure_peak_rss(micro_batch: int, tmp: Path, *, checkpointing: str = "full", attention: str = "naive") -> int:
    """Peak RSS of a short tiny run, the smaller of two (a fresh install's first torch
    process of a session has peaked ~100 MB above later ones)."""
    peaks = []
    for attempt in (1, 2):
        r = run_tiny({"micro_batch": micro_batch, "checkpointing": checkpointing, "attention": attention}, tmp,
                     f"probe{micro_batch}{checkpointing}{attention}-{attempt}")
        assert r.outcome.value == "ok", r.reason
        peaks.append(r.peak_memory_bytes)
    return min(peaks)


@functools.cache
def oom_capacity() -> int:
    """A capacity three quarters of the way from the small baseline's peak to the hungriest
    corner's (micro-batch 64, no checkpointing, naive attention), both measured here the
    same way: the corner really OOMs and the baseline really fits. Trials launched through
    Ray peaked 60-100 MiB above these probes, hence the baseline's wide margin. Measured
    once per process (four short runs): the machine's peaks do not change between tests."""
    tmp = Path(tempfile.mkdtemp(prefix="infrarsi-oom-probe-"))
    return capacity_between(measure_peak_rss(2, tmp), measure_peak_rss(64, tmp, checkpointing="none"))


def capacity_between(small_peak: int, corner_peak: int) -> int:
    """Three quarters of the way from the baseline's peak to the hungriest corner's."""
    return small_peak + 3 * (corner_peak - small_peak) // 4


SMALL_KNOBS = {
    "micro_batch": [2, 64],
    "checkpointing": ["full", "none"],
    "attention": ["naive", "sdpa"],
}
# The benchmark space: every knob of the trainer that runs on any CPU (no compile: minutes).
WIDE_KNOBS = {
    "micro_batch": [2, 4, 8, 16, 64],
    "checkpointing": ["full", "selective", "none"],
    "attention": ["naive", "sdpa"],
    "optimizer": ["forloop", "foreach"],
    "precision": ["fp32", "bf16"],
}
# tiny_spec's baseline for a knob table is its first value of every knob.
WIDE_BASELINE = {k: v[0] for k, v in WIDE_KNOBS.items()}


def knob_space(knobs: dict[str, list]) -> KnobSpace:
    return KnobSpace(knobs=tuple(Knob(name=k, values=tuple(v)) for k, v in knobs.items()))


def tiny_spec(tmp: Path, *, capacity_bytes: int, num_trials: int, proposer: str = "random",
              verify_pairs: int = 3, knobs: dict[str, list] | None = None, seed: int = 0,
              num_finalists: int = 1, name: str = "tiny.toml", minimize_pairs: int = 0,
              doctor_max_repeats: int = 3, patch_rounds: int | None = None) -> Path:
    """A campaign on the tiny flavour whose baseline is the first value of every knob; with
    ``oom_capacity``, micro-batch 64 fits only with savers, if at all. Minimization and
    doctor's extra repeats are off unless asked for (they cost trials a test rarely needs);
    ``patch_rounds`` None keeps the spec's default (the built-in patches join the space)."""
    knobs = knobs or SMALL_KNOBS
    baseline = ", ".join(f"{k} = {json.dumps(v[0])}" for k, v in knobs.items())
    lines = [
        'name = "gpt-tiny"', f'workload_dir = {json.dumps(str(GPT_DIR))}', 'repository = "copy"',
        'command = ["{python}", "train.py", "--flavour", "tiny", "--seq-len", "{seq_len}", '
        '"--global-batch-tokens", "{global_batch_tokens}", "--steps", "{num_steps}", "--seed", "{seed}", '
        '"--threads", "1"]',
        f'baseline = {{ {baseline} }}',
        'calibration = [{ attention = "sdpa" }]',
    ]
    for knob, values in knobs.items():
        lines += [f"[knobs.{knob}]", f"values = {json.dumps(values)}", f'flag = "--{knob.replace("_", "-")}"']
    lines += [
        "[contract]", "seq_len = 128", "global_batch_tokens = 8192", "num_steps = 6", "warmup_steps = 2",
        'editable = ["model.py", "train.py"]', 'locked = ["data.py", "metrics.py", "flavours.py"]',
        "[device]", f"memory_capacity = {capacity_bytes}",
        "[resources]", "cpus_per_trial = 1",
        "[budget]", f"num_trials = {num_trials}", "trial_timeout_s = 120", f"num_finalists = {num_finalists}",
        f"verify_pairs = {verify_pairs}", f"minimize_pairs = {minimize_pairs}",
        f"doctor_max_repeats = {doctor_max_repeats}",
        "[search]", f'proposer = "{proposer}"', f"seed = {seed}",
    ]
    if patch_rounds is not None:
        lines.append(f"patch_rounds = {patch_rounds}")
    path = tmp / name
    path.write_text("\n".join(lines) + "\n")
    return path
