"""The metrics protocol's contract with a job: the spec section validates itself naming the
field, the JSON-lines events are checked as they arrive, and a baseline that reports no
step sends the user to the metrics protocol, not to memory or timeout settings."""

import json
import sys
import tomllib
from pathlib import Path

import pytest

from infrarsi.contract.spec_load import parse_spec
from infrarsi.core.errors import ContractError, SpecError
from infrarsi.core.trial import Outcome, Role
from infrarsi.harness.inprocess_pool import InProcessPool
from infrarsi.harness.launcher import TrialRequest, run_process_trial
from infrarsi.harness.metrics_events import explain_baseline_failure
from infrarsi.stages.init import builtin_spec_path

BUILTIN = tomllib.loads(builtin_spec_path().read_text())
STEP = r"iter (?P<step>\d+): loss (?P<loss>\S+),"
# Writes each argument as one line to the metrics file, 10 ms apart, then exits 0.
WRITE_LINES = "import os, sys, time\nwith open(os.environ['INFRARSI_METRICS_FILE'], 'a') as f:\n" \
              "    for line in sys.argv[1:]:\n        time.sleep(0.01); f.write(line + '\\n'); f.flush()\n"


def _parse(metrics: dict):
    data = {**BUILTIN, "workload_dir": str(builtin_spec_path().parent), "metrics": metrics}
    return parse_spec(data, source="spec.toml", base_dir=Path("."))


@pytest.mark.parametrize("metrics, expected", [
    ({"source": "log", "step_pattern": "iter (\\d+", "tokens_per_step": 4096},
     r"metrics\.step_pattern: Value error, is not a valid regular expression \(missing \), unterminated subpattern"),
    ({"source": "log", "step_pattern": r"loss (?P<value>\S+)", "tokens_per_step": 4096},
     r"metrics\.step_pattern: Value error, needs the named group\(s\) \['loss'\].*found groups \['value'\]"),
    ({"source": "log", "step_pattern": STEP, "tokens_per_step": 4096, "eval_pattern": r"val (?P<loss>\S+)"},
     r"metrics\.eval_pattern: Value error, needs the named group\(s\) \['eval_loss'\]"),
    ({"source": "log", "step_pattern": r"(?P<loss>\S+) (?P<lr>\S+)", "tokens_per_step": 4096},
     r"metrics\.step_pattern: Value error, has unknown named group\(s\) \['lr'\]"),
    ({"source": "log", "tokens_per_step": 4096}, r"metrics: Value error, metrics\.step_pattern is required"),
    ({"source": "log", "step_pattern": STEP},
     r"needs metrics\.tokens_pattern .* or metrics\.tokens_per_step .*found neither"),
    ({"source": "log", "step_pattern": STEP, "tokens_per_step": 8192},
     r"metrics\.tokens_per_step \(8192\) must equal contract\.global_batch_tokens \(4096\)"),
    ({"step_pattern": STEP}, r"metrics\.step_pattern applies to source = 'log' only"),
    ({"source": "stdout"}, r"metrics\.source: Input should be 'jsonl' or 'log'"),
])
def test_a_broken_metrics_section_fails_at_load_naming_the_field(metrics, expected):
    with pytest.raises(SpecError, match=expected):
        _parse(metrics)


def test_a_valid_log_section_loads_and_the_default_is_jsonl():
    assert _parse({}).metrics.source == "jsonl"
    spec = _parse({"source": "log", "stream": "both", "step_pattern": STEP, "tokens_per_step": 4096})
    assert spec.metrics.stream == "both" and spec.metrics.tokens_per_step == 4096


def _jsonl_trial(tmp_path, *events):
    lines = [e if isinstance(e, str) else json.dumps(e) for e in events]
    return run_process_trial(TrialRequest(
        trial_id="t1", config={}, role=Role.SEARCH, argv=(sys.executable, "-c", WRITE_LINES, *lines), env={},
        cwd=str(tmp_path), trial_dir=str(tmp_path / "t1"), memory_capacity_bytes=2**40, emulate_capacity=False,
        timeout_s=30, warmup_steps=1, num_steps=3))


def _step(step, loss):
    return {"event": "step", "step": step, "loss": loss, "tokens": 64}


@pytest.mark.parametrize("events, reason", [
    ([_step(1, 3.0), _step(2, "2.9"), _step(3, 2.8)], r"the loss '2\.9' is not a finite number \(line 2 of "),
    ([_step(1, 3.0), '{"event": "step", "step": 2, "loss": NaN}', _step(3, 2.8)], r"the loss nan is not a finite"),
    ([_step(5, 3.0), _step(6, 2.9), _step(2, 2.8)], r"the step counter went from 6 to 2; it must increase"),
    ([{"event": "step", "step": 1}], r"a step event has no loss"),
    ([{**_step(1, 3.0), "tokens": "64"}], r"tokens '64' is not an integer"),
    ([{**_step(1, 3.0), "loss_quantum": 0}], r"loss_quantum 0 is not a positive number"),
    ([], r"reported 0 of 3 steps: no metrics line arrived through \$INFRARSI_METRICS_FILE"),
])
def test_bad_jsonl_events_are_a_crash_that_says_what_was_wrong(tmp_path, events, reason):
    r = _jsonl_trial(tmp_path, *events)
    assert r.outcome is Outcome.CRASH
    assert __import__("re").search(reason, r.reason), r.reason


