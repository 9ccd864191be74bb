"""The framework callbacks on real tiny runs under the harness: every optimizer step of a
Hugging Face Trainer and of a Lightning Trainer arrives as one step event, with the loss
the framework computed and the tokens it trained on."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from infrarsi.core.trial import Outcome, Role
from infrarsi.harness.launcher import TrialRequest, run_process_trial

JOBS = Path(__file__).parent / "jobs"
REPO = Path(__file__).resolve().parents[1]


def _trial(tmp_path, script, steps, *args):
    # The job imports infrarsi from this checkout, as a user's script would from its install.
    env = {"PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    return run_process_trial(TrialRequest(
        trial_id="t1", config={}, role=Role.SEARCH, argv=(sys.executable, str(JOBS / script), "--steps", str(steps),
                                                          "--history", str(tmp_path / "history.json"), *args),
        env=env, cwd=str(tmp_path), trial_dir=str(tmp_path / "t1"), memory_capacity_bytes=2**40,
        emulate_capacity=False, timeout_s=120, warmup_steps=1, num_steps=steps))


def _events(r):
    return [json.loads(ln) for ln in (Path(r.log_path).parent / "metrics.jsonl").read_text().splitlines()]


def test_the_callbacks_import_nothing_until_used():
    code = "import sys, infrarsi.job; print(any(m.split('.')[0] in ('transformers', 'lightning') " \
           "for m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    assert out.stdout.strip() == "False"


def test_a_hugging_face_trainer_reports_every_optimizer_step(tmp_path):
    r = _trial(tmp_path, "hf_job.py", 6, "--out", str(tmp_path / "hf-out"))
    assert r.outcome is Outcome.OK, r.reason
    history = json.loads((tmp_path / "history.json").read_text())
    logged = [h["loss"] for h in history if "loss" in h]
    # logging_steps = 50 in the script: the callback still gets a loss for each of the 6 steps
    assert r.losses == pytest.approx(logged) and len(r.losses) == 6
    assert r.tokens_per_step == 4 * 2 * 32  # counted by the Trainer: micro-batch x accumulation x seq
    assert r.eval_losses == pytest.approx([h["eval_loss"] for h in history if "eval_loss" in h])
    assert len(r.eval_losses) == 2
    steps = [e for e in _events(r) if e["event"] == "step"]
    assert [e["step"] for e in steps] == [1, 2, 3, 4, 5, 6]
    assert r.extra["start"]["seq_len"] == 32 and r.extra["start"]["grad_accum_steps"] == 2


def test_a_lightning_trainer_reports_every_optimizer_step(tmp_path):
    r = _trial(tmp_path, "lightning_job.py", 5)
    assert r.outcome is Outcome.OK, r.reason
    micro = json.loads((tmp_path / "history.json").read_text())
    assert len(micro) == 10  # accumulation 2: two micro-batches per optimizer step
    expected = [(micro[2 * i] + micro[2 * i + 1]) / 2 for i in range(5)]
    assert r.losses == pytest.approx(expected, rel=1e-5)
    assert r.tokens_per_step == 2 * 4 * 16
    assert len(r.eval_losses) == 2  # validation after training batches 4 and 8
    assert [e["step"] for e in _events(r) if e["event"] == "eval"] == [2, 4]
