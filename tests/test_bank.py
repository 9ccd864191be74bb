"""The experience bank: SQLite round trip, similarity, what a new campaign reads, the CLI,
and the campaign flow writing it, reading it, and leaving it alone under --no-bank."""

from __future__ import annotations

import json
import math

import pytest

from infrarsi.backends.backend import sim_features
from infrarsi.bank.records import CampaignRecord
from infrarsi.bank.similarity import distance, nearest, nearest_records, project
from infrarsi.bank.sqlite import Bank
from infrarsi.bank.store import open_bank
from infrarsi.cli.main import main
from infrarsi.core.ledger import Ledger
from infrarsi.core.trial import Outcome, Role, TrialResult
from infrarsi.core.workspace import CampaignDir
from infrarsi.sim import sim_workload

H100 = {"gpu": "h100-sxm-80gb", "num_devices": 8, "memory_bytes": 80 * 2**30, "cpu": None}
A100 = {**H100, "gpu": "a100-80gb"}
DENSE = {"num_params": 9e9, "num_layers": 32, "seq_len": 4096, "moe": False, "tokens_per_step": 262144}


def trial(i: int, config: dict, outcome: Outcome = Outcome.OK, step: float = 1.0) -> TrialResult:
    return TrialResult(trial_id=f"t{i}", config=config, role=Role.SEARCH, outcome=outcome, step_time_s=step,
                       peak_memory_bytes=1000 + i, reason="" if outcome is Outcome.OK else "boom")


def record(cid: str, hw: dict, wl: dict, trials: list[TrialResult], **kw) -> CampaignRecord:
    return CampaignRecord(**{"baseline": {"a": 1, "b": "x"}, **kw}, id=cid, name=cid, backend="sim", proposer="engine",
                          hardware=hw, workload=wl, baseline_step_time_s=2.0, trials=tuple(trials))


def test_a_campaign_round_trips_through_sqlite_and_can_be_forgotten(tmp_path):
    bank = Bank(tmp_path / "bank.sqlite")
    rec = record("c1", H100, DENSE, [trial(1, {"a": 2, "b": "x"}, step=0.5), trial(2, {"a": 4}, Outcome.OOM)],
                 effects=({"knob": "a", "value": 2, "log_time_effect": -0.7, "log_time_sd": 0.1,
                           "log_memory_effect": 0.2, "log_memory_sd": 0.1},),
                 patches=({"name": "p", "source": "builtin", "accepted": True, "reason": None, "log_time_effect": -0.03,
                           "patch": {"name": "p"}},), promoted={"a": 2, "b": "x"}, prior_revision=[{"knob": "a"}])
    bank.add(rec)
    bank.add(rec)  # recorded again (a resumed campaign): replaced, not doubled
    [row] = bank.list()
    assert row["id"] == "c1" and row["num_trials"] == 2 and row["best_step_time_s"] == 0.5
    back = Bank(tmp_path / "bank.sqlite").get("c1")
    assert back.trials == rec.trials and back.effects == rec.effects and back.patches == rec.patches
    assert back.hardware == H100 and back.promoted == rec.promoted and back.best.trial_id == "t1"
    assert bank.forget("c1") and bank.list() == [] and not bank.forget("c1")


def test_the_bank_is_off_or_at_a_path(tmp_path, monkeypatch):
    assert open_bank("off") is None
    monkeypatch.setenv("INFRARSI_BANK", str(tmp_path / "env.sqlite"))
    assert open_bank(None).path == tmp_path / "env.sqlite"
    assert open_bank(tmp_path / "x.sqlite").path == tmp_path / "x.sqlite"


def test_distance_orders_hardware_and_workload_changes():
    same = distance(H100, DENSE, H100, DENSE)
    bigger = distance(H100, DENSE, H100, {**DENSE, "num_params": 27e9, "num_layers": 64})
    other_gpu = distance(H100, DENSE, A100, DENSE)
    moe = distance(H100, DENSE, H100, {**DENSE, "moe": True})
    assert same == 0 < bigger < other_gpu <= moe
    hw, wl = sim_features("dense-9b-h100")
    assert hw["gpu"] == "h100-sxm-80gb" and wl["moe"] is False and wl["tokens_per_step"] == 4096 * 64


