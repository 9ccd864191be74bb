"""The campaign options: one model for the CLI and the flow, checked before anything runs."""

import subprocess
import sys
import typing

import pytest

from infrarsi.contract.spec_load import load_spec
from infrarsi.core.errors import SpecError
from infrarsi.core.options import CampaignOptions, ProposerName
from infrarsi.proposers import proposer_names
from infrarsi.stages.init import builtin_spec_path, git_spec, resolved_options, start_campaign


def test_the_proposer_enum_is_the_registry():
    assert sorted(typing.get_args(ProposerName)) == proposer_names()


def test_every_option_is_described_and_bounded():
    schema = CampaignOptions.model_json_schema()
    assert all(field.get("description") for field in schema["properties"].values())
    with pytest.raises(SpecError, match=r"budget: Input should be greater than or equal to 1 \(got 0\)"):
        CampaignOptions.parse({"budget": 0})
    with pytest.raises(SpecError, match="proposer: Input should be 'engine', 'gp', 'greedy', 'random' or 'tpe'"):
        CampaignOptions.parse({"proposer": "bogus"})


def test_the_cli_refuses_a_bad_proposer_before_anything_starts(tmp_path):
    out = subprocess.run([sys.executable, "-m", "infrarsi.cli", "campaign", "--proposer", "bogus",
                          "--out", str(tmp_path / "o")], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "invalid choice: 'bogus'" in out.stderr
    assert not (tmp_path / "o").exists()


def test_a_spec_naming_an_unknown_proposer_fails_before_the_folder_exists(tmp_path):
    spec = tmp_path / "s.toml"
    spec.write_text('name = "x"\nbackend = "sim"\nsim_workload = "dense-9b-h100"\n[search]\nproposer = "bogus"\n')
    with pytest.raises(SpecError, match=r"search.proposer: expected one of .* found 'bogus'"):
        start_campaign(CampaignOptions(spec=str(spec), out=str(tmp_path / "o")))
    assert not (tmp_path / "o").exists()


def test_resolved_options_record_what_is_used(monkeypatch, tmp_path):
    monkeypatch.setenv("INFRARSI_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    spec = load_spec(builtin_spec_path())
    assert resolved_options(CampaignOptions(concurrency=2), spec) == {
        "proposer": spec.search.proposer, "budget": spec.budget.num_trials, "concurrency": 2,
        "tracking_uri": f"sqlite:///{tmp_path / 'data' / 'mlflow.db'}"}
    remembered = {"proposer": "tpe", "budget": 7, "tracking_uri": "sqlite:////x.db"}
    assert CampaignOptions(resume="d", budget=9).over(remembered).persisted() == {
        "proposer": "tpe", "budget": 9, "tracking_uri": "sqlite:////x.db"}


def test_git_specs():
    assert git_spec("specs/tune.toml") is None
    assert git_spec("https://host/team/job.git#tune/campaign.toml@v2") == (
        "https://host/team/job.git", "tune/campaign.toml", "v2")
    assert git_spec("git@host:team/job.git") == ("git@host:team/job.git", "campaign.toml", None)
