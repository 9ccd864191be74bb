"""Specs that fit other people's scripts: flag styles, knob kinds and value levels that the
built-in priors understand, and knob pairs that keep their product."""

import tomllib
from pathlib import Path

import pytest
import tomlkit

from infrarsi.contract.spec_load import load_spec
from infrarsi.core.errors import SpecError
from infrarsi.engine.builtin_priors import builtin_priors
from infrarsi.harness.command import render_command


def _spec(tmp_path: Path, **changes) -> dict:
    (tmp_path / "train.py").write_text("print('hi')\n")
    data = {
        "name": "theirs", "workload_dir": ".", "flag_style": "equals",
        "command": ["{python}", "train.py", "--max_iters={num_steps}", "--seed={seed}"],
        "baseline": {"batch_size": 4, "gradient_accumulation_steps": 4, "dtype": "float32", "compile": False,
                     "threads": 1, "fast": False},
        "fixed_products": [{"knobs": ["batch_size", "gradient_accumulation_steps"], "value": 16}],
        "knobs": {
            "batch_size": {"values": [2, 4, 8], "flag": "--batch_size", "kind": "micro_batch"},
            "gradient_accumulation_steps": {"values": [2, 4, 8], "flag": "--gradient_accumulation_steps",
                                            "kind": "grad_accum"},
            "dtype": {"values": ["float32", "bfloat16"], "flag": "dtype", "kind": "precision",
                      "levels": {"float32": "fp32", "bfloat16": "bf16"}},
            "compile": {"values": [False, True], "flag": "--compile", "flag_style": "separate", "kind": "compile"},
            "threads": {"values": [1, 2], "env": "OMP_NUM_THREADS", "kind": "threads"},
            "fast": {"values": [False, True], "flag": "--fast", "flag_style": "switch"},
        },
        "contract": {"seq_len": 64, "global_batch_tokens": 1024, "num_steps": 4, "warmup_steps": 1,
                     "locked": ["train.py"]},
        "device": {"memory_capacity": "1GiB"},
    }
    for dotted, value in changes.items():
        *parents, leaf = dotted.split(".")
        node = data
        for p in parents:
            node = node[p]
        node[leaf] = value
    return data


def _load(tmp_path: Path, **changes):
    path = tmp_path / "campaign.toml"
    path.write_text(tomlkit.dumps(_spec(tmp_path, **changes)))
    return load_spec(path)


def test_each_flag_style_renders_as_the_script_expects(tmp_path):
    spec = _load(tmp_path)
    config = {**spec.baseline, "batch_size": 2, "gradient_accumulation_steps": 8, "dtype": "bfloat16",
              "compile": True, "threads": 2, "fast": True}
    argv, env = render_command(spec, spec.space, config)
    assert argv[1:] == ("train.py", "--max_iters=4", "--seed=1234", "--batch_size=2", "--gradient_accumulation_steps=8",
                        "dtype=bfloat16", "--compile", "True", "--fast")
    assert env == {"OMP_NUM_THREADS": "2"}


def test_the_baseline_passes_every_knob_at_its_value_and_a_trial_differs_only_where_it_changes(tmp_path):
    """A knob absent from the command is passed at the baseline's value too (a switch that is
    off, as nothing), so the baseline runs what the spec says, never the job's own default."""
    spec = _load(tmp_path)
    argv, env = render_command(spec, spec.space, spec.baseline)
    assert argv[1:] == ("train.py", "--max_iters=4", "--seed=1234", "--batch_size=4", "--gradient_accumulation_steps=4",
                        "dtype=float32", "--compile", "False") and env == {"OMP_NUM_THREADS": "1"}
    trial, trial_env = render_command(spec, spec.space, {**spec.baseline, "compile": True})
    assert [a for a, b in zip(trial, argv) if a != b] == ["True"] and len(trial) == len(argv) and trial_env == env


def test_knobs_in_the_command_render_where_they_stand(tmp_path):
    command = ["{python}", "train.py", "config/x.py", "--batch_size={batch_size}", "{fast}", "--max_iters={last_step}",
               "--gradient_accumulation_steps={gradient_accumulation_steps}"]
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "x.py").write_text("batch_size = 12\n")
    spec = _load(tmp_path, command=command, env={"OMP_NUM_THREADS": "1"}, **{
        "knobs.batch_size": {"values": [2, 4, 8], "placeholder": True, "kind": "micro_batch"},
        "knobs.gradient_accumulation_steps": {"values": [2, 4, 8], "placeholder": True, "kind": "grad_accum"},
        "knobs.fast": {"values": [False, True], "placeholder": True, "flag": "--fast", "flag_style": "switch"}})
    argv, env = render_command(spec, spec.space, spec.baseline)
    assert argv[1:] == ("train.py", "config/x.py", "--batch_size=4", "--max_iters=3",
                        "--gradient_accumulation_steps=4", "dtype=float32", "--compile", "False") \
        and env == {"OMP_NUM_THREADS": "1"}
    argv, env = render_command(spec, spec.space, {**spec.baseline, "batch_size": 8, "gradient_accumulation_steps": 2,
                                                  "fast": True, "threads": 2})
    assert argv[1:] == ("train.py", "config/x.py", "--batch_size=8", "--fast", "--max_iters=3",
                        "--gradient_accumulation_steps=2", "dtype=float32", "--compile", "False") \
        and env == {"OMP_NUM_THREADS": "2"}
    with pytest.raises(SpecError, match=r"knobs\.batch_size is a placeholder, but the command has no \{batch_size\}"):
        _load(tmp_path, **{"knobs.batch_size": {"values": [2, 4, 8], "placeholder": True}})