def test_a_declared_loss_quantum_is_the_trials_and_a_whole_loss_has_none(tmp_path):
    rounded = _jsonl_trial(tmp_path, *({**_step(i, 3.0 - i / 10), "loss_quantum": 1e-4} for i in (1, 2, 3)))
    assert rounded.outcome is Outcome.OK and rounded.loss_quantum == 1e-4
    whole = _jsonl_trial(tmp_path / "whole", *(_step(i, 3.0 - i / 10) for i in (1, 2, 3)))
    assert whole.outcome is Outcome.OK and whole.loss_quantum is None


def test_the_events_and_their_arrival_stamps_are_kept_as_evidence(tmp_path):
    r = _jsonl_trial(tmp_path, {"event": "start", "tokens_per_step": 64}, _step(1, 3.0), _step(2, 2.9),
                     _step(3, 2.8), {"event": "eval", "step": 3, "eval_loss": 2.75})
    assert r.outcome is Outcome.OK, r.reason
    assert r.tokens_per_step == 64 and r.eval_losses == (2.75,)
    kept = [json.loads(ln) for ln in (Path(r.log_path).parent / "metrics.jsonl").read_text().splitlines()]
    assert [e["event"] for e in kept] == ["start", "step", "step", "step", "eval"]
    assert all(0 < e["harness_t_s"] < 30 for e in kept)
    assert not (Path(r.log_path).parent / "metrics.fifo").exists()


def test_a_baseline_without_metric_lines_is_explained_by_the_protocol_not_by_limits(tmp_path):
    r = _jsonl_trial(tmp_path)
    message = explain_baseline_failure(r)
    assert message.startswith("the baseline produced no metric lines in doctor (crash: the job exited 0")
    assert "metrics protocol" in message and "log adapter" in message and "$INFRARSI_METRICS_FILE" in message
    assert "memory_capacity" not in message and "trial_timeout_s" not in message


LIMITS = ("memory_capacity", "trial_timeout_s")


@pytest.mark.parametrize("outcome, returncode, reason, says, not_about", [
    # a crash with an ordinary error is about the job, not about memory or time
    (Outcome.CRASH, 1, "exit code 1: AssertionError", "The job failed", LIMITS),
    # steps that reached the harness together: about what the job reports (flushing), not limits
    (Outcome.CRASH, 0, "3 of 3 measured steps reached the harness at the same instant as the step before",
     "docs/metrics-protocol.md", LIMITS),
    (Outcome.OOM, None, "peak memory 9 B crossed the capacity 8 B", "Raise device.memory_capacity",
     ("trial_timeout_s",)),
    (Outcome.TIMEOUT, None, "no exit within 30 s; process tree killed", "Raise budget.trial_timeout_s",
     ("memory_capacity",)),
])
def test_a_failed_baseline_gets_advice_that_fits_the_cause(tmp_path, outcome, returncode, reason, says, not_about):
    r = _jsonl_trial(tmp_path, _step(1, 3.0), _step(2, 2.9), _step(3, 2.8))
    failed = r.replace(outcome=outcome, reason=reason, extra={**r.extra, "returncode": returncode})
    message = explain_baseline_failure(failed)
    assert message.startswith(f"the baseline config failed in doctor ({outcome.value}: {reason})") and says in message
    assert not any(word in message for word in not_about), message


def test_doctor_stops_on_a_baseline_that_prints_no_metric_lines(tmp_path):
    from infrarsi.stages.doctor import run_doctor
    from infrarsi.stages.init import init_campaign
    from infrarsi.stages.runtime import CampaignRuntime, RuntimeSettings

    job = tmp_path / "job"
    job.mkdir()
    (job / "train.py").write_text(Path(__file__).with_name("jobs").joinpath("print_job.py").read_text())
    (job / "data.txt").write_text("locked\n")
    spec = tmp_path / "campaign.toml"
    spec.write_text("\n".join([
        'name = "printer"', 'workload_dir = "job"', 'repository = "copy"',
        'command = ["{python}", "train.py", "--steps", "{num_steps}"]', "baseline = { eval_every = 3 }",
        "[knobs.eval_every]", "values = [3, 0]", 'flag = "--eval-every"',
        "[contract]", "seq_len = 128", "global_batch_tokens = 1024", "num_steps = 4", "warmup_steps = 1",
        'editable = ["train.py"]', 'locked = ["data.txt"]', "[device]", 'memory_capacity = "4GiB"',
        "[budget]", "trial_timeout_s = 30", ""]))
    contract, cdir = init_campaign(spec, tmp_path / "out")
    rt = CampaignRuntime(contract, cdir, RuntimeSettings(tracking_uri=f"file://{tmp_path / 'mlruns'}"),
                         pool=InProcessPool())
    try:
        with pytest.raises(ContractError, match=r"(?s)the baseline produced no metric lines in doctor.*"
                                                r"metrics protocol.*log adapter"):
            run_doctor(rt)
    finally:
        rt.close()

