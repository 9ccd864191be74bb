"""Patches proposed during the run, on real tiny trainings: the built-in library matched by
doctor's profile, an LLM over the local test endpoint, the gate in front of both, and the
adversarial cheats submitted as LLM answers (refused, or caught and retired; none promoted)."""

from __future__ import annotations

import dataclasses
import math
import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "adversarial"))

from adversarial_cheats import SCOPE_CHEATS, TRAIN_CHEATS, edited, replay_cheat  # noqa: E402
from tiny_gpt import GPT_DIR  # noqa: E402

from infrarsi.backends import backend_of  # noqa: E402
from infrarsi.bank.campaign import campaign_experience, record_campaign  # noqa: E402
from infrarsi.bank.sqlite import Bank  # noqa: E402
from infrarsi.contract.checks import enforce  # noqa: E402
from infrarsi.core.ledger import Ledger  # noqa: E402
from infrarsi.core.trial import Outcome, Role  # noqa: E402
from infrarsi.harness.inprocess_pool import InProcessPool  # noqa: E402
from infrarsi.patches.patch import builtin_patches, make_diff  # noqa: E402
from infrarsi.patches.sources import BuiltinPatchSource, PatchContext, gate  # noqa: E402
from infrarsi.stages.calibration import calibrate_loss  # noqa: E402
from infrarsi.stages.doctor import DoctorReport, adopt_doctor, run_doctor  # noqa: E402
from infrarsi.stages.init import init_campaign, load_campaign  # noqa: E402
from infrarsi.stages.run import patching  # noqa: E402
from infrarsi.stages.run.evidence import finalist_plan  # noqa: E402
from infrarsi.stages.run.search import run_search  # noqa: E402
from infrarsi.stages.run.verify import run_verification  # noqa: E402
from infrarsi.stages.runtime import CampaignRuntime, RuntimeSettings  # noqa: E402
from helpers.adversarial_spec import reference_run, write_spec  # noqa: E402
from tests.llm_server import Reply, running_server  # noqa: E402


def campaign(tmp: Path, ref, *, llm_url: str | None = None, name: str = "c",
             calibrated: bool = False) -> tuple[CampaignRuntime, DoctorReport]:
    spec = write_spec(tmp, [])
    # What these tests check is decided by losses and the gate, not by timing: a loaded
    # machine's trials are not re-measured.
    text = spec.read_text().replace('[contract]', '[search]\nproposer = "random"\npatch_rounds = 1\n'
                                    '[resources]\nmax_remeasures = 0\n[contract]')
    if llm_url:
        text += f'[llm]\nbase_url = "{llm_url}"\nmodel = "test-model"\ntimeout_s = 2.0\nmax_retries = 0\n'
    spec.write_text(text)
    contract, cdir = init_campaign(spec, tmp / "out", campaign_id=name)
    rt = CampaignRuntime(contract, cdir, RuntimeSettings(bank="off"), pool=InProcessPool())
    doctor = DoctorReport(
        baseline=rt.space.validate(contract.spec.baseline), trial_ids=(ref.trial_id,), step_time_s=ref.step_time_s,
        run_step_times_s=(ref.step_time_s,), noise_cv=0.05, within_run_cv=0.0, reference_losses=ref.losses,
        # A hand-made doctor without per-class references: one tolerance that holds fp32 and
        # bf16 configs alike (the tiny flavour's bf16 drift is ~2e-5), as doctor had before
        # the loss contract was calibrated per numerics class.
        loss_tolerance=1e-3, loss_tolerance_source="test", calibration=(),
        peak_memory_bytes=ref.peak_memory_bytes, phases_s=dict(ref.phases_s), tokens_per_step=ref.tokens_per_step)
    if calibrated:  # doctor's class-aware loss contract, from the reference run and the spec's variants
        losses, rows = calibrate_loss(rt, [ref])
        doctor = dataclasses.replace(doctor, loss_tolerance=losses.tolerance, loss_tolerance_source="calibrated",
                                     calibration=tuple(rows), loss_contract=losses)
    adopt_doctor(rt, doctor)
    return rt, doctor


@pytest.fixture(scope="module")
def ref(tmp_path_factory):
    return reference_run(tmp_path_factory.mktemp("reference"))


def events(rt: CampaignRuntime, kind: str) -> list[dict]:
    return [e for e in rt.ledger.events() if e["kind"] == kind]


def context(workdir: Path, phases: dict, *, peak: int = 1, capacity: int = 10) -> PatchContext:
    return PatchContext(workdir=workdir, editable_files=("model.py", "train.py"), editable=("model.py", "train.py"),
                        locked=("data.py",), description="", phases_s=phases, peak_memory_bytes=peak,
                        memory_capacity_bytes=capacity, step_time_s=1.0, known_knobs=("attention",))