def test_configs_are_projected_onto_the_new_space():
    space = sim_workload("debug").space
    base = dict(sim_workload("debug").baseline)
    assert project({"tp": 2, "dp": 2, "unknown_knob": 7}, space, base) == {**base, "tp": 2, "dp": 2}
    assert project({"tp": 3}, space, base) is None  # outside the domain
    assert project({"tp": 2, "dp": 4}, space, base) is None  # infeasible: tp * dp != 4


def test_nearest_campaigns_give_start_configs_and_widened_priors():
    space = sim_workload("debug").space
    base = dict(sim_workload("debug").baseline)
    effect = {"knob": "compile", "value": True, "log_time_effect": -0.2, "log_time_sd": 0.05,
              "log_memory_effect": 0.0, "log_memory_sd": 0.05}
    base_rec = {"baseline": base}
    near = record("near", H100, DENSE, [trial(1, {**base, "tp": 2, "dp": 2}, step=0.4),
                                        trial(2, {**base, "compile": True}, step=0.6)], effects=(effect,))
    far = record("far", A100, {**DENSE, "moe": True}, [trial(3, {**base, "tp": 4, "dp": 1}, step=0.1)],
                 effects=({**effect, "log_time_effect": -1.0},))
    near, far = (CampaignRecord(**{**r.__dict__, **base_rec}) for r in (near, far))
    found = nearest([far, near], hardware=H100, workload=DENSE, space=space, baseline=base)
    assert [u["id"] for u in found.used] == ["near", "far"] and found.used[0]["weight"] == 1.0
    assert found.configs[:2] == ({**base, "tp": 2, "dp": 2}, {**base, "compile": True})
    # A campaign that promoted a config offers it first: verified, where its fastest search
    # run may have been fast by chance.
    verified = {**base, "tp": 2, "dp": 2, "compile": True}
    promoted = CampaignRecord(**{**near.__dict__, "promoted": verified})
    again = nearest([far, promoted], hardware=H100, workload=DENSE, space=space, baseline=base)
    assert again.configs[:2] == (verified, {**base, "tp": 2, "dp": 2})
    prior = found.priors.get("compile", True)
    w_far = math.exp(-found.used[1]["distance"])
    assert prior.log_time_mean == pytest.approx((-0.2 + w_far * -1.0) / (1 + w_far))
    assert prior.source == "bank" and prior.log_time_std == pytest.approx(math.hypot(0.05, 0.0, 0.05))


def test_a_past_campaigns_trial_costs_become_the_cost_models_priors():
    from infrarsi.proposers.base import SearchContext
    from infrarsi.proposers.engine_proposer import InfraRSIProposer

    space = sim_workload("debug").space
    base = dict(sim_workload("debug").baseline)
    compile_effect = {"knob": "compile", "value": True, "log_time_effect": -0.2, "log_time_sd": 0.05,
                      "log_memory_effect": 0.0, "log_memory_sd": 0.05}
    costed = record("costed", H100, DENSE, [trial(1, {**base, "compile": True})], baseline=base,
                    effects=({**compile_effect, "log_cost_effect": 1.0, "log_cost_sd": 0.1},))
    older = record("older", A100, DENSE, [trial(2, {**base, "compile": True})], baseline=base,
                   effects=({**compile_effect, "log_time_effect": -0.6},))  # before records carried costs
    found = nearest([costed, older], hardware=H100, workload=DENSE, space=space, baseline=base)
    prior = found.priors.get("compile", True)
    # Only the campaign that measured the cost says what it is; its spread is its own.
    assert prior.log_cost_mean == 1.0 and prior.log_cost_std == pytest.approx(math.hypot(0.1, 0.0, 0.05))
    assert -0.6 < prior.log_time_mean < -0.2  # the time effect is still weighted over both
    ctx = SearchContext(space=space, baseline=space.validate(base), priors=found.priors)
    engine = InfraRSIProposer(ctx)
    blind = InfraRSIProposer(SearchContext(space=space, baseline=space.validate(base)))
    compiled = engine.encoding.configs([{**base, "compile": True}])
    baseline = engine.encoding.configs([base])
    # Before any trial: a compiling trial is predicted e (2.7x) as long as the baseline's
    # with the bank's cost, and as long as it without.
    for proposer, expected in ((engine, 1.0), (blind, 0.0)):
        gap = proposer.cost_model.predict(compiled)[0][0] - proposer.cost_model.predict(baseline)[0][0]
        assert gap == pytest.approx(expected, abs=1e-9)


