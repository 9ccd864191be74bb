"""What a resumed or cache-served campaign keeps: the LLM's priors (asked once), doctor's
cache key (everything that changes what doctor measures), doctor's runs in MLflow."""

import math
from types import SimpleNamespace

import pytest
from mlflow import MlflowClient

from infrarsi.stages.doctor import DoctorReport
from infrarsi.stages.init import init_campaign
from infrarsi.stages.run.search import search_priors
from infrarsi.stages.runtime import CampaignRuntime, RuntimeSettings
from tasks.stages import _doctor_cache_key, adopt_doctor_task
from tests.llm_server import Reply, running_server


def _sim_spec(tmp, name="s.toml", extra=""):
    path = tmp / name
    path.write_text('name = "sim-promises"\nbackend = "sim"\nsim_workload = "dense-9b-h100"\n' + extra)
    return path


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """One store for the module: a new SQLite store's migrations take seconds."""
    return f"sqlite:///{tmp_path_factory.mktemp('store') / 'mlflow.db'}"


def _runtime(contract, cdir, store):
    return CampaignRuntime(contract, cdir, RuntimeSettings(tracking_uri=store))


def test_llm_priors_are_asked_once_and_kept_with_the_campaign(tmp_path, monkeypatch, store):
    monkeypatch.setenv("INFRARSI_TEST_LLM_KEY", "k")
    with running_server() as server:
        server.reply = Reply.json({"effects": [{"knob": "compile", "value": "true", "time_multiplier": 0.8,
                                                "memory_multiplier": 1.0, "confidence": 0.5, "rationale": "r"}]})
        spec = _sim_spec(tmp_path, extra=f'[llm]\nbase_url = "{server.base_url}"\nmodel = "test-model"\n'
                                         'api_key_env = "INFRARSI_TEST_LLM_KEY"\n')
        contract, cdir = init_campaign(spec, tmp_path / "out")
        first = search_priors(_runtime(contract, cdir, store))
        assert len(server.requests) == 1 and cdir.priors.exists()
        server.reply = Reply.json({"effects": []})  # a second answer would differ
        resumed = search_priors(_runtime(contract, cdir, store))
        assert len(server.requests) == 1
        assert resumed == first
        assert resumed.get("compile", True).log_time_mean == math.log(0.8)


def test_the_doctor_cache_key_covers_what_changes_doctor(tmp_path):
    def key(folder, extra=""):
        (tmp_path / folder).mkdir()
        contract, _ = init_campaign(_sim_spec(tmp_path / folder, extra=extra), tmp_path / folder / "out")
        return _doctor_cache_key(None, {"rt": SimpleNamespace(contract=contract)})

    base = key("a")
    assert key("b") == base  # where the campaign runs does not matter
    assert key("c", "[budget]\ndoctor_repeats = 5\n") != base
    assert key("d", "[budget]\ntrial_timeout_s = 60\n") != base
    assert key("e", "[search]\nseed = 3\n") != base


def test_doctor_served_from_the_cache_still_shows_its_runs_in_mlflow(tmp_path, store):
    contract, cdir = init_campaign(_sim_spec(tmp_path), tmp_path / "out")
    rt = _runtime(contract, cdir, store)
    report = DoctorReport(
        baseline=dict(contract.spec.baseline), trial_ids=("t0001", "t0002", "t0003"), step_time_s=1.0,
        run_step_times_s=(1.0, 1.1, 0.9), noise_cv=0.1, within_run_cv=0.01, reference_losses=(3.0, 2.9),
        loss_tolerance=0.01, loss_tolerance_source="spec", calibration=(), peak_memory_bytes=2**30,
        phases_s={}, tokens_per_step=None)
    adopt_doctor_task.fn(rt, report)
    client = MlflowClient(store)
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()],
                              f"tags.`infrarsi.campaign_id` = '{contract.campaign_id}' and tags.`infrarsi.kind` = 'trial'")
    assert sorted((r.data.tags["infrarsi.cached_from"], r.data.metrics["step_time_s"]) for r in runs) == [
        ("t0001", 1.0), ("t0002", 1.1), ("t0003", 0.9)]
    assert {r.data.tags["infrarsi.role"] for r in runs} == {"doctor"}
