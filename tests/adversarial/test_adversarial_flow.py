"""Two cheats inside a whole campaign through the Prefect flow: the search finds the
replay cheat fast and makes it a finalist, verification's canary seed rejects it, and
nothing a cheat touches is promoted or staged."""

import pytest
from adversarial_cheats import replay_cheat, train_cheat
from helpers.adversarial_spec import reference_run, write_spec

from infrarsi.core.ledger import Ledger
from infrarsi.core.workspace import CampaignDir


@pytest.mark.slow
def test_a_campaign_with_cheats_never_promotes_one(tmp_path, ray_session, prefect_harness):
    ref = reference_run(tmp_path)
    cheats = [f"cheats/{replay_cheat(tmp_path / 'cheats', ref.losses).name}",
              f"cheats/{train_cheat(tmp_path / 'cheats', 'fewer_tokens').name}"]
    spec = write_spec(tmp_path, cheats)
    # write_spec ends in the [budget] table: add the search budget and a proposer. Without
    # patch rounds (which add built-in patches by the profile's timings) the space is fixed,
    # so the random draws at the spec's seed are too.
    spec.write_text(spec.read_text() + 'num_trials = 5\n[search]\nproposer = "random"\npatch_rounds = 0\n')
    # A patch on in any run that broke the contract is out of the campaign: a trial that ran
    # the replay cheat beside the tokens cheat would take the replay cheat out before
    # verification. Kept apart, the replay cheat passes every search trial at the contract's
    # seed, becomes a finalist, and only the canary seed can reject it.
    spec.write_text('constraints = ["not (patch_replay_cached_loss and patch_fewer_tokens)"]\n' + spec.read_text())
    from flows.campaign import campaign as campaign_flow
    from infrarsi.core.options import CampaignOptions

    summary = campaign_flow(CampaignOptions(spec=str(spec), out=str(tmp_path / "out")))
    cdir = CampaignDir(tmp_path / "out" / summary["campaign_id"])
    trials = Ledger(cdir.ledger).trials()
    assert not any(t.config.get("patch_fewer_tokens") and t.outcome.value == "ok" for t in trials)
    verdicts = cdir.read_json(cdir.verification)["verdicts"]
    replayed = [v for v in verdicts if v["config"]["patch_replay_cached_loss"]]
    assert replayed and all(not v["promoted"] and "canary seed" in v["reason"] for v in replayed)
    promoted = summary.get("promoted_config") or {}
    assert not promoted.get("patch_replay_cached_loss") and not promoted.get("patch_fewer_tokens")
