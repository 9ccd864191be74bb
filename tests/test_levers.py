"""The lever catalog (infrarsi/discover/levers/): per trainer family, over recorded --help
texts (tests/levers/help/README.md says how each was made), the levers `infrarsi init`
offers on a CPU and on a described GPU machine, their numerics classes and couplings; no
lever that changes what is trained (or that the catalog marks unsafe) is ever offered."""

from pathlib import Path

import pytest

from infrarsi.contract.spec_load import parse_spec
from infrarsi.core.errors import InfrarsiError
from infrarsi.discover.command import parse_command, parse_help
from infrarsi.discover.draft import Observed
from infrarsi.discover.init import build_spec
from infrarsi.discover.levers import load_catalog, parse_family
from infrarsi.discover.settings import yaml_settings
from infrarsi.harness.command import render_command

HELP = Path(__file__).parent / "levers" / "help"
NEVER = {lv.key for f in load_catalog() for lv in f.levers if lv.flag and not lv.offered}
NEVER_ENV = {lv.env for f in load_catalog() for lv in f.levers if lv.env and not lv.offered}


def _draft(argv, known=(), *, gpus=0, environ=None, threads=2, tmp_path=None):
    draft = build_spec(parse_command(argv), list(known), Observed(), name="job", cpus=2, gpus=gpus,
                       default_threads=threads, environ=environ or {})
    knobs = draft.data["knobs"]
    flags = {k.get("flag", "").lstrip("-").replace("-", "_").lower() for k in knobs.values()}
    assert not flags & NEVER and not {k.get("env") for k in knobs.values()} & NEVER_ENV, knobs
    if tmp_path is not None:  # the draft is a valid spec once its files exist
        _loaded(draft, tmp_path)
    return draft


def _help(name):
    return parse_help((HELP / name).read_text())


TRL = ["trl", "sft", "--model_name_or_path", "model", "--dataset_name", "data", "--output_dir", "out",
       "--per_device_train_batch_size", "4", "--gradient_accumulation_steps", "2", "--max_length", "32",
       "--max_steps", "100", "--seed", "0", "--bf16", "false", "--use_cpu", "--packing", "false"]


def test_every_catalog_file_validates_and_no_lever_it_never_offers_has_values():
    families = {f.family for f in load_catalog()}
    assert {"torch", "torchrun", "accelerate", "hf_trainer", "lightning", "litgpt", "torchtune", "nanogpt",
            "torchtitan", "megatron"} <= families
    for family in load_catalog():
        for lever in family.levers:
            assert lever.why and lever.source, (family.family, lever.name)


def test_a_broken_catalog_file_names_the_field():
    with pytest.raises(InfrarsiError, match=r"levers/x\.toml: levers\.0\.numerics: .*got 'maybe'"):
        parse_family('family = "x"\ntitle = "x"\n[detect]\n[[levers]]\nname = "a"\nenv = "A"\nkind = "other"\n'
                     'values = [1, 2]\nnumerics = "maybe"\ndevices = ["cpu"]\nwhy = "w"\n', source="levers/x.toml")
    with pytest.raises(InfrarsiError, match="exactly one of flag, env, launcher"):
        parse_family('family = "x"\ntitle = "x"\n[detect]\n[[levers]]\nname = "a"\nenv = "A"\nflag = "--a"\n'
                     'kind = "other"\nvalues = [1, 2]\nnumerics = "keeps"\ndevices = ["cpu"]\nwhy = "w"\n',
                     source="levers/x.toml")


def test_hugging_face_trainer_levers_from_trl_help(tmp_path):
    draft = _draft(TRL, _help("trl_sft.txt"), tmp_path=tmp_path)
    knobs, base = draft.data["knobs"], draft.data["baseline"]
    assert {"per_device_train_batch_size", "gradient_accumulation_steps", "bf16", "optim", "gradient_checkpointing",
            "torch_compile", "omp_threads"} <= set(knobs)
    assert knobs["bf16"]["numerics"] == "changes" and knobs["bf16"]["placeholder"]  # declared, typed in place
    assert knobs["optim"]["values"] == ["adamw_torch_fused", "adamw_torch"] and base["optim"] == "adamw_torch_fused"
    assert knobs["optim"].get("numerics") is None and knobs["torch_compile"]["kind"] == "compile"
    assert "TF32" in knobs["torch_compile"]["description"]  # the coupling a reader must know
    assert base["omp_threads"] == 2 and knobs["omp_threads"]["env"] == "OMP_NUM_THREADS"
    assert "dataloader_pin_memory" not in knobs and "cuda_alloc_conf" not in knobs  # GPU levers, CPU machine
    notes = "\n".join(draft.notes)
    assert "--packing is not a knob" in notes and "dataloader_pin_memory" in notes
    assert draft.data["objective"] == {"job_steps": 100}
    # on a machine with a GPU the CUDA levers join
    gpu = _draft([t for t in TRL if t != "--use_cpu"], _help("trl_sft.txt"), gpus=1)
    assert {"dataloader_pin_memory", "cuda_alloc_conf"} <= set(gpu.data["knobs"])
    assert gpu.data["resources"]["gpus_per_trial"] == 1 and "resources.gpus_per_trial" in gpu.confirm
    assert gpu.data["baseline"]["cuda_alloc_conf"] == "expandable_segments:False"
    assert "cuda_max_connections" not in gpu.data["knobs"]  # one process: the overlap it governs is not there


