"""A campaign spec on the fake workload (tests/fake_workload.py): sleeps for step times, knobs as flags."""

import json
import shutil
from pathlib import Path

FAKE = Path(__file__).resolve().parents[1] / "fake_workload.py"


def fake_spec(tmp: Path, *, knobs: dict, baseline: dict, calibration: str = "[]", objective: str = "",
              seed_mode: str = "ignore", minimize_pairs: int = 3, doctor_max_repeats: int = 5,
              verify_pairs: int = 2, practical_margin: float = 0.01, num_finalists: int | None = None) -> Path:
    work = tmp / "fake"
    work.mkdir(exist_ok=True)
    shutil.copy(FAKE, work / "fake_workload.py")
    (work / "locked.txt").write_text("locked\n")
    lines = ['name = "fake"', 'workload_dir = "fake"', 'repository = "copy"',
             'command = ["{python}", "fake_workload.py", "--steps", "{num_steps}", "--seed", "{seed}", '
             f'"--seed-mode", "{seed_mode}", "--sleep", "0.3"]',  # a sleep knob's flag comes later and wins
             "baseline = {" + ", ".join(f"{k} = {json.dumps(v)}" for k, v in baseline.items()) + "}",
             f"calibration = {calibration}"]
    for name, values in knobs.items():
        lines += [f"[knobs.{name}]", f"values = {json.dumps(values)}", f'flag = "--{name}"']
    lines += ["[contract]", "seq_len = 128", "global_batch_tokens = 2048", "num_steps = 5", "warmup_steps = 1",
              'editable = ["fake_workload.py"]', 'locked = ["locked.txt"]',
              "[device]", "memory_capacity = 2147483648", "emulate_capacity = false",
              # sleeps are not slowed by other processes' CPU load: no re-measurements
              "[resources]", "cpus_per_trial = 1", "max_foreign_load_cores = 1000",
              "[budget]", "num_trials = 1", f"verify_pairs = {verify_pairs}", f"minimize_pairs = {minimize_pairs}",
              "doctor_repeats = 3", f"doctor_max_repeats = {doctor_max_repeats}",
              f"practical_margin = {practical_margin}", objective]
    if num_finalists is not None:  # unset: the spec's default
        lines.insert(lines.index("[budget]") + 1, f"num_finalists = {num_finalists}")
    path = tmp / "fake.toml"
    path.write_text("\n".join(lines) + "\n")
    return path
