"""At a canary seed, a loss beyond the calibrated tolerance is judged again at that seed's
own honest spread before it counts as a violation.

How far an honest change moves the loss depends on the seed: at one canary seed of the
built-in debug job, a loss spike amplified the honest splits' fp32 deviation from ~5e-8
to 1.5e-5, and honest configs were rejected against a 3e-6 tolerance calibrated at the
contract seed. The fake workload's ``--split`` is such a change: (split - 1) x 1e-6 off
at the contract seed, ten times that at the canary seeds. Real processes, no Ray.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from infrarsi.core.trial import Outcome, Role
from infrarsi.harness.inprocess_pool import InProcessPool
from infrarsi.stages.canary import canary_loss_check, canary_split_runner
from infrarsi.stages.doctor import run_doctor
from infrarsi.stages.init import init_campaign
from infrarsi.stages.run.verify import canary_seed
from infrarsi.stages.runtime import CampaignRuntime, RuntimeSettings

FAKE = Path(__file__).resolve().parents[1] / "fake_workload.py"


@pytest.fixture(scope="module")
def campaign(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("spread")
    work = tmp / "fake"
    work.mkdir()
    shutil.copy(FAKE, work / "fake_workload.py")
    (work / "locked.txt").write_text("locked\n")
    spec = tmp / "fake.toml"
    spec.write_text("\n".join([
        'name = "spread"', 'workload_dir = "fake"', 'repository = "copy"',
        'command = ["{python}", "fake_workload.py", "--steps", "{num_steps}", "--seed", "{seed}", '
        '"--seed-mode", "use", "--sleep", "0.02"]',
        "baseline = { split = 1 }", "calibration = [{ split = 3 }]",
        '[knobs.split]\nvalues = [1, 2, 3, 40]\nflag = "--split"\nnumerics = "keeps"',
        "[contract]", "seq_len = 128", "global_batch_tokens = 2048", "num_steps = 5", "warmup_steps = 1",
        'editable = ["fake_workload.py"]', 'locked = ["locked.txt"]',
        "[device]", "memory_capacity = 2147483648", "emulate_capacity = false",
        "[resources]", "max_foreign_load_cores = 1000",
        "[budget]", "doctor_repeats = 3", "doctor_max_repeats = 3", ""]))
    contract, cdir = init_campaign(spec, tmp / "out")
    rt = CampaignRuntime(contract, cdir, RuntimeSettings(), pool=InProcessPool())
    yield rt, run_doctor(rt)
    rt.close()


def _at_canary(rt, doctor, splits: list[int], *, local: bool):
    """Each of ``splits`` at the first canary seed, checked as verification checks it."""
    seed = canary_seed(rt.spec.contract.seed, 0)
    contract = rt.spec.contract
    base = rt.run_one({"split": 1}, Role.VERIFY_BASELINE, seed=seed)
    check = canary_loss_check(contract, doctor.loss_reference, base, seed, [{"split": s} for s in splits],
                              lambda cfg: rt.run_one(cfg, Role.VERIFY_BASELINE, seed=seed),
                              canary_split_runner(rt, seed) if local else None)
    return [rt.run_one({"split": s}, Role.VERIFY, seed=seed, check=check) for s in splits]


def test_doctor_calibrates_at_the_contract_seed(campaign):
    rt, doctor = campaign
    assert doctor.loss_reference.tolerance == pytest.approx(4e-6, rel=1e-3)  # 2 x split 3's 2e-6
    assert doctor.loss_reference.splits == ({"split": 3},)


def test_without_the_seeds_own_spread_an_honest_split_is_rejected(campaign):
    rt, doctor = campaign
    [honest] = _at_canary(rt, doctor, [2], local=False)
    assert honest.outcome is Outcome.CONTRACT_VIOLATION  # 1e-5 off against 4e-6


def test_an_honest_split_passes_at_the_seeds_own_spread_and_a_larger_change_does_not(campaign):
    rt, doctor = campaign
    before = {r.trial_id for r in rt.ledger.trials()}
    honest, cheat = _at_canary(rt, doctor, [2, 40], local=True)
    assert honest.outcome is Outcome.OK, honest.reason
    assert honest.extra["loss_tolerance_at_seed"] == pytest.approx(4e-5, rel=1e-3)  # 2 x split 3's 2e-5 here
    assert cheat.outcome is Outcome.CONTRACT_VIOLATION  # 3.9e-4: no honest split at this seed came close
    assert "honest splits at this seed" in cheat.reason and "moved it by up to 2.00e-05" in cheat.reason
    # The honest split ran once for both candidates, at the canary seed, as a calibration run.
    splits = [r for r in rt.ledger.trials() if r.trial_id not in before and r.role is Role.CALIBRATE]
    assert [(dict(r.config), r.extra.get("job_seed")) for r in splits] == [({"split": 3}, 2234)]


def test_the_seeds_spread_is_measured_after_a_patch_joined_the_space(campaign):
    """A patch accepted during the run is a knob doctor's baseline lacks, and constraints
    name it (the default campaign once stopped here with a KeyError). Runs last: it grows
    the module's space."""
    from infrarsi.patches.patch import Patch, make_diff
    from infrarsi.stages.run.patching import grown

    rt, doctor = campaign
    source = (Path(rt.contract.workdir) / "fake_workload.py").read_text()
    rt.adopt(grown(rt.contract, add=Patch(name="comment", title="a comment", files_touched=("fake_workload.py",),
                                          diff=make_diff("fake_workload.py", source, "# a comment\n" + source))))
    rt.adopt(grown(rt.contract, retire="patch_comment"))  # a constraint that names the new knob
    [honest] = _at_canary(rt, doctor, [2], local=True)
    assert honest.outcome is Outcome.OK, honest.reason
    assert honest.extra["loss_tolerance_at_seed"] == pytest.approx(4e-5, rel=1e-3)