def test_lightning_cli_levers(tmp_path):
    argv = ["python", "cli.py", "fit", "--trainer.max_steps", "50", "--data.batch_size", "8",
            "--trainer.accumulate_grad_batches", "2", "--trainer.sync_batchnorm", "true"]
    draft = _draft(argv, _help("lightning_fit.txt"), tmp_path=tmp_path)
    knobs, base = draft.data["knobs"], draft.data["baseline"]
    assert draft.data["fixed_products"][0] == {"knobs": ["data_batch_size", "trainer_accumulate_grad_batches"],
                                               "value": 16}
    assert knobs["trainer_precision"]["values"] == ["32-true", "bf16-mixed"]
    assert knobs["trainer_precision"]["numerics"] == "changes" and base["trainer_precision"] == "32-true"
    notes = "\n".join(draft.notes)
    assert "--trainer.sync_batchnorm is not a knob" in notes and "as many tokens" in notes
    assert "trainer_benchmark" not in knobs and "trainer_devices" not in knobs  # CUDA only; typed only
    gpu = _draft(argv, _help("lightning_fit.txt"), gpus=2)
    assert gpu.data["knobs"]["trainer_benchmark"]["values"] == [False, True]


def test_torchtune_levers_from_its_config_file(tmp_path):
    config = tmp_path / "finetune.yaml"
    config.write_text("batch_size: 2\ngradient_accumulation_steps: 1\ncompile: false\n"
                      "enable_activation_checkpointing: false\ndtype: bf16\nmax_steps_per_epoch: null\n"
                      "optimizer:\n  _component_: torch.optim.AdamW\n  lr: 0.001\ndataset:\n  packed: false\n")
    argv = ["tune", "run", "full_finetune_single_device", "--config", "finetune.yaml", "batch_size=4",
            "gradient_accumulation_steps=2", "max_steps_per_epoch=40", "dtype=fp32", "seed=0"]
    draft = _draft(argv, yaml_settings(config), tmp_path=tmp_path)
    knobs, base = draft.data["knobs"], draft.data["baseline"]
    assert {"compile", "enable_activation_checkpointing", "optimizer_fused", "dtype"} <= set(knobs)
    assert knobs["dtype"]["numerics"] == "changes" and base["dtype"] == "fp32"
    assert base["optimizer_fused"] is False and knobs["optimizer_fused"]["flag"] == "optimizer.fused"
    assert knobs["compile"]["flag_style"] == "equals" and "dataset_packed" not in knobs
    rendered, _ = render_command(*_loaded(draft, tmp_path))
    assert "compile=False" in rendered and "optimizer.fused=False" in rendered


def _loaded(draft, tmp_path):
    data = {**draft.data, "contract": {**draft.data["contract"], "locked": ["job.txt"], "num_steps": 8}}
    for name in ("job.txt", "cli.py", "train.py"):
        (tmp_path / name).write_text("x")
    spec = parse_spec(data, source="levers", base_dir=tmp_path)
    return spec, spec.space, spec.space.validate(spec.baseline)


def test_litgpt_levers_from_its_help(tmp_path):
    argv = ["litgpt", "pretrain", "--config", "pretrain.yaml", "--precision", "32-true", "--train.micro_batch_size",
            "4", "--train.global_batch_size", "8", "--train.max_tokens", "76800", "--data.num_workers", "0",
            "--train.max_seq_length", "32"]
    draft = _draft(argv, _help("litgpt_pretrain.txt"), tmp_path=tmp_path)
    knobs = draft.data["knobs"]
    assert knobs["precision"]["values"] == ["32-true", "bf16-mixed"] and knobs["precision"]["numerics"] == "changes"
    assert knobs["data_num_workers"]["values"] == [0, 2] and "devices" not in knobs
    assert "--train.max_seq_length is not a knob" in "\n".join(draft.notes)


