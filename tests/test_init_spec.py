"""``infrarsi init``: a starting spec from a launch command, close to a hand-written one."""

import os
import re
import shlex
import shutil
import tomllib
from pathlib import Path

import pytest

from infrarsi.discover.draft import Observed
from infrarsi.discover.command import help_flags, parse_command
from infrarsi.discover.log_patterns import guess_patterns
from infrarsi.cli.main import main
from infrarsi.contract.spec_load import load_spec
from infrarsi.core.errors import InfrarsiError
from infrarsi.harness.command import render_command

ROOT = Path(__file__).resolve().parents[1]
NANOGPT = ROOT / "examples" / "nanogpt_style"
HF = ROOT / "examples" / "hf_trainer"


def test_init_writes_a_spec_close_to_the_hand_written_one(tmp_path, monkeypatch):
    folder = shutil.copytree(NANOGPT, tmp_path / "job")
    monkeypatch.chdir(folder)
    typed = ["python", "train.py", "--batch_size=2", "--gradient_accumulation_steps=8", "--dtype=float32",
             "--threads=1", "--max_iters=8", "--seed=1234"]
    assert main(["init", "-o", "init.toml", "--", *typed]) == 0
    text = (folder / "init.toml").read_text()
    assert "# CONFIRM" in text
    made, hand = tomllib.loads(text), tomllib.loads((folder / "campaign.toml").read_text())
    # the command is the one typed, each knob's and contract value in place
    assert made["command"] == ["python", "train.py", "--batch_size={batch_size}",
                               "--gradient_accumulation_steps={gradient_accumulation_steps}", "--dtype={dtype}",
                               "--threads={threads}", "--max_iters={num_steps}", "--seed={seed}"]
    assert set(made["knobs"]) == set(hand["knobs"])
    assert made["fixed_products"] == hand["fixed_products"] and made["baseline"] == hand["baseline"]
    for name, knob in hand["knobs"].items():
        got = made["knobs"][name]
        assert (sorted(map(str, got["values"])), got["kind"], got.get("levels"), got["placeholder"]) == \
            (sorted(map(str, knob["values"])), knob["kind"], knob.get("levels"), True), name
    for key in ("seq_len", "global_batch_tokens", "num_steps", "warmup_steps", "loss_signal"):
        assert made["contract"][key] == hand["contract"][key], key
    assert made["contract"]["seed"] == 1234 == load_spec(folder / "campaign.toml").contract.seed
    # the guessed log patterns are the hand-written ones; the tokens line checks out: 2 x 8 x 64
    for key in ("step_pattern", "eval_pattern", "tokens_pattern"):
        assert made["metrics"][key] == hand["metrics"][key], key
    # the honest split's dry run moved the printed loss (it is the last micro-batch's): window;
    # calibration: the extreme splits and the other precision, as the hand-written spec has them
    assert "honest split" in text and made["contract"]["loss_signal"] == "window"
    # (every split, since the signal is window: each split draws its own micro-batches' losses)
    splits = [c for c in made["calibration"] if "batch_size" in c]
    assert [c for c in made["calibration"] if "batch_size" not in c] == [{"dtype": "bfloat16"}]
    assert sorted(c["batch_size"] for c in splits) == [1, 4, 8, 16] and all(
        c["batch_size"] * c["gradient_accumulation_steps"] == 16 for c in splits)
    assert all(c in made["calibration"] for c in hand["calibration"])
    # what the dry run read is locked; nothing is editable without a patch source
    assert made["contract"]["locked"] == ["train.py"] and "editable" not in made["contract"]
    assert made["reproduce"]["command"] == typed and made["reproduce"]["tokens_per_step"] == 1024
    assert made["reproduce"]["lines"] == ["number of parameters: 0.11M"] and made["reproduce"]["first_loss"] > 3
    spec = load_spec(folder / "init.toml")  # a valid spec as written
    assert len(spec.space.feasible) == len(load_spec(folder / "campaign.toml").space.feasible)
    with pytest.raises(InfrarsiError, match="exists; pass --force"):
        main_raises(["init", "-o", "init.toml", "--no-dry-run", "--", "python", "train.py"])


