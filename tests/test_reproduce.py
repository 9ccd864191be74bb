"""Doctor proves the spec runs the job the user gave: its first baseline run must print what
the typed command printed when `infrarsi init` ran it. The job is a nanoGPT-style
configurator (tests/jobs/configurator_job.py): a positional config file, then `--key=value`
overrides, later ones winning; the spec that moved the file after the overrides trained the
file's model instead of the one typed."""

import shutil
from pathlib import Path

import pytest
import tomlkit

from infrarsi.discover.init import init_spec
from infrarsi.core.errors import ContractError
from infrarsi.stages.doctor import run_doctor
from infrarsi.stages.init import init_campaign
from infrarsi.stages.runtime import CampaignRuntime, RuntimeSettings

JOB = Path(__file__).parent / "jobs" / "configurator_job.py"
TYPED = ["python", "train.py", "config/big.py", "--n_layer=2", "--n_embd=32", "--block_size=16", "--batch_size=4",
         "--gradient_accumulation_steps=2", "--max_iters=30"]


@pytest.fixture
def job(tmp_path):
    folder = tmp_path / "job"
    (folder / "config").mkdir(parents=True)
    shutil.copy(JOB, folder / "train.py")
    (folder / "config" / "big.py").write_text("n_layer = 6\nn_embd = 384\nblock_size = 256\nbatch_size = 64\n")
    spec = init_spec(TYPED, cwd=folder, out_path=folder / "campaign.toml")
    return folder, spec


def _doctor(spec: Path, out: Path):
    contract, cdir = init_campaign(spec, out)
    rt = CampaignRuntime(contract, cdir, RuntimeSettings(tracking_uri="none", in_process=True, bank="off"))
    try:
        return run_doctor(rt)
    finally:
        rt.close()


def test_init_keeps_the_command_and_records_what_it_printed(job):
    folder, spec = job
    data = tomlkit.parse(spec.read_text()).unwrap()
    assert data["command"] == ["python", "train.py", "config/big.py", "--n_layer=2", "--n_embd=32",
                               "--block_size={seq_len}", "--batch_size={batch_size}",
                               "--gradient_accumulation_steps={gradient_accumulation_steps}", "--max_iters={last_step}"]
    # the loop runs 0..max_iters: 4 losses for 3 steps, so the spec asks for num_steps - 1
    assert data["contract"]["seq_len"] == 16 and data["contract"]["global_batch_tokens"] == 128
    assert data["metrics"]["tokens_pattern"].startswith("tokens per iteration will be")
    assert data["reproduce"]["lines"] == ["number of parameters: 0.02M"]
    assert data["reproduce"]["command"] == TYPED and data["reproduce"]["tokens_per_step"] == 128
    assert data["contract"]["locked"] == ["train.py", "config/big.py"]


def test_doctor_reproduces_the_typed_command(job, tmp_path):
    _, spec = job
    doctor = _doctor(spec, tmp_path / "out")
    assert doctor.tokens_per_step == 128 and len(doctor.reference_losses) == 20


def test_a_spec_that_moves_the_config_file_after_the_overrides_is_stopped_before_any_search(job, tmp_path):
    folder, spec = job
    data = tomlkit.parse(spec.read_text())
    command = list(data["command"])
    command.append(command.pop(2))  # the rendering bug: the file now overrides what was typed
    data["command"] = command
    spec.write_text(tomlkit.dumps(data))
    with pytest.raises(ContractError) as caught:
        _doctor(spec, tmp_path / "out")
    message = str(caught.value)
    assert "does not reproduce what your command printed" in message
    assert "'number of parameters: 0.02M' was printed when you ran the command; now 'number of parameters: 10.62M'" \
        in message
    assert "config/big.py" in message.split("departs from the one you typed")[1]