def test_torchtitan_levers_on_a_gpu_machine_and_none_on_a_cpu():
    argv = ["torchrun", "--nproc_per_node", "1", "--standalone", "-m", "torchtitan.train", "--training.steps", "100",
            "--training.local-batch-size", "8", "--training.global-batch-size", "16", "--training.seq-len", "2048"]
    gpu = _draft(argv, _help("torchtitan_excerpt.txt"), gpus=8)
    knobs, base = gpu.data["knobs"], gpu.data["baseline"]
    assert {"compile_enable", "activation_checkpoint_mode", "optimizer_implementation",
            "training_mixed_precision_param", "parallelism_fsdp_reshard_after_forward", "nproc"} <= set(knobs)
    assert knobs["compile_enable"]["flag_style"] == "switch" and base["compile_enable"] is False
    assert knobs["optimizer_implementation"]["values"] == ["fused", "for-loop", "foreach"]
    assert knobs["training_mixed_precision_param"]["numerics"] == "changes"
    assert knobs["nproc"]["values"] == [1, 2, 4, 8] and knobs["nproc"]["placeholder"]
    cpu = _draft(argv, _help("torchtitan_excerpt.txt"))
    assert not {"compile_enable", "activation_checkpoint_mode"} & set(cpu.data["knobs"])


def test_megatron_levers_and_the_connections_coupling():
    argv = ["torchrun", "--nproc_per_node", "8", "pretrain_gpt.py", "--micro-batch-size", "2",
            "--global-batch-size", "64", "--train-iters", "500", "--seq-length", "1024", "--bf16"]
    draft = _draft(argv, _help("megatron_excerpt.txt"), gpus=8)
    knobs, base = draft.data["knobs"], draft.data["baseline"]
    assert {"use_distributed_optimizer", "overlap_grad_reduce", "cross_entropy_loss_fusion", "manual_gc", "bf16",
            "cuda_max_connections", "cuda_alloc_conf", "nproc"} <= set(knobs)
    assert knobs["use_distributed_optimizer"]["flag_style"] == "switch" and not base["use_distributed_optimizer"]
    assert base["bf16"] is True and knobs["bf16"]["placeholder"] and knobs["bf16"]["numerics"] == "changes"
    assert "recompute_granularity" not in knobs  # unset means none, which no value of the flag spells
    assert base["cuda_max_connections"] == 8 and knobs["cuda_max_connections"]["values"] == [1, 8, 32]
    assert base["omp_threads"] == 1  # torchrun's one thread per process, nproc > 1, the variable unset
    assert draft.data["objective"] == {"job_steps": 500}
    # Megatron derives accumulation from the global batch over every rank's micro-batch
    assert "64 % (micro_batch_size * nproc) == 0" in draft.data["constraints"]
    # 8 processes x 1 thread on a 2-core trial: the command itself breaks the coupling, so it is said
    assert any(n.startswith("not a constraint: nproc * omp_threads <= 2") for n in draft.notes)
    # 8 processes x 1 thread on a 2-core trial: the command itself breaks the coupling, so it is said
    assert any(n.startswith("not a constraint: nproc * omp_threads <= 2") for n in draft.notes)


def test_an_env_prefix_is_the_levers_baseline_not_its_removal(tmp_path):
    for prefix in (["env", "OMP_NUM_THREADS=1"], ["OMP_NUM_THREADS=1"]):
        argv = [*prefix, "python", "train.py", "--batch_size=12", "--gradient_accumulation_steps=4",
                "--max_iters=40"]
        draft = _draft(argv, tmp_path=tmp_path)
        assert draft.data["baseline"]["omp_threads"] == 1 and draft.data["knobs"]["omp_threads"]["values"] == [1, 2]
        assert "env" not in draft.data  # the knob carries the variable
        spec, space, baseline = _loaded(draft, tmp_path)
        assert render_command(spec, space, baseline)[1] == {"OMP_NUM_THREADS": "1"}
        assert render_command(spec, space, {**baseline, "omp_threads": 2})[1] == {"OMP_NUM_THREADS": "2"}


def test_torchrun_processes_and_threads_are_coupled_on_a_cpu(tmp_path):
    argv = ["torchrun", "--standalone", "--nproc-per-node=1", "train.py", "--batch_size=4",
            "--gradient_accumulation_steps=4", "--steps=20"]
    draft = _draft(argv, tmp_path=tmp_path)
    assert "nproc * omp_threads <= 2" in draft.data["constraints"]
    assert draft.data["fixed_products"][0]["knobs"] == ["batch_size", "gradient_accumulation_steps", "nproc"]
    # where the command itself breaks the coupling, it is said, not imposed
    typed = _draft(["OMP_NUM_THREADS=2", *argv[:2], "--nproc-per-node=2", *argv[3:]])
    assert "constraints" not in typed.data and any("since the command itself breaks it" in n for n in typed.notes)


def test_an_inherited_variable_is_the_baseline_and_an_unsafe_one_is_never_a_knob():
    argv = ["NCCL_ALGO=Ring", "torchrun", "--nproc_per_node", "2", "train.py", "--steps", "10"]
    draft = _draft(argv, gpus=2, environ={"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"})
    assert draft.data["baseline"]["cuda_alloc_conf"] == "expandable_segments:True"
    assert draft.data["env"] == {"NCCL_ALGO": "Ring"}  # kept as typed, never searched
    assert any(n.startswith("NCCL_ALGO is not a knob") for n in draft.notes)
