"""The log adapter: a script that only prints its own log lines is measured unchanged, and
every way its output can fail to make metrics gets an error naming the spec field."""

import sys
from pathlib import Path

import pytest

from infrarsi.core.spec_metrics import MetricsSpec
from infrarsi.core.trial import Outcome, Role
from infrarsi.harness.launcher import TrialRequest, run_process_trial
from infrarsi.harness.log_adapter import LogAdapter, MetricsLineError

PRINT_JOB = str(Path(__file__).parent / "jobs" / "print_job.py")
STEP = r"iter (?P<step>\d+): loss (?P<loss>\S+),"
EVAL = r"step (?P<step>\d+): train loss \S+, val loss (?P<eval_loss>[-+0-9.eE]+)"
TOKENS = r"tokens per iteration will be: (?P<tokens>[\d,]+)"
NANOGPT = MetricsSpec(source="log", step_pattern=STEP, eval_pattern=EVAL, tokens_pattern=TOKENS)


def _run(tmp_path, *args, metrics=NANOGPT, steps=6):
    return run_process_trial(TrialRequest(
        trial_id="t1", config={}, role=Role.SEARCH, argv=(sys.executable, PRINT_JOB, "--steps", str(steps), *args),
        env={}, cwd=str(tmp_path), trial_dir=str(tmp_path / "t1"), memory_capacity_bytes=2**40,
        emulate_capacity=False, timeout_s=60, warmup_steps=1, num_steps=steps, metrics=metrics))


def test_lines_become_the_protocols_events():
    adapter = LogAdapter(NANOGPT)
    assert adapter.feed("initializing") == []
    assert adapter.feed("tokens per iteration will be: 12,288") == [
        {"event": "start", "tokens_per_step": 12288, "tokens_source": "log"}]
    # each loss carries the unit of the last digit it was printed with: the contract compares no finer
    assert adapter.feed("iter 0: loss 4.2000, time 31.2ms") == [
        {"event": "step", "step": 0, "loss": 4.2, "loss_quantum": pytest.approx(1e-4), "tokens": 12288}]
    assert adapter.feed("step 0: train loss 4.2, val loss 4.3000") == [
        {"event": "eval", "step": 0, "eval_loss": 4.3, "eval_loss_quantum": pytest.approx(1e-4)}]


def test_without_a_step_group_each_match_is_the_next_step_and_a_declared_constant_gives_tokens():
    adapter = LogAdapter(MetricsSpec(source="log", step_pattern=r"loss=(?P<loss>[0-9.]+)", tokens_per_step=64))
    assert adapter.initial_events() == [{"event": "start", "tokens_per_step": 64, "tokens_source": "declared"}]
    steps = [e for line in ("loss=3.0", "noise", "loss=2.5") for e in adapter.feed(line)]
    assert [(e["step"], e["loss"], e["tokens"]) for e in steps] == [(1, 3.0, 64), (2, 2.5, 64)]


def test_a_loss_that_is_not_a_number_names_the_pattern_and_the_line():
    adapter = LogAdapter(NANOGPT)
    with pytest.raises(MetricsLineError, match=r"metrics\.step_pattern matched the line 'iter 3: loss 4\.1\.2,', "
                                               r"but its group `loss` captured '4\.1\.2', which is not a number"):
        adapter.feed("iter 3: loss 4.1.2,")


def test_a_printing_script_is_measured_unchanged(tmp_path):
    r = _run(tmp_path)
    assert r.outcome is Outcome.OK, r.reason
    assert r.losses == pytest.approx([4.0 * 0.95 ** s for s in range(6)], abs=1e-4)
    assert r.eval_losses == pytest.approx([4.0 * 0.95 ** 2 + 0.1, 4.0 * 0.95 ** 5 + 0.1], abs=1e-4)
    assert r.tokens_per_step == 1024
    assert 0.015 < r.step_time_s < 0.5
    assert "iter 5: loss" in Path(r.log_path).read_text()  # the job's output is kept in log.txt


@pytest.mark.parametrize("args, reason", [
    (("--bad-loss-at", "2"), r"metrics\.step_pattern matched the line 'iter 2: loss 4\.1\.2, .*not a number"),
    (("--restart-at", "3"), r"the step counter went from 2 to 0; it must increase .*metrics\.step_pattern, "
                            r"line 'iter 0: loss"),
    (("--stream", "stderr"), r"reported 0 of 6 steps: the job wrote nothing to stdout \(metrics\.stream = 'stdout'\)"),
    (("--quiet",), r"(?s)metrics\.step_pattern .* matched none of the 8 lines the job wrote to stdout.*"
                   r"The job's last lines were:\n    initializing model.*\n    \[0\] training\.\.\. 4\.0000"),
])
def test_output_that_makes_no_valid_metrics_is_a_crash_naming_the_spec_field(tmp_path, args, reason):
    r = _run(tmp_path, *args)
    assert r.outcome is Outcome.CRASH
    assert r.extra["returncode"] == 0
    assert __import__("re").search(reason, r.reason), r.reason


def test_doctor_names_the_step_pattern_and_the_log_adapter_when_nothing_matched(tmp_path):
    from infrarsi.harness.metrics_events import explain_baseline_failure

    message = explain_baseline_failure(_run(tmp_path, "--quiet"))
    assert message.startswith("the baseline produced no metric lines in doctor")
    assert "metrics.step_pattern" in message and "[0] training... 4.0000" in message and "log adapter" in message
    assert "memory_capacity" not in message