def test_init_on_a_hugging_face_script_takes_what_its_help_knows(tmp_path, monkeypatch):
    pytest.importorskip("transformers")
    folder = shutil.copytree(HF, tmp_path / "job")
    monkeypatch.chdir(folder)
    # The command gives neither the sequence length, the step count nor the seed: --help does.
    assert main(["init", "-o", "init.toml", "--no-dry-run", "--", "python", "train.py", "--output_dir", "hf-out",
                 "--per_device_train_batch_size", "2", "--gradient_accumulation_steps", "8", "--logging_steps", "1",
                 "--use_cpu", "True", "--report_to", "none"]) == 0
    text = (folder / "init.toml").read_text()
    made, hand = tomllib.loads(text), tomllib.loads((folder / "campaign.toml").read_text())
    for key in ("seq_len", "global_batch_tokens"):  # --help's default of --seq_len is 64, not a placeholder 1
        assert made["contract"][key] == hand["contract"][key], key
    assert made["metrics"]["tokens_per_step"] == hand["metrics"]["tokens_per_step"] == 1024
    assert made["contract"]["seed"] == 42  # --help's default
    # the step flag (a trial sets its length) and the seed (canary seeds) are added; the
    # sequence length is not: the job runs its default, which the contract states
    assert made["command"][-4:] == ["--max_steps", "{num_steps}", "--seed", "{seed}"]
    assert "--seq_len" not in made["command"] and "from --help, not the command" in text
    # only implementations of the baseline's algorithm, never another optimizer (sgd, lion, 8-bit states, ...)
    assert sorted(made["knobs"]["optim"]["values"]) == ["adamw_torch", "adamw_torch_fused"]
    assert made["fixed_products"] == hand["fixed_products"]
    assert made["contract"]["loss_signal"] == "step"
    contract = text[text.index("[contract]"):text.index("[device]")]
    for key in ("seq_len", "global_batch_tokens", "seed", "loss_signal"):
        line = next(ln for ln in contract.splitlines() if ln.startswith(f"{key} = "))
        assert "# CONFIRM" in line and "PLACEHOLDER" not in line, line
    assert "docs/loss-contract.md" in text
    assert len(load_spec(folder / "init.toml").space.feasible) > 1  # a valid spec as written


def test_init_on_a_hugging_face_script_offers_one_precision_and_one_checkpointing_switch(tmp_path, monkeypatch):
    pytest.importorskip("transformers")
    folder = shutil.copytree(HF, tmp_path / "job")
    monkeypatch.chdir(folder)
    assert main(["init", "-o", "init.toml", "--no-dry-run", "--", "python", "train.py", "--output_dir", "hf-out",
                 "--per_device_train_batch_size", "2", "--gradient_accumulation_steps", "8",
                 "--use_cpu", "True"]) == 0
    text = (folder / "init.toml").read_text()
    made = tomllib.loads(text)
    knobs = made["knobs"]
    # --bf16 and --fp16 as two knobs would let a config switch both on, which the Trainer rejects
    assert [n for n, k in knobs.items() if k["kind"] == "precision"] == ["bf16"] and "fp16" not in knobs
    assert knobs["bf16"]["values"] == [False, True] and knobs["bf16"]["levels"] == {"false": "fp32", "true": "bf16"}
    assert "# --fp16 is not a knob: --bf16 is the one precision knob" in text
    # --help prints "(default: None)" for the checkpointing switch: no default, not the string 'None'
    ckpt = [n for n, k in knobs.items() if k["kind"] == "checkpointing"]
    assert len(ckpt) == 1 and ckpt[0] in ("activation_checkpointing", "gradient_checkpointing"), ckpt  # 5.x, 4.x
    assert knobs[ckpt[0]]["values"] == [False, True] and made["baseline"][ckpt[0]] is False
    assert "None" not in [str(v) for k in knobs.values() for v in k["values"]] + list(map(str, made["baseline"]))
    assert len(load_spec(folder / "init.toml").space.feasible) > 1