def test_the_builtin_library_is_matched_by_the_profile_and_the_workload(tmp_path):
    source = BuiltinPatchSource()
    compute_bound = context(GPT_DIR, {"forward_s": 0.3, "backward_s": 0.6, "optimizer_s": 0.1})
    picks, _ = source.propose(compute_bound, set())
    assert [p.name for p in picks][:1] == ["cached_causal_mask"]
    assert all("memory" not in p.phases or p.phases != ("memory",) for p in picks)  # no memory pressure
    memory_bound = context(GPT_DIR, {"optimizer_s": 1.0}, peak=9, capacity=10)
    names = [p.name for p in source.propose(memory_bound, set())[0]]
    assert set(names) <= {"checkpoint_lm_head", "chunked_cross_entropy", "ddp_bucket_view"} and names
    # A workload whose code lacks what the patch changes: not proposed.
    other = tmp_path / "other"
    shutil.copytree(GPT_DIR, other, ignore=shutil.ignore_patterns("__pycache__"))
    model = other / "model.py"
    model.write_text(model.read_text().replace(".tril()", ".tril(0)"))
    assert "cached_causal_mask" not in [p.name for p in source.propose(compute_bound.__class__(
        **{**compute_bound.__dict__, "workdir": other}), set())[0]]


def test_every_builtin_patch_applies_and_stays_in_scope(tmp_path, ref):
    rt, _ = campaign(tmp_path, ref)
    accepted, verdicts = [], {}
    for p in builtin_patches():
        verdicts[p.name] = gate(p, rt.contract, accepted, set())
        assert verdicts[p.name].accepted, (p.name, verdicts[p.name].reason)
        accepted.append(p)
    # the two LM-head rewrites touch the same lines: a constraint between them, not a failure
    assert verdicts["chunked_cross_entropy"].conflicts == ("checkpoint_lm_head",)
    assert gate(accepted[0], rt.contract, accepted, set()).reason == "patch 'cached_causal_mask' was proposed before"


def test_two_conflicting_patches_accepted_in_one_round_are_measured_apart(tmp_path, ref):
    # The built-in spec's baseline sits near its capacity: both LM-head memory savers are
    # proposed in the first round, and they cannot be on together.
    rt, doctor = campaign(tmp_path, ref)
    pressed = doctor.__class__(**{**doctor.__dict__, "peak_memory_bytes": int(rt.spec.device.memory_capacity * 0.9),
                                  "phases_s": {"optimizer_s": 1.0}})
    queued = patching.patch_round(rt, pressed, [], why="after doctor")
    [round_] = events(rt, "patch_round")
    assert {"checkpoint_lm_head", "chunked_cross_entropy"} <= set(round_["accepted"])
    assert len(queued) == len(round_["accepted"])
    for cfg, name in zip(queued, round_["accepted"]):  # every knob set, only its own patch on
        assert set(cfg) == set(rt.space.names)
        assert [k for k, v in cfg.items() if k.startswith("patch_") and v] == [f"patch_{name}"]


def test_a_default_campaign_proposes_gates_and_measures_a_builtin_patch(tmp_path, ref):
    rt, doctor = campaign(tmp_path, ref)
    out = run_search(rt, doctor, proposer_name="random", num_trials=2)
    [round_] = events(rt, "patch_round")
    assert round_["why"] == "after doctor" and round_["accepted"] and round_["phases_s"]
    first = round_["accepted"][0]
    assert first == "cached_causal_mask"  # forward + backward dominate the tiny profile
    measured = out.trials[0]
    assert measured.config[f"patch_{first}"] is True and measured.outcome is Outcome.OK, measured.reason
    assert f"patch_{first}" in rt.space.names and rt.spec.baseline[f"patch_{first}"] is False
    assert all(set(t.config) == set(rt.space.names) or t is measured for t in out.trials)
    # a resumed campaign rebuilds the same space from the ledger
    resumed = CampaignRuntime(*load_campaign(rt.cdir.root), RuntimeSettings(bank="off"))
    patching.restore(resumed)
    assert resumed.space.names == rt.space.names and resumed.spec.constraints == rt.spec.constraints
    assert [p["name"] for p in resumed.contract.extra["patches"]] == round_["accepted"]
    # the finished campaign goes to the bank, with the patch's measured effect ...
    bank = Bank(tmp_path / "bank.sqlite")
    record_campaign(bank, rt.cdir)
    rec = bank.get(rt.contract.campaign_id)
    assert len(rec.trials) == 3 and rec.hardware["cpu"] and rec.workload["num_params"] > 0
    [patch] = [p for p in rec.patches if p["name"] == first]
    assert patch["accepted"] and patch["log_time_effect"] == pytest.approx(
        math.log(measured.step_time_s / doctor.step_time_s))
    # ... and the next campaign on this machine reads it
    (tmp_path / "second").mkdir()
    rt2, _ = campaign(tmp_path / "second", ref, name="c2")
    found = campaign_experience(str(bank.path), rt2)
    configs = found.configs
    [event] = events(rt2, "experience")
    assert event["campaigns"][0]["id"] == rt.contract.campaign_id and event["campaigns"][0]["distance"] == 0
    assert all(rt2.space.is_feasible(c) for c in configs)