def test_nearest_records_reads_in_full_only_the_campaigns_nearest_ranks_first(tmp_path):
    bank = Bank(tmp_path / "bank.sqlite")
    gpus = ["h100-sxm-80gb", "a100-80gb", "l4"]
    for i in range(6):  # six campaigns at distinct distances from (H100, DENSE)
        hw = {**H100, "gpu": gpus[i % 3]}
        bank.add(record(f"c{i}", hw, {**DENSE, "num_params": 9e9 * (1 + i)}, [trial(i, {"a": i}, step=0.5)]))
    space = sim_workload("debug").space
    base = dict(sim_workload("debug").baseline)
    everything = nearest(bank.records(), hardware=H100, workload=DENSE, space=space, baseline=base, exclude="c0")
    past = nearest_records(bank, hardware=H100, workload=DENSE, exclude="c0")
    assert [r.id for r in past] == [u["id"] for u in everything.used] == ["c3", "c1", "c2"]
    assert nearest(past, hardware=H100, workload=DENSE, space=space, baseline=base) == everything


def test_bank_cli_lists_shows_and_forgets(tmp_path, capsys):
    path = tmp_path / "bank.sqlite"
    Bank(path).add(record("c9", H100, DENSE, [trial(1, {"a": 2}, step=0.5)]))
    assert main(["bank", "--path", str(path), "--json", "list"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)[0]["id"] == "c9" and err.startswith("c9  ")  # the line for people on stderr
    assert main(["bank", "--path", str(path), "show", "c9", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["id"] == "c9"
    assert main(["bank", "--path", str(path), "show", "c9"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["best"]["step_time_s"] == 0.5 and shown["outcomes"] == {"ok": 1}
    assert main(["bank", "--path", str(path), "show", "nope"]) == 2
    assert "infrarsi bank list" in capsys.readouterr().err
    assert main(["bank", "--path", str(path), "--json", "forget", "c9"]) == 0 and Bank(path).list() == []
    assert json.loads(capsys.readouterr().out) == {"forgot": "c9"}


def test_a_campaign_writes_the_bank_the_next_reads_it_and_no_bank_does_neither(tmp_path, monkeypatch, capsys,
                                                                              ray_session, prefect_harness):
    # The flow through the CLI, with the bank at its default place: the data folder's.
    monkeypatch.setenv("INFRARSI_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.delenv("INFRARSI_BANK")
    bank = tmp_path / "data" / "bank.sqlite"
    spec = tmp_path / "sim.toml"
    spec.write_text('name = "sim-dense"\nbackend = "sim"\nsim_workload = "dense-9b-h100"\n'
                    '[budget]\nnum_trials = 6\nnum_finalists = 1\nverify_pairs = 2\n[search]\nproposer = "engine"\n')

    def campaign(*flags: str) -> tuple[str, list[dict], dict]:
        assert main(["campaign", str(spec), "--out", str(tmp_path / "out"), "--json", "--no-progress", *flags]) == 0
        cid = json.loads(capsys.readouterr().out)["campaign_id"]
        cdir = CampaignDir(tmp_path / "out" / cid)
        return cid, list(Ledger(cdir.ledger).events()), cdir.read_json(cdir.search)["describe"]

    first, events, describe = campaign()
    assert [r["id"] for r in Bank(bank).list()] == [first]  # written at the end
    # What each setting cost a trial is recorded beside its effect on the step.
    costs = {(c["knob"], repr(c["value"])): (c["log_cost_effect"], c["log_cost_sd"])
             for c in describe["trial_cost_effects"]}
    recorded = {(e["knob"], repr(e["value"])): (e["log_cost_effect"], e["log_cost_sd"])
                for e in Bank(bank).get(first).effects}
    assert recorded == costs and any(abs(mean) > 0.01 for mean, _ in costs.values())
    assert not [e for e in events if e["kind"] == "experience"] and "bank" not in describe["priors_source"]
    second, events, describe = campaign()
    [read] = [e for e in events if e["kind"] == "experience"]
    assert [c["id"] for c in read["campaigns"]] == [first] and read["configs"]
    assert describe["priors_source"].startswith("bank+")  # the first campaign's posterior effects
    searched = [e["config"] for e in events if e["kind"] == "trial" and e["role"] == "search"]
    assert read["configs"][0] in searched  # the engine starts from the bank's best config
    third, events, describe = campaign("--no-bank")
    assert not [e for e in events if e["kind"] == "experience"] and "bank" not in describe["priors_source"]
    assert sorted(r["id"] for r in Bank(bank).list()) == sorted([first, second])  # nothing written
