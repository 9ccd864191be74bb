"""Jobs nobody here wrote, taken as a user takes them: `infrarsi init` on the launch command
their authors publish, then a campaign on the spec it wrote, with no hand edit (these
commands leave no line marked PLACEHOLDER). The spec's baseline renders the command as
typed; doctor's first baseline run reproduces what the command printed when init ran it
(else the campaign stops before any search and exits 2); the campaign ends with a verdict.

trl (`trl sft`, the Hugging Face Trainer), litgpt (`litgpt pretrain`, Lightning Fabric) and
torchtune (`tune run`) run offline on tiny inputs made by fixtures.py; torchtitan cannot run
without an accelerator (tests/third_party/README.md says why). Each campaign searches one
trial: what is tested is the way in, not the search.

`init` runs in the suite for all three; a campaign on each costs 5-10 minutes on a 2-core
CPU (10-11 trials, each importing its trainer's stack), too much for the suite, so the
campaigns run where INFRARSI_THIRD_PARTY_LONG=1 is set:

    INFRARSI_THIRD_PARTY_LONG=1 python -m pytest -q tests/third_party/test_trainers_campaign.py
"""

import json
import os
import tomllib

import fixtures
import pytest

from infrarsi.cli.main import main
from infrarsi.contract.spec_load import load_spec
from infrarsi.harness.command import flag_args, render_command

TRAINERS = {"trl": ("trl", fixtures.trl_sft), "litgpt": ("litgpt", fixtures.litgpt_pretrain),
            "torchtune": ("torchtune", fixtures.torchtune_full_finetune)}


CAMPAIGNS = pytest.mark.skipif(os.environ.get("INFRARSI_THIRD_PARTY_LONG") != "1",
                               reason="a campaign per trainer costs minutes: set INFRARSI_THIRD_PARTY_LONG=1")


def _init(name, tmp_path, monkeypatch):
    """``infrarsi init`` on the trainer's published command, in its work folder; the spec it
    wrote, checked: nothing left to fill in, the typed command kept, the tokens per step the
    command's own product, and the baseline rendering the typed argv token for token."""
    module, build = TRAINERS[name]
    pytest.importorskip(module)
    launch = build(tmp_path / "work")
    for key, value in {**launch.env, "HF_HOME": str(tmp_path / "hf_home")}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.chdir(launch.cwd)

    assert main(["init", "--", *launch.argv]) == 0
    text = (launch.cwd / "campaign.toml").read_text()
    assert "PLACEHOLDER" not in text, text
    written = tomllib.loads(text)
    assert written["reproduce"]["command"] == launch.argv and written["reproduce"]["first_loss"] > 0
    assert written["contract"]["global_batch_tokens"] == fixtures.TOKENS_PER_STEP
    spec = load_spec(launch.cwd / "campaign.toml")
    # rendered at the step count the typed command ran, the baseline is the typed command
    typed = {"num_steps": fixtures.NUM_STEPS, "warmup_steps": 1}
    at_typed = spec.model_copy(update={"contract": spec.contract.model_copy(update=typed)})
    argv, env = render_command(at_typed, at_typed.space, at_typed.space.validate(at_typed.baseline))
    # the typed command, then each lever of the trainer's family the command did not set, at its baseline
    appended = [t for k in spec.space.knobs if k.flag and not k.placeholder
                for t in flag_args(k, spec.baseline[k.name])]
    assert list(argv) == launch.argv + appended and all(env[k] == v for k, v in spec.env.items())
    assert all(env[k.env] == str(spec.baseline[k.name]) for k in spec.space.knobs if k.env)
    return launch, written


# The levers init offers on a CPU, per trainer (docs/tune-your-job.md#the-lever-catalog).
OFFERED = {"trl": {"optim", "gradient_checkpointing", "torch_compile", "bf16", "dataloader_num_workers",
                   "omp_threads"},
           "litgpt": {"precision", "data_num_workers", "omp_threads"},
           "torchtune": {"compile", "enable_activation_checkpointing", "optimizer_fused", "dtype", "omp_threads"}}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(TRAINERS))
def test_init_writes_the_published_command_as_the_baseline(name, tmp_path, monkeypatch):
    _, written = _init(name, tmp_path, monkeypatch)
    assert OFFERED[name] <= set(written["knobs"]), sorted(written["knobs"])
    assert written["objective"]["job_steps"] == fixtures.NUM_STEPS  # the run's length, as typed


@CAMPAIGNS
@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(TRAINERS))
def test_init_then_a_campaign_runs_the_job_as_published(name, tmp_path, monkeypatch, capsys, ray_session,
                                                         prefect_harness):
    _init(name, tmp_path, monkeypatch)
    code = main(["campaign", "campaign.toml", "--budget", "1", "--json", "--no-progress",
                 "--out", str(tmp_path / "out")])
    out = capsys.readouterr()
    assert code == 0, out.err[-3000:]
    summary = json.loads(out.out)  # --json: stdout is the one JSON document
    assert summary["trials_by_stage"]["doctor"] >= 3 and summary["num_trials"] == sum(
        summary["trials_by_outcome"].values())
    assert summary["verified_speedup"] is None or summary["verified_speedup"] > 1.0
