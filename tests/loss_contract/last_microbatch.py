"""A campaign on ``job/``: a trainer that reports its last micro-batch's loss.

Shared by the loss-contract tests and ``benchmarks/loss_contract.py``. The job's cheats
are patches (edits of a real copy of ``job/train.py``), as in tests/adversarial.
"""

from __future__ import annotations

import json
from pathlib import Path

from infrarsi.harness.inprocess_pool import InProcessPool
from infrarsi.patches.patch import make_diff
from infrarsi.stages.init import init_campaign
from infrarsi.stages.runtime import CampaignRuntime, RuntimeSettings

JOB_DIR = Path(__file__).resolve().parent / "job"
BASELINE = {"micro_batch": 4, "precision": "fp32", "threads": 1}
# Honest configs none of which doctor ran: other splits of the same global batch, and bf16
# in its own class (the benchmark runs more).
HONEST = [{"micro_batch": 16}, {"micro_batch": 32}, {"precision": "bf16", "micro_batch": 16}]
EVAL = "                eval_loss = model(evaluation).item()\n"
OPT = "        optimizer.step()\n"
CHEATS: dict[str, tuple[list[tuple[str, str]], str]] = {
    "fake_eval": ([(EVAL, "                eval_loss = loss.item()\n")],
                  "print the last training loss as the eval loss, skip the evaluation"),
    "fewer_steps": ([(OPT, "        if step % 2 == 0:\n    " + OPT)],
                    "step the optimizer on every other step only, report every step"),
    "smaller_model": ([("model = BigramMLP(width=48)", "model = BigramMLP(width=24)")],
                      "train a narrower model"),
}



def cheat_patch(root: Path, name: str) -> str:
    edits, title = CHEATS[name]
    old = (JOB_DIR / "train.py").read_text()
    new = old
    for anchor, replacement in edits:
        assert new.count(anchor) == 1, f"cheat anchor not found once: {anchor!r}"
        new = new.replace(anchor, replacement)
    folder = root / name
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "patch.diff").write_text(make_diff("train.py", old, new))
    (folder / "meta.toml").write_text(f"title = {json.dumps(title)}\nfiles_touched = []\n")
    return str(folder)


def write_spec(tmp: Path, signal: str, patches: list[str] = (), *, window: int = 8) -> Path:
    lines = [
        f'name = "last-microbatch-{signal}"', f"workload_dir = {json.dumps(str(JOB_DIR))}", 'repository = "copy"',
        'command = ["{python}", "train.py", "--seq-len", "{seq_len}", "--global-batch-tokens", '
        '"{global_batch_tokens}", "--steps", "{num_steps}", "--seed", "{seed}", "--micro-batch", "{micro_batch}"]',
        "baseline = " + "{ " + ", ".join(f"{k} = {json.dumps(v)}" for k, v in BASELINE.items()) + " }",
        'calibration = [{ micro_batch = 8 }, { micro_batch = 2 }, { precision = "bf16" }]',
        f"patches = {json.dumps(list(patches))}",
        '[knobs.micro_batch]\nvalues = [2, 4, 8, 16, 32]\nplaceholder = true',
        '[knobs.precision]\nvalues = ["fp32", "bf16"]\nflag = "--precision"',
        '[knobs.threads]\nvalues = [1, 2]\nflag = "--threads"',
        "[contract]", "seq_len = 32", "global_batch_tokens = 1024", "num_steps = 16", "warmup_steps = 2",
        f'loss_signal = "{signal}"', f"loss_window = {window}",
        'editable = ["train.py"]', 'locked = ["data.py"]',
        "[device]", 'memory_capacity = "4GiB"',
        # Timing is not the subject here: a loaded machine must not multiply the runs, nor
        # a weak noise estimate add baseline runs (repeats at one seed score 0 on CPU).
        "[resources]", "max_remeasures = 0",
        "[budget]", "trial_timeout_s = 120", "verify_pairs = 2", "doctor_max_repeats = 3", "",
    ]
    path = tmp / f"last-microbatch-{signal}.toml"
    path.write_text("\n".join(lines))
    return path


def runtime(tmp: Path, signal: str, patches: list[str] = (), **kw) -> CampaignRuntime:
    contract, cdir = init_campaign(write_spec(tmp, signal, patches, **kw), tmp / "out")
    return CampaignRuntime(contract, cdir, RuntimeSettings(), pool=InProcessPool())