def test_a_precision_switch_the_command_turns_on_is_the_one_kept():
    from infrarsi.discover.init import build_spec
    from infrarsi.discover.command import Flag

    command = ["python", "train.py", "--fp16", "True"]
    known = [Flag("bf16", "--bf16", False, "separate"), Flag("fp16", "--fp16", False, "separate")]
    draft = build_spec(parse_command(command), known, Observed(), name="job", cpus=2)
    knobs = draft.data["knobs"]
    assert "bf16" not in knobs and knobs["fp16"]["values"] == [True, False]
    assert knobs["fp16"]["levels"] == {"false": "fp32", "true": "fp16"} and draft.data["baseline"]["fp16"] is True
    assert any(n.startswith("--bf16 is not a knob: --fp16") for n in draft.notes)


def test_help_defaults_of_none_are_no_default(tmp_path):
    (tmp_path / "train.py").write_text(
        "import argparse\n"
        "p = argparse.ArgumentParser(formatter_class=argparse.ArgumentDefaultsHelpFormatter)\n"
        "p.add_argument('--gradient_checkpointing', nargs='?', const=True, default=None, help='recompute')\n"
        "p.add_argument('--bf16', nargs='?', const=True, default=False, help='bfloat16')\n"
        "p.add_argument('--seq_len', type=int, default=None, help='tokens per sequence')\n"
        "p.add_argument('--steps', type=int, default=20, help='steps')\n"
        "p.add_argument('--report_to', default='none', help='where')\n"
        "p.parse_args()\n")
    cmd = parse_command(["python", "train.py", "--steps", "5"])
    known = help_flags(cmd, tmp_path, dict(os.environ))
    assert {f.name: f.value for f in known} == {"gradient_checkpointing": None, "bf16": False, "seq_len": None,
                                                "steps": 20, "report_to": "none"}
    from infrarsi.discover.init import build_spec

    draft = build_spec(cmd, known, Observed(), name="job", cpus=2)
    assert draft.data["knobs"]["gradient_checkpointing"]["values"] == [False, True]
    assert draft.data["contract"]["seq_len"] == 1  # no default: a placeholder, not int('None')
    assert "PLACEHOLDER" in draft.confirm["contract.seq_len"] and "--seq_len" not in draft.data["command"]


def test_a_contract_value_nothing_gives_is_a_placeholder_marked_confirm():
    from infrarsi.discover.init import build_spec, render_toml, short_argv
    from infrarsi.discover.command import Flag

    command = ["python", "train.py", "--batch_size", "4", "--grad_accum", "2"]
    cmd = parse_command(command)
    draft = build_spec(cmd, [], Observed(), name="job", cpus=2)
    lines = render_toml(draft, command).splitlines()
    for key in ("seq_len", "global_batch_tokens", "seed"):
        line = next(ln for ln in lines if ln.startswith(f"{key} = "))
        assert "# CONFIRM: " in line and "PLACEHOLDER" in line, line
    assert draft.data["contract"]["global_batch_tokens"] == draft.data["metrics"]["tokens_per_step"] == 8
    # the dry run is cut short through a step flag only --help knows
    steps = Flag("max_steps", "--max_steps", -1, "separate")
    assert short_argv(cmd, [steps], 3)[1:] == [*command[1:], "--max_steps", "3"]


def main_raises(argv):
    from infrarsi.discover.init import init_spec

    job = argv[argv.index("--") + 1:]
    init_spec(job, cwd=Path.cwd(), out_path=Path(argv[argv.index("-o") + 1]), run_job=False)


