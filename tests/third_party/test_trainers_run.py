"""Trainers written outside this project run, unmodified and offline, on the tiny inputs of fixtures.py.

Each test runs the launch command as a user would (a plain subprocess in the work folder) and
reads the losses from what the trainer itself printed. These are the ground the `infrarsi init`
tests stand on: if one fails here, the trainer or its fixture broke, not infrarsi.
"""

import os
import re
import subprocess
from pathlib import Path

import pytest

import fixtures

RUN_TIMEOUT_S = 300

# What each trainer prints once per optimizer step (one line per step at its logging interval of 1).
TRL_LOSS = re.compile(r"\{'loss': '(?P<loss>[^']+)'.*'num_tokens': '(?P<tokens>\d+)'")
LITGPT_LOSS = re.compile(r"\| iter (?P<iter>\d+) step (?P<step>\d+) \| loss train: (?P<loss>[\d.]+)")
TORCHTUNE_LOSS = re.compile(r"Step (?P<step>\d+) \| loss:(?P<loss>[\d.]+) ")
TORCHTITAN_LOSS = re.compile(r"step:\s*(?P<step>\d+)\s+(?:\x1b\[[0-9;]*m)?loss:\s*(?P<loss>[\d.]+)")


def run(launch: fixtures.Launch, hf_home: Path) -> str:
    """Run a launch command to the end; return its stdout and stderr together."""
    # The datasets cache goes outside the work folder, as a user's ~/.cache would.
    env = {**os.environ, **launch.env, "HF_HOME": str(hf_home)}
    done = subprocess.run(launch.argv, cwd=launch.cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, timeout=RUN_TIMEOUT_S)
    assert done.returncode == 0, f"{launch.argv[:3]} exited {done.returncode}:\n{done.stdout[-4000:]}"
    return done.stdout


def test_trl_sft_runs_offline_one_loss_per_step(tmp_path):
    pytest.importorskip("trl")
    output = run(fixtures.trl_sft(tmp_path / "work"), tmp_path / "hf_home")
    steps = [m.groupdict() for m in TRL_LOSS.finditer(output)]
    assert len(steps) == fixtures.NUM_STEPS
    assert all(0 < float(step["loss"]) < 20 for step in steps)
    # num_tokens is cumulative: every step trains on exactly the command's micro-batch x accumulation x length.
    assert [int(step["tokens"]) for step in steps] == [
        fixtures.TOKENS_PER_STEP * n for n in range(1, fixtures.NUM_STEPS + 1)]


def test_litgpt_pretrain_runs_offline_one_loss_per_step(tmp_path):
    pytest.importorskip("litgpt")
    pytest.importorskip("litdata")
    output = run(fixtures.litgpt_pretrain(tmp_path / "work"), tmp_path / "hf_home")
    steps = [m.groupdict() for m in LITGPT_LOSS.finditer(output)]
    # Logged at each accumulation boundary: iteration 2, 4, 6 for steps 1, 2, 3.
    assert [(int(s["iter"]), int(s["step"])) for s in steps] == [
        (fixtures.GRAD_ACCUM * n, n) for n in range(1, fixtures.NUM_STEPS + 1)]
    assert all(0 < float(step["loss"]) < 20 for step in steps)
    assert f"Total tokens  : {fixtures.NUM_STEPS * fixtures.TOKENS_PER_STEP:,}" in output
    assert "Preprocessed training data found" in output  # the fixture's tokens were used as litgpt's own


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("INFRARSI_THIRD_PARTY_LONG") != "1",
                    reason="a minute of litdata's own tokenizing: set INFRARSI_THIRD_PARTY_LONG=1")
def test_litgpt_first_run_tokenizes_as_the_fixture_does(tmp_path):
    """Without pretokenizing, litgpt runs litdata's optimize itself (about a minute here, in spawned
    workers) and writes the same chunk files that fixtures.litgpt_pretrain writes directly. Run it
    where litgpt, litdata or the fixture changes (INFRARSI_THIRD_PARTY_LONG=1)."""
    pytest.importorskip("litgpt")
    pytest.importorskip("litdata")
    output = run(fixtures.litgpt_pretrain(tmp_path / "cold", pretokenize=False), tmp_path / "hf_home")
    assert "Finished data processing!" in output
    assert len(LITGPT_LOSS.findall(output)) == fixtures.NUM_STEPS
    fixtures.litgpt_pretrain(tmp_path / "warm", pretokenize=True)
    for split in ("train", "val"):
        made_by_litgpt = (tmp_path / "cold" / "data" / split / "chunk-0-0.bin").read_bytes()
        made_by_fixture = (tmp_path / "warm" / "data" / split / "chunk-0-0.bin").read_bytes()
        assert made_by_litgpt == made_by_fixture


def test_torchtune_full_finetune_runs_offline_one_loss_per_step(tmp_path):
    pytest.importorskip("torchtune")
    pytest.importorskip("torchao")
    output = run(fixtures.torchtune_full_finetune(tmp_path / "work"), tmp_path / "hf_home")
    steps = [m.groupdict() for m in TORCHTUNE_LOSS.finditer(output)]
    assert [int(s["step"]) for s in steps] == list(range(1, fixtures.NUM_STEPS + 1))
    assert all(0 < float(step["loss"]) < 20 for step in steps)


def test_torchtitan_train_runs_one_loss_per_step(tmp_path):
    pytest.importorskip("torchtitan")
    pytest.importorskip("triton", reason="torchtitan 0.3.0 imports triton at start-up")
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torchtitan 0.3.0 needs a CUDA device: with none it still selects 'cuda' and fails "
                    "in torch.cuda.set_device (pytorch/torchtitan#1661, CPU mode, is open)")
    output = run(fixtures.torchtitan_train(tmp_path / "work"), tmp_path / "hf_home")
    steps = [m.groupdict() for m in TORCHTITAN_LOSS.finditer(output)]
    assert [int(s["step"]) for s in steps] == list(range(1, fixtures.NUM_STEPS + 1))