def _trial(i: int, outcome: Outcome = Outcome.OK, step: float | None = 1.0):
    from infrarsi.core.trial import TrialResult

    return TrialResult(trial_id=f"t{i:04d}", config={}, role=Role.SEARCH, outcome=outcome,
                       step_time_s=step if outcome is Outcome.OK else None)


def test_the_search_stalls_after_five_trials_without_a_better_ok_one():
    n = patching.STALL_TRIALS
    better = [_trial(i, step=1.0 - i / 100) for i in range(n)]
    assert not patching.stalled(better)
    flat = [_trial(0), *(_trial(i, step=1.0) for i in range(1, n)), _trial(n, Outcome.OOM)]  # ties do not count
    assert patching.stalled(flat) and not patching.stalled(flat[:-1])
    failed = [_trial(i, Outcome.CRASH) for i in range(n)]  # no ok trial at all is a stall too
    assert patching.stalled(failed)
    # at least five trials since the last round, whatever came before it
    assert not patching.stalled(flat, since=2) and patching.stalled(flat + [_trial(9, step=2.0)], since=1)


class TwoSlotPool(InProcessPool):
    """Two slots, and like Ray's pool one result per ``wait``: the search loop refills the
    slot at once, so the pool is never idle until the budget is spent."""

    num_slots = 2

    @property
    def free_slots(self) -> int:
        return self.num_slots - len(self._queue)

    def submit(self, req) -> None:
        self._queue.append(req)


class NoPatches:
    name = "none"

    def propose(self, ctx, exclude):
        return [], []


def test_a_stall_round_runs_with_two_slots_once_the_trials_in_flight_are_in(tmp_path, monkeypatch):
    # The simulator has no code to patch; a source that proposes nothing still makes rounds.
    monkeypatch.setattr(patching, "patch_sources", lambda spec, log_dir: [NoPatches()])
    spec = tmp_path / "sim.toml"
    spec.write_text('name = "sim-dense"\nbackend = "sim"\nsim_workload = "dense-9b-h100"\n'
                    '[budget]\nnum_trials = 12\n[search]\nproposer = "random"\n')
    contract, cdir = init_campaign(spec, tmp_path / "out")
    # the simulator's trials, as the runtime's own pool runs them
    rt = CampaignRuntime(contract, cdir, RuntimeSettings(tracking_uri="none", bank="off"),
                         pool=TwoSlotPool(backend_of(contract.spec).run_trial))
    run_search(rt, run_doctor(rt), proposer_name="random", num_trials=12)
    assert [e["why"] for e in events(rt, "patch_round")] == ["after doctor", "search stalled"]
    # the search trials recorded between the two rounds, and after the second
    seen = [e["kind"] if e["kind"] == "patch_round" else e["trial_id"] for e in rt.ledger.events()
            if e["kind"] == "patch_round" or e.get("role") == "search"]
    stall = seen.index("patch_round", 1)
    before, after = seen[1:stall], seen[stall + 1:]
    assert len(before) >= patching.STALL_TRIALS and after
    # nothing submitted before the round finished after it: no trial was in flight
    assert max(before) < min(after)


def _diff(rel: str, new: str) -> str:
    return make_diff(rel, (GPT_DIR / rel).read_text(), new)


def _answer(diff: str, title: str = "p") -> dict:
    return {"title": title, "rationale": "faster", "unified_diff": diff, "files_touched": ["train.py"],
            "expected_time_effect": 0.5, "expected_memory_effect": 1.0, "preconditions": []}


