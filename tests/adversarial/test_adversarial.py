"""The adversarial suite: cheats that try to look faster, each caught for the right reason.

One tiny campaign (the ``tiny`` GPT flavour, 5 steps) holds every in-scope cheat as a
patch knob. Doctor runs for real, as in a default campaign (three baseline repeats, an
honest micro-batch split, a bf16 variant and its own split), and the loss contract it
calibrates is the only tolerance: nothing is set by hand. Each cheat then runs once
through the real path: ``CampaignRuntime.request`` (its own git worktree) ->
``run_process_trial`` -> ``checks.enforce``, recorded in the ledger. Scope cheats and
launch tricks are refused before any trial. The replay cheat passes the search-time loss
check and is caught by verification's canary seeds; nothing a cheat touches is promoted.
"""

from __future__ import annotations

import json

import git
import pytest
from adversarial_cheats import TRAIN_CHEATS, replay_cheat, scope_cheat, train_cheat
from helpers.adversarial_spec import reference_run, write_spec

from infrarsi.contract.checks import enforce
from infrarsi.core.errors import PatchError, SpecError
from infrarsi.core.ledger import Ledger
from infrarsi.core.trial import Outcome, Role
from infrarsi.harness.inprocess_pool import InProcessPool
from infrarsi.harness.launcher import run_process_trial
from infrarsi.stages.apply import run_apply
from infrarsi.stages.doctor import run_doctor
from infrarsi.stages.init import init_campaign
from infrarsi.stages.run.evidence import finalist_plan
from infrarsi.stages.run.verify import run_verification
from infrarsi.stages.runtime import CampaignRuntime, RuntimeSettings


