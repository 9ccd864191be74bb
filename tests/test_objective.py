"""The objective a user pays: step time, or with a declared job length, start-up plus
steps x step time."""

import tomllib

import pytest

from infrarsi.contract.spec_load import parse_spec
from infrarsi.core.errors import SpecError
from infrarsi.core.objective import job_steps, job_time_s
from infrarsi.core.spec import ObjectiveSpec
from infrarsi.stages.init import builtin_spec_path


def test_job_length_in_steps_or_hours_at_the_baseline_pace():
    assert job_steps(ObjectiveSpec(), 0.5, 10.0) is None
    assert job_steps(ObjectiveSpec(job_steps=300), 0.5, 10.0) == 300
    assert job_steps(ObjectiveSpec(job_hours=1), 0.5, 10.0) == pytest.approx((3600 - 10) / 0.5)
    assert job_time_s(0.1, 5.0, None) == 0.1 and job_time_s(0.1, 5.0, 100) == pytest.approx(15.0)


def test_a_spec_with_both_job_lengths_names_the_field(tmp_path):
    data = tomllib.loads(builtin_spec_path().read_text())
    with pytest.raises(SpecError, match="objective: Value error, give job_steps or job_hours, not both"):
        parse_spec({**data, "objective": {"job_steps": 10, "job_hours": 1.0}}, source="x.toml",
                   base_dir=builtin_spec_path().parent)


def test_the_summary_print_names_changes_checks_and_wall_time(capsys):
    from infrarsi.cli.main import _print_summary

    _print_summary({"verified_speedup": 1.9, "speedup_ci": [1.8, 2.0], "branch": "infrarsi/x", "repository": "/c/repo/job",
                    "end_to_end_speedup": 1.9, "step_speedup": 2.0, "job_steps": 10,
                    "promoted_changes": [{"knob": "sleep", "from": 0.3, "to": 0.15, "contribution": 1.4,
                                          "ci": [1.2, 1.6], "source": "measured", "ground": "pays"}],
                    "dropped_changes": [{"knob": "compile", "from": "off", "to": "on", "contribution": 0.85,
                                         "source": "predicted", "ground": "costs"}],
                    "canary_effective": False, "canary_note": "canary ineffective: the job ignores the seed",
                    "noise_estimate_weak": True, "campaign_wall_s": 31.2, "trials_by_outcome": {"ok": 15},
                    "failed_trial_seconds": 0, "report": "r.html"})
    out = capsys.readouterr().out
    assert "verified speedup 1.90x end to end" in out and "branch infrarsi/x in /c/repo/job" in out and "per step 2.00x; job of 10 steps" in out
    assert "sleep: 0.3 -> 0.15, measured 1.40x (90% CI 1.20-1.60); pays" in out
    assert "dropped compile: off -> on, predicted 0.85x; costs" in out  # a predicted figure says so
    assert "canary ineffective" in out and "weak" in out and "campaign wall time 31 s" in out