def test_llm_patches_pass_the_same_gate_and_cheats_are_refused_or_caught(tmp_path, ref):
    scope = {name: (_diff(rel, (GPT_DIR / rel).read_text().replace("time.perf_counter() - self._step_start_s",
                                                                  "0.5 * (time.perf_counter() - self._step_start_s)"))
                    if (GPT_DIR / rel).is_file() else
                    f"diff --git a/{rel} b/{rel}\nnew file mode 100644\n--- /dev/null\n+++ b/{rel}\n@@ -0,0 +1 @@\n+X = 1\n")
             for name, rel in SCOPE_CHEATS.items()}
    # every training cheat of tests/adversarial, here as an LLM answer
    cheats = {n: _diff(rel, edited(rel, edits)) for n, (rel, edits, _) in TRAIN_CHEATS.items()}
    replay = (replay_cheat(tmp_path / "cheats", ref.losses) / "patch.diff").read_text()
    not_applying = _diff("model.py", "x = 1\n").replace("-import math", "-import maths")
    with running_server() as server:
        # The calibrated contract holds fp32 configs near-exact (sneak_bf16 is a bf16-sized drift).
        rt, doctor = campaign(tmp_path, ref, llm_url=server.base_url, calibrated=True)
        results = {}

        def check(t):
            return enforce(t, rt.spec.contract, doctor.loss_reference)

        def rounds(trials: list) -> None:  # one round per queued answer, each accepted patch measured
            while server.queue:
                for cfg in patching.patch_round(rt, doctor, trials, why="test"):
                    r = rt.run_one(cfg, Role.SEARCH, check=check)
                    patching.retire_violators(rt, r)
                    results[next(k for k, v in cfg.items() if k.startswith("patch_") and v)] = r

        server.queue = [
            Reply.json(_answer("")),  # no diff
            Reply.json(_answer(not_applying)),  # a diff that does not apply
            Reply.truncated(_answer(cheats["fewer_tokens"])),  # cut mid-answer
            Reply.text("here is my patch: ..."),  # not the schema
            Reply.refused(),
            Reply.hang(5),  # past the 2 s timeout
            *(Reply.json(_answer(d, n)) for n, d in scope.items()),
            *(Reply.slow(0.2, _answer(d, n)) for n, d in cheats.items() if n != "degrade_bf16"),
            Reply.json(_answer(replay, "replay")),
        ]
        rounds([])
        # degrade_bf16 acts in bf16 configs only: it arrives when the best config so far is
        # bf16 (the calibration's bf16 reference run), so that is where it is measured
        bf16 = [t for t in rt.ledger.trials() if t.config == {"micro_batch": 4, "precision": "bf16"}]
        assert [t.role for t in bf16] == [Role.CALIBRATE]
        server.queue = [Reply.slow(0.2, _answer(cheats["degrade_bf16"], "degrade_bf16"))]
        rounds(bf16)
    refused = {e["name"]: e["reason"] for e in events(rt, "patch_refused")}
    reasons = list(refused.values())
    assert len(refused) == 8, refused
    assert "patch.diff is empty" in reasons[0] and "does not apply" in reasons[1]
    assert all("malformed answer" in r for r in reasons[2:4]) and "refused" in reasons[4]
    assert "no answer" in reasons[5]
    assert "modifies locked file 'metrics.py'" in reasons[6] and "outside the editable scope" in reasons[7]
    title = {e["knob"]: e["patch"]["title"] for e in events(rt, "patch_accepted")}
    assert sorted(title.values()) == sorted([*TRAIN_CHEATS, "replay"])  # in scope: only a trial can tell
    retired = {e["knob"] for e in events(rt, "patch_retired")}
    violations = {k for k, r in results.items() if r.outcome is Outcome.CONTRACT_VIOLATION}
    # every training cheat is caught by its own trial and retired
    assert violations == retired and {title[k] for k in violations} == set(TRAIN_CHEATS), {
        title[k]: (r.outcome, r.reason) for k, r in results.items()}
    # a retired patch is a constraint no proposer can cross, and is never asked for again
    assert all(f"not {k}" in rt.spec.constraints for k in retired)
    assert not any(rt.space.is_feasible({**rt.spec.baseline, k: True}) for k in retired)
    # the replay passes the search check; verification's canary catches it
    replay_knob = next(k for k, r in results.items() if r.outcome is Outcome.OK)
    report = run_verification(rt, doctor, finalist_plan(rt, doctor, [results[replay_knob]]))
    [verdict] = report.verdicts
    assert not verdict.promoted and "contract_violation" in verdict.reason and report.promoted is None
    # every trial the cheats cost is in the ledger; refusals cost none
    assert {t.config.get(replay_knob) for t in Ledger(rt.cdir.ledger).trials() if t.role is Role.VERIFY} == {True}
    assert len([t for t in Ledger(rt.cdir.ledger).trials() if t.role is Role.SEARCH]) == len(TRAIN_CHEATS) + 1
