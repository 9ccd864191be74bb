"""The promoted config file apply stages on the branch: TOML that tomllib reads back to the
values the campaign decided, whatever the values hold (quotes, inf and NaN, a value not set)."""

import math
import tomllib

import pytest

from infrarsi.contract.freeze import Contract
from infrarsi.contract.spec_load import parse_spec
from infrarsi.stages.apply import promoted_file
from infrarsi.stages.doctor import DoctorReport
from infrarsi.stages.run.verify import Verdict, VerificationReport

QUOTED = 'say"hi\\'  # a quote and a backslash: both need escaping in a TOML string


@pytest.fixture
def contract(tmp_path):
    (tmp_path / "train.py").write_text("print('train')\n")
    spec = parse_spec({
        "name": "apply", "workload_dir": ".", "command": ["{python}", "train.py", "--steps", "{num_steps}"],
        "knobs": {"label": {"values": ["plain", QUOTED], "env": "LABEL"},
                  "scale": {"values": [1.0, 0.5], "flag": "--scale"},
                  "fast": {"values": [False, True], "flag": "--fast", "flag_style": "switch"},
                  # inf: no clipping, as trainers spell it
                  "max_grad_norm": {"values": [1.0, math.inf], "flag": "--max-grad-norm"}},
        "baseline": {"label": "plain", "scale": 1.0, "fast": False, "max_grad_norm": 1.0},
        "contract": {"seq_len": 4, "global_batch_tokens": 8, "num_steps": 3, "warmup_steps": 1,
                     "locked": ["train.py"]},
        "device": {"memory_capacity": "1GiB"}}, source="apply.toml", base_dir=tmp_path)
    return Contract(campaign_id="c-apply", spec=spec, spec_source="apply.toml", workdir=tmp_path,
                    locked_hashes={}, editable_files=(), source_hash="s", hardware={}, hardware_hash="h",
                    created_at="2026-01-01T00:00:00")


def _doctor(step_time_s: float) -> DoctorReport:
    return DoctorReport(baseline={"label": "plain", "scale": 1.0, "fast": False, "max_grad_norm": 1.0}, trial_ids=("t0001",),
                        step_time_s=step_time_s, run_step_times_s=(step_time_s,), noise_cv=0.01,
                        within_run_cv=0.0, reference_losses=(), loss_tolerance=1e-5, loss_tolerance_source="test",
                        calibration=(), peak_memory_bytes=2**20, phases_s={}, tokens_per_step=None)


def _report(config: dict, **verdict) -> VerificationReport:
    v = Verdict(config=config, source_trial_id="t0009", pairs=(("t0010", "t0011"), ("t0012", "t0013")),
                baseline_times_s=(0.3, 0.3), candidate_times_s=(0.2, 0.2), speedup=1.23456, ci_low=1.1,
                ci_high=float("inf"), promoted=True, reason="cleared", **verdict)
    return VerificationReport(verdicts=(v,), margin=0.01)


def test_the_promoted_file_is_toml_that_reads_back_to_the_promoted_values(contract):
    config = {"label": QUOTED, "scale": 0.5, "fast": True, "max_grad_norm": math.inf}
    text = promoted_file(contract, _doctor(0.3123456789), _report(config, step_speedup=float("nan")))
    data = tomllib.loads(text)
    assert data["config"] == config
    assert data["launch"] == {"command": ["python", "train.py", "--steps", "3", "--scale", "0.5", "--fast",
                                          "--max-grad-norm", "inf"],
                              "env": {"LABEL": QUOTED}}
    evidence = data["evidence"]
    assert evidence["campaign_id"] == "c-apply" and evidence["contract_hash"] == contract.contract_hash
    assert evidence["baseline_step_time_s"] == 0.312346 and evidence["speedup"] == 1.2346
    assert evidence["ci_low"] == 1.1 and evidence["ci_high"] == math.inf and math.isnan(evidence["step_speedup"])
    assert evidence["pairs"] == [["t0010", "t0011"], ["t0012", "t0013"]]
    # TOML has no null: a value not set is left out, and the file says so
    assert "job_steps" not in evidence and "canary_effective" not in evidence
    assert "# job_steps: not set" in text and "# canary_effective: not set" in text
    assert text.startswith("# Promoted by infrarsi campaign c-apply.\n# Verified speedup 1.235x")


def test_a_declared_job_length_and_the_canary_outcome_are_written_as_toml_values(contract):
    report = _report({"label": "plain", "scale": 0.5, "fast": False, "max_grad_norm": 1.0}, job_steps=1000.0, step_speedup=1.5)
    report = VerificationReport(verdicts=report.verdicts, margin=0.01, canary_effective=False)
    evidence = tomllib.loads(promoted_file(contract, _doctor(0.3), report))["evidence"]
    assert evidence["job_steps"] == 1000 and isinstance(evidence["job_steps"], int)
    assert evidence["canary_effective"] is False and evidence["step_speedup"] == 1.5