@pytest.fixture(scope="module")
def arena(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("adversarial")
    ref = reference_run(tmp)
    cheats = tmp / "cheats"
    refs = [f"cheats/{train_cheat(cheats, n).name}" for n in TRAIN_CHEATS]
    refs.append(f"cheats/{replay_cheat(cheats, ref.losses).name}")
    contract, cdir = init_campaign(write_spec(tmp, ["cached_causal_mask", "checkpoint_lm_head", *refs]),
                                   tmp / "out")
    rt = CampaignRuntime(contract, cdir, RuntimeSettings(), pool=InProcessPool())
    baseline = rt.space.validate(contract.spec.baseline)
    doctor = run_doctor(rt)  # the tolerances a default campaign calibrates
    results = {}

    def run(patch_knob: str | None, **knobs):
        key = (patch_knob, tuple(sorted(knobs.items())))
        if key not in results:
            cfg = {**baseline, **knobs, **({patch_knob: True} if patch_knob else {})}
            r = run_process_trial(rt.request(cfg, Role.SEARCH))
            r = enforce(r, contract.spec.contract, doctor.loss_reference)
            rt.record(r)
            results[key] = r
        return results[key]

    yield {"rt": rt, "contract": contract, "cdir": cdir, "doctor": doctor, "run": run, "tmp": tmp}
    rt.close()


def test_doctor_calibrates_a_near_exact_fp32_tolerance_and_a_bf16_reference_of_its_own(arena):
    doctor = arena["doctor"]
    losses = doctor.loss_reference
    assert doctor.loss_tolerance_source.startswith("calibrated")
    assert losses.tolerance == arena["contract"].spec.contract.min_loss_tolerance  # fp32 splits: ~1e-8
    bf16 = losses.reference_of((("precision", "bf16"),))
    assert bf16 is not None and bf16.losses != doctor.reference_losses and len(bf16.trial_ids) == 2
    assert losses.tolerance <= bf16.tolerance < 1e-3  # the old single tolerance was at least 1e-3


@pytest.mark.parametrize("patch,knobs", [  # (doctor ran the calibration variants themselves)
    ("cached_causal_mask", {}), ("checkpoint_lm_head", {}), (None, {"precision": "bf16", "micro_batch": 8}),
    ("cached_causal_mask", {"precision": "bf16"}),
])
def test_honest_changes_keep_the_loss_contract_in_their_own_numerics(arena, patch, knobs):
    r = arena["run"](patch and f"patch_{patch}", **knobs)
    assert r.outcome is Outcome.OK, r.reason


@pytest.mark.parametrize("cheat,knobs,reason", [
    ("short_seq", {}, "loss is"),
    ("fewer_tokens", {}, "tokens per step 1024 != contract 2048"),
    ("skip_optimizer", {}, "above the baseline"),
    ("skip_micro_compute", {}, "loss is"),
    ("easy_data", {}, "below the baseline"),
    ("shrink_model", {}, "loss is"),
    ("fewer_steps", {}, "above the baseline"),
    ("sneak_bf16", {}, "the baseline over the trajectory"),
    ("degrade_bf16", {"precision": "bf16"}, "the precision=bf16 reference over the trajectory"),
    ("tamper_locked_at_runtime", {}, "locked files modified during the trial: ['data.py']"),
])
def test_each_cheat_is_a_contract_violation_with_its_reason(arena, cheat, knobs, reason):
    r = arena["run"](f"patch_{cheat}", **knobs)
    assert r.outcome is Outcome.CONTRACT_VIOLATION, (r.outcome, r.reason)
    assert reason in r.reason
    line = [t for t in Ledger(arena["cdir"].ledger).trials() if t.trial_id == r.trial_id]
    assert line and line[0].outcome is Outcome.CONTRACT_VIOLATION and reason in line[0].reason


def test_cheats_run_in_their_own_worktrees_and_the_snapshot_stays_clean(arena):
    arena["run"]("patch_tamper_locked_at_runtime")
    repo = git.Repo(arena["contract"].workdir)
    assert repo.active_branch.name == "main" and not repo.is_dirty(untracked_files=False)
    assert arena["contract"].changed_locked_files() == []
    assert len(list((arena["cdir"].root / "worktrees").glob("*.ready"))) >= 1


def test_a_replayed_loss_passes_search_but_fails_the_canary_and_is_never_promoted(arena):
    replay = arena["run"]("patch_replay_cached_loss")
    assert replay.outcome is Outcome.OK, replay.reason  # indistinguishable at the contract's seed
    honest = arena["run"]("patch_cached_causal_mask")
    honest_bf16 = arena["run"](None, precision="bf16", micro_batch=8)
    plan = finalist_plan(arena["rt"], arena["doctor"], [replay, honest, honest_bf16])
    report = run_verification(arena["rt"], arena["doctor"], plan)
    cheat_verdict, honest_verdict, bf16_verdict = report.verdicts
    assert not cheat_verdict.promoted
    assert "contract_violation" in cheat_verdict.reason and "canary seed 2234" in cheat_verdict.reason
    for verdict in (honest_verdict, bf16_verdict):  # the canary does not hurt an honest change
        assert "a verification run failed" not in verdict.reason and verdict.canary_seeds == (2234, 2235)
    # bf16 was checked against a bf16 run of the baseline at each canary seed.
    refs = [t for t in Ledger(arena["cdir"].ledger).trials()
            if t.role is Role.VERIFY_BASELINE and t.config.get("precision") == "bf16" and not t.extra.get("retried")]
    assert len(refs) == 2 and all(t.config["micro_batch"] == 4 for t in refs)
    applied = run_apply(arena["contract"], arena["cdir"], arena["doctor"], report)
    promoted = report.promoted
    assert promoted is None or not promoted.config.get("patch_replay_cached_loss")
    if applied["branch"]:
        assert "patch_replay_cached_loss = false" in git.Repo(applied["repository"]).git.show(
            f"{applied['branch']}:infrarsi_promoted.toml")


@pytest.mark.parametrize("cheat,problem", [
    ("edit_metrics_timer", "modifies locked file 'metrics.py'"),
    ("write_outside_scope", "adds new file 'fastpath/kernels.py' outside the editable scope"),
])
def test_scope_cheats_are_refused_at_init_before_any_trial(tmp_path, cheat, problem):
    ref = f"cheats/{scope_cheat(tmp_path / 'cheats', cheat).name}"
    with pytest.raises(PatchError, match="escapes the contract's scope") as err:
        init_campaign(write_spec(tmp_path, [ref]), tmp_path / "out")
    assert problem in str(err.value) and "fix the diff or remove it" in str(err.value)
    assert not list((tmp_path / "out").glob("*/ledger.jsonl")) and not list((tmp_path / "out").glob("*/trials"))


def test_a_knob_value_smuggling_flags_is_refused_at_init(tmp_path):
    knob = '[knobs.micro_batch]\nvalues = ["4", "2 --steps 1"]\nflag = "--micro-batch"'
    with pytest.raises(SpecError, match="looks like extra command-line arguments"):
        init_campaign(write_spec(tmp_path, [], knob=knob), tmp_path / "out")


def test_an_env_knob_cannot_redirect_the_metrics_file(tmp_path):
    knob = '[knobs.micro_batch]\nvalues = [4, 8]\nflag = "--micro-batch"\n' \
           '[knobs.metrics]\nvalues = ["/tmp/fake.jsonl"]\nenv = "INFRARSI_METRICS_FILE"'
    with pytest.raises(SpecError, match="reserved for the harness"):
        init_campaign(write_spec(tmp_path, [], knob=knob), tmp_path / "out")


def test_the_harness_owns_the_metrics_file_even_when_a_job_env_names_another(arena, tmp_path):
    fake = tmp_path / "fake.jsonl"  # a pre-written, flattering trajectory
    fake.write_text("".join(json.dumps({"event": "step", "step": s, "loss": 1.0, "step_time_s": 1e-3,
                                        "tokens": 2048}) + "\n" for s in range(5)))
    before = fake.read_text()
    r = reference_run(tmp_path, env={"INFRARSI_METRICS_FILE": str(fake)})
    assert fake.read_text() == before
    assert r.losses == arena["doctor"].reference_losses