def test_a_torchrun_line_and_argparse_help(tmp_path):
    typed = ["torchrun", "--standalone", "--nproc_per_node=2", "train.py", "--flavour", "tiny", "--micro-batch", "4",
             "--steps", "7", "--seq-len", "128"]
    cmd = parse_command(typed)
    assert cmd.launcher == "torchrun" and cmd.script == "train.py" and cmd.entry == ["python", "train.py"]
    assert cmd.nproc == 2 and cmd.nproc_index == 2 and [f.style for f in cmd.flags] == ["separate"] * 4
    flags = {f.name: f for f in help_flags(cmd, ROOT / "workloads" / "gpt", dict(os.environ))}
    assert flags["precision"].choices == ["fp32", "bf16"] and flags["checkpointing"].choices[-1] == "full"
    from infrarsi.discover.init import build_spec

    draft = build_spec(cmd, list(flags.values()), Observed(), name="gpt", cpus=2)
    knobs = draft.data["knobs"]
    assert knobs["nproc"]["placeholder"] and knobs["nproc"]["kind"] == "processes"
    assert knobs["precision"]["values"] == ["fp32", "bf16"] and knobs["precision"]["kind"] == "precision"
    assert knobs["precision"]["flag"] == "--precision" and not knobs["precision"].get("placeholder")  # from --help
    # the launcher stays as typed; values in place
    assert draft.data["command"] == ["torchrun", "--standalone", "--nproc_per_node={nproc}", "train.py", "--flavour",
                                     "tiny", "--micro-batch", "4", "--steps", "{num_steps}", "--seq-len", "{seq_len}"]
    assert "micro_batch" not in knobs  # no accumulation flag: it would change the global batch
    assert draft.data["metrics"]["tokens_per_step"] == draft.data["contract"]["global_batch_tokens"]


def test_log_patterns_are_guessed_from_trainer_lines():
    hf = ("{'loss': '4.8', 'grad_norm': '0.642', 'learning_rate': '5e-05', 'epoch': '0.007812'}\n"
          "{'loss': '4.786', 'grad_norm': '0.7107', 'learning_rate': '4.167e-05', 'epoch': '0.01562'}\n"
          "{'eval_loss': '4.7', 'eval_runtime': '0.1'}\n"
          "{'train_runtime': '9.767', 'train_loss': '4.79', 'epoch': '0.04688'}\n")
    g = guess_patterns(hf)
    assert [m["loss"] for m in re.finditer(g.step_pattern, hf)] == ["4.8", "4.786"]
    assert [m["eval_loss"] for m in re.finditer(g.eval_pattern, hf)] == ["4.7"]
    assert g.tokens_lines == ()
    lightning = "Epoch 0:  50%| 1/2 [00:01<00:01, 1.00it/s, v_num=0, train_loss=3.250]\n" * 2
    assert re.search(guess_patterns(lightning).step_pattern, lightning)["loss"] == "3.250"


def test_a_command_init_cannot_read_says_what_to_do(tmp_path):
    with pytest.raises(InfrarsiError, match="needs the launch command after '--'"):
        parse_command([])
    with pytest.raises(InfrarsiError, match="'-c' after the launcher is not a .py script"):
        parse_command(["python", "-c", "print(1)"])
    with pytest.raises(InfrarsiError, match="'no-such-trainer' is not on PATH; activate the environment"):
        from infrarsi.discover.init import init_spec

        init_spec(["no-such-trainer", "fit"], cwd=tmp_path, out_path=tmp_path / "c.toml", run_job=False)


