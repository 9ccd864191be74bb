"""The Reporter: what a training script calls once per optimizer step. Import-light, rank 0
only, and strict about what it writes."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from infrarsi.job.reporter import Reporter

REPO = Path(__file__).resolve().parents[1]
HEAVY = ("prefect", "ray", "mlflow", "torch", "optuna", "git", "openai", "pydantic", "numpy")


def test_importing_the_reporter_pulls_in_the_standard_library_only():
    code = ("import sys, infrarsi.job.reporter\n"
            f"print(sorted({{m.split('.')[0] for m in sys.modules}} & set({HEAVY!r})))")
    out = subprocess.run([sys.executable, "-X", "importtime", "-c", code], capture_output=True, text=True,
                         check=True, cwd=REPO)
    assert out.stdout.strip() == "[]"
    imported = {ln.split("|")[-1].strip().split(".")[0] for ln in out.stderr.splitlines() if "|" in ln}
    assert "infrarsi" in imported and not imported & set(HEAVY)


def test_events_go_to_the_metrics_file_one_json_object_per_line(tmp_path, monkeypatch):
    path = tmp_path / "metrics.jsonl"
    monkeypatch.setenv("INFRARSI_METRICS_FILE", str(path))
    monkeypatch.delenv("RANK", raising=False)
    rep = Reporter()
    rep.start(seq_len=256, tokens_per_step=8192)
    rep.step(1, 3.25, tokens=8192, step_time_s=0.5, peak_memory_bytes=10)
    rep.eval(1, 3.5)
    rep.end()
    assert [json.loads(ln) for ln in path.read_text().splitlines()] == [
        {"event": "start", "seq_len": 256, "tokens_per_step": 8192},
        {"event": "step", "step": 1, "loss": 3.25, "tokens": 8192, "step_time_s": 0.5, "peak_memory_bytes": 10},
        {"event": "eval", "step": 1, "eval_loss": 3.5},
        {"event": "end"}]


def test_without_the_harness_it_prints_and_other_ranks_stay_silent(monkeypatch, capsys):
    monkeypatch.delenv("INFRARSI_METRICS_FILE", raising=False)
    monkeypatch.setenv("RANK", "1")
    silent = Reporter()
    silent.step(1, 2.0)
    assert not silent.enabled and capsys.readouterr().out == ""
    monkeypatch.setenv("RANK", "0")
    Reporter().step(1, 2.0)
    assert json.loads(capsys.readouterr().out) == {"event": "step", "step": 1, "loss": 2.0}


def test_a_loss_that_is_not_a_number_or_a_step_that_does_not_increase_is_refused(monkeypatch):
    monkeypatch.delenv("INFRARSI_METRICS_FILE", raising=False)
    rep = Reporter(rank=0)
    with pytest.raises(TypeError, match="loss must be a number, got str 'n/a'"):
        rep.step(1, "n/a")
    rep.step(1, 2.0)
    with pytest.raises(ValueError, match="step 1 does not increase on the previous step 1"):
        rep.step(1, 1.9)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_a_loss_that_is_not_finite_is_refused_and_nothing_is_written(tmp_path, bad):
    path = tmp_path / "metrics.jsonl"
    rep = Reporter(str(path), rank=0)
    with pytest.raises(ValueError, match=rf"^loss must be a finite number, got {bad}: the run has diverged; stop"):
        rep.step(1, bad)
    with pytest.raises(ValueError, match=rf"^eval_loss must be a finite number, got {bad}: the run has diverged"):
        rep.eval(1, bad)
    with pytest.raises(ValueError, match=rf"^step_time_s must be a finite number, got {bad}: pass the seconds"):
        rep.step(1, 2.0, step_time_s=bad)
    rep.step(1, 2.0)  # the refused step 1 was not counted
    rep.end()
    assert [json.loads(ln) for ln in path.read_text().splitlines()] == [
        {"event": "step", "step": 1, "loss": 2.0}, {"event": "end"}]