def test_only_splits_that_keep_the_product_are_feasible(tmp_path):
    space = _load(tmp_path).space
    pairs = {(c["batch_size"], c["gradient_accumulation_steps"]) for c in space.feasible}
    assert pairs == {(2, 8), (4, 4), (8, 2)}


def test_a_baseline_that_breaks_the_product_is_named(tmp_path):
    with pytest.raises(SpecError, match=r"fixed_products\[0\]: the baseline's batch_size 8 x "
                                        r"gradient_accumulation_steps 4 = 32, but the product must stay 16"):
        _load(tmp_path, **{"baseline.batch_size": 8})
    with pytest.raises(SpecError, match=r"fixed_products\[0\] names unknown knob\(s\) \['micro'\]"):
        _load(tmp_path, fixed_products=[{"knobs": ["batch_size", "micro"], "value": 16}])
    with pytest.raises(SpecError, match=r"must take whole numbers.*'float32'"):
        _load(tmp_path, fixed_products=[{"knobs": ["batch_size", "dtype"], "value": 16}])


def test_declared_tokens_per_step_must_be_the_fixed_products_sequences_times_seq_len(tmp_path):
    log = {"source": "log", "step_pattern": r"loss (?P<loss>\S+)", "tokens_per_step": 1024}
    assert _load(tmp_path, metrics=log).metrics.tokens_per_step == 1024  # 16 sequences of 64 tokens
    # 16 sequences of 32 tokens are 512 tokens, not the 1024 declared (and in the contract)
    with pytest.raises(SpecError, match=r"metrics\.tokens_per_step \(1024\) must equal fixed_products\[0\]\.value "
                                        r"\(16 sequences per optimizer step: batch_size x gradient_accumulation_steps\) "
                                        r"x contract\.seq_len \(32\) = 512"):
        _load(tmp_path, metrics=log, **{"contract.seq_len": 32})
    # processes outside the product multiply it by a count the spec does not know: not checked
    torchrun = ["{python}", "-m", "torch.distributed.run", "--nproc-per-node=2", "train.py", "--max_iters={num_steps}"]
    assert _load(tmp_path, metrics=log, command=torchrun, **{"contract.seq_len": 32})
    # with the processes knob in the product, the product counts them: checked again
    nproc = {"values": [1, 2], "placeholder": True, "kind": "processes"}
    with pytest.raises(SpecError, match=r"fixed_products\[0\]\.value \(16 sequences per optimizer step: "
                                        r"batch_size x gradient_accumulation_steps x nproc\)"):
        _load(tmp_path, metrics=log, command=[*torchrun[:3], "--nproc-per-node={nproc}", *torchrun[4:]],
              fixed_products=[{"knobs": ["batch_size", "gradient_accumulation_steps", "nproc"], "value": 16}],
              **{"contract.seq_len": 32, "knobs.nproc": nproc, "baseline.nproc": 1})


def test_knob_kinds_and_levels_are_checked(tmp_path):
    with pytest.raises(SpecError, match=r"knobs\.dtype\.kind: Input should be 'micro_batch'"):
        _load(tmp_path, **{"knobs.dtype.kind": "dtype"})
    with pytest.raises(SpecError, match=r"levels names \['fp16'\], which are not among values"):
        _load(tmp_path, **{"knobs.dtype.levels": {"fp16": "fp16"}})
    with pytest.raises(SpecError, match=r"flag_style 'switch' needs boolean values"):
        _load(tmp_path, **{"knobs.dtype.flag_style": "switch"})


def test_builtin_priors_apply_by_kind_and_level_whatever_the_knob_is_called(tmp_path):
    spec = _load(tmp_path)
    priors = dict(builtin_priors(spec.space, spec.baseline, on_cpu=True).settings)
    # precision's bf16 row, reached through dtype = "bfloat16"
    assert priors[("dtype", "bfloat16")].log_time_mean == pytest.approx(-0.693, abs=1e-3)
    assert priors[("batch_size", 8)].log_time_mean < 0 < priors[("batch_size", 2)].log_time_mean
    assert ("compile", True) in priors and ("threads", 2) in priors
    # accumulation's effect is the micro-batch's; a knob of no known kind or name gets none
    assert not any(k in ("gradient_accumulation_steps", "fast") for k, _ in priors)
    # without kinds, only the by-name lookup applies (compile, threads), not batch_size or dtype
    plain = _spec(tmp_path)
    for knob in plain["knobs"].values():
        knob.pop("kind", None)
    path = tmp_path / "plain.toml"
    path.write_text(tomlkit.dumps(plain))
    spec = load_spec(path)
    names = {k for k, _ in builtin_priors(spec.space, spec.baseline, on_cpu=True).settings}
    assert names == {"compile", "threads"}


def test_the_builtin_spec_renders_as_before():
    """The baseline command passes every knob's flag at the baseline's value, which is also
    train.py's default: it trains what the command without them trained."""
    import dataclasses

    from infrarsi.stages.init import builtin_spec_path
    from workloads.gpt.train import parse_args

    spec = load_spec(builtin_spec_path())
    argv, env = render_command(spec, spec.space, spec.baseline)
    assert argv[argv.index("--nproc-per-node") + 1] == "1" and argv[argv.index("--micro-batch") + 1] == "2"
    script = list(argv[argv.index("train.py") + 1:])
    bare = script[:script.index("--micro-batch")]  # the command without the knobs' flags
    assert dataclasses.asdict(parse_args(script)) == dataclasses.asdict(parse_args(bare))
    assert parse_args(script).threads == 2 and parse_args(script).micro_batch == 2
    assert tomllib.loads(builtin_spec_path().read_text()).get("flag_style") is None