def test_the_written_spec_reads_back_as_the_draft_with_confirm_on_its_keys():
    from infrarsi.discover.init import build_spec, render_toml
    from infrarsi.discover.command import Flag

    command = ["python", "train.py", "--batch_size", "4", "--grad_accum", "2",
               "--note", 'say "hi" \\ # not a comment']
    known = [Flag("bf16", "--bf16", False, "separate")]  # from --help: its baseline is marked CONFIRM
    draft = build_spec(parse_command(command), known, Observed(), name="job", cpus=2)
    text = render_toml(draft, command)
    assert tomllib.loads(text) == draft.data
    assert text.startswith(f"# Written by `infrarsi init -- {shlex.join(command)}`.\n"
                           "# Check every line marked CONFIRM, trim the knobs you do not want searched, then run\n"
                           "#   infrarsi campaign <this file>\n")
    confirmed, table = {}, ""
    for line in text.splitlines():
        if line.startswith("["):
            table = line.strip("[]")
        elif "  # CONFIRM: " in line:
            key, why = line.split(" = ", 1)[0], line.split("  # CONFIRM: ", 1)[1]
            confirmed[f"{table}.{key}" if table else key] = why
    assert confirmed == draft.confirm and "baseline.bf16" in confirmed


ACCUMULATE = ROOT / "tests" / "jobs" / "accumulate"


def test_init_reads_the_pinned_threads_the_printed_losses_and_the_run_length(tmp_path, monkeypatch):
    """An accumulate-then-step trainer whose first printed loss is the same under every split
    (its data opens with a constant stretch) and whose printed loss is the last micro-batch's,
    typed with an env prefix that pins one thread: the thread count is a knob whose baseline
    is the pinned 1, the loss signal is read from every printed loss (window), the job's
    length is the typed one, and the baseline renders the typed command."""
    folder = shutil.copytree(ACCUMULATE, tmp_path / "job")
    monkeypatch.chdir(folder)
    typed = ["env", "OMP_NUM_THREADS=1", "python", "train.py", "config/base.py", "--batch_size=12",
             "--gradient_accumulation_steps=4", "--max_iters=40"]
    assert main(["init", "--", *typed]) == 0
    text = (folder / "campaign.toml").read_text()
    made = tomllib.loads(text)
    threads = made["knobs"]["omp_threads"]
    assert made["baseline"]["omp_threads"] == 1 and max(threads["values"]) > 1 and threads["env"] == "OMP_NUM_THREADS"
    assert made["contract"]["loss_signal"] == "window" and "of the 4 both dry runs printed" in text
    assert made["objective"]["job_steps"] == 41 and "loop runs 0..N inclusive" in text
    assert made["contract"]["seq_len"] == 32  # config/base.py's block_size, read as the configurator reads it
    assert made["reproduce"]["command"] == typed
    spec = load_spec(folder / "campaign.toml")
    at_typed = spec.model_copy(update={"contract": spec.contract.model_copy(update={"num_steps": 41})})
    argv, env = render_command(at_typed, at_typed.space, at_typed.space.validate(at_typed.baseline))
    assert list(argv) == typed[2:] and env == {"OMP_NUM_THREADS": "1"}


def test_a_plain_argparse_scripts_seed_and_sequence_length_are_read_from_its_source(tmp_path, monkeypatch):
    """argparse's default help lists --seed and --block_size without their defaults; the
    script's own source has them, so the spec adds the seed at its default (canary seeds reach
    the job) and states the sequence length, and no knob is left without a baseline."""
    (tmp_path / "train.py").write_text(
        "import argparse\np = argparse.ArgumentParser()\n"
        "p.add_argument('--seed', type=int, default=1337)\np.add_argument('--block_size', type=int, default=128)\n"
        "p.add_argument('--batch_size', type=int, default=8)\n"
        "p.add_argument('--gradient_accumulation_steps', type=int, default=2)\n"
        "p.add_argument('--steps', type=int, default=5 * 100)\np.add_argument('--compile', action='store_true')\n"
        "args = p.parse_args()\n")
    monkeypatch.chdir(tmp_path)
    assert main(["init", "--no-dry-run", "--", "python", "train.py", "--steps", "1000"]) == 0
    made = tomllib.loads((tmp_path / "campaign.toml").read_text())
    assert made["contract"]["seed"] == 1337 and made["contract"]["seq_len"] == 128
    assert made["command"][-2:] == ["--seed", "{seed}"] and made["objective"]["job_steps"] == 1000
    assert made["fixed_products"][0]["value"] == 16 and made["baseline"]["compile"] is False
