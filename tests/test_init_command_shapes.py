"""The job you gave, unchanged: whatever shape a launch command has, the spec `infrarsi init`
writes renders its baseline as the argv typed, token for token and in order, with the
environment prefix as the environment. Property-tested over command shapes (hypothesis):
`--k v` and `--k=v` flags, positional config files before and after the overrides, Hydra
`k=v` / `+k=v`, a Lightning CLI subcommand with dotted flags, python / `python -m` /
torchrun / `accelerate launch` launchers, an environment prefix (`K=V` or `env K=V`).
What the baseline adds to the typed tokens are the levers of the job's families the command
does not set, each at its baseline: launcher options before the entry, flags after the
command, variables in the environment."""

import string
import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from infrarsi.discover.init import build_spec
from infrarsi.discover.draft import Observed, contract_field_of
from infrarsi.discover.command import parse_command
from infrarsi.contract.spec_load import parse_spec
from infrarsi.harness.command import flag_args, render_command

FOLDER = Path(tempfile.mkdtemp(prefix="infrarsi-shapes-"))
for name in ("train.py", "config/base.py", "config/small.py"):
    (FOLDER / name).parent.mkdir(parents=True, exist_ok=True)
    (FOLDER / name).write_text("# a stand-in: only its name matters here\n")

# Flags a trainer spells in many ways: (names, values as typed).
KNOB_FLAGS = [
    (["batch_size", "micro-batch", "per_device_train_batch_size", "train.micro_batch_size"], ["2", "4", "12"]),
    (["gradient_accumulation_steps", "grad_accum", "accumulate_grad_batches"], ["1", "4", "8"]),
    (["dtype", "precision", "trainer.precision"], ["float32", "bfloat16", "bf16-mixed", "32", "fp32"]),
    (["compile", "torch_compile"], ["False", "True", "false", "true", "on", "off"]),
    (["threads", "num_threads"], ["1", "2"]),
    (["max_iters", "max_steps", "steps", "trainer.max_steps"], ["20", "30", "5000"]),
    (["seed"], ["0", "1337", "42"]),
    (["block_size", "seq_len", "max_seq_length"], ["64", "128", "1024"]),
    (["lr", "learning_rate", "optimizer.lr"], ["3e-4", "0.001", "1e-3"]),
    (["out_dir", "output_dir"], ["out", "runs/x"]),
    (["note"], ["{curly}", "a}b"]),
]
LAUNCHERS = [
    ["python", "train.py"], ["python3", "train.py"], ["python", "-u", "train.py"], ["python", "-m", "pkg.train"],
    ["torchrun", "--standalone", "--nproc_per_node=2", "train.py"],
    ["torchrun", "--nnodes", "1", "--nproc-per-node", "1", "train.py"],
    ["python", "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "train.py"],
    ["accelerate", "launch", "--num_processes", "2", "--mixed_precision", "no", "train.py"],
    ["python", "train.py", "fit"],
]


@st.composite
def flag(draw):
    names, values = draw(st.sampled_from(KNOB_FLAGS))
    name, value = draw(st.sampled_from(names)), draw(st.sampled_from(values))
    style = draw(st.sampled_from(["separate", "equals", "dashless"]))
    if style == "dashless":
        return [f"{draw(st.sampled_from(['', '+']))}{name}={value}"]
    dashes = "--" if len(name) > 1 else "-"
    return [f"{dashes}{name}", value] if style == "separate" else [f"{dashes}{name}={value}"]


@st.composite
def command(draw):
    env = draw(st.lists(st.sampled_from(["OMP_NUM_THREADS=1", "CUDA_VISIBLE_DEVICES=0", "TOKENIZERS_PARALLELISM=false"]),
                        unique=True, max_size=2))
    if env and draw(st.booleans()):
        env = ["env", *env]
    launcher = draw(st.sampled_from(LAUNCHERS))
    before = draw(st.lists(st.sampled_from(["config/base.py", "config/small.py"]), unique=True, max_size=1))
    flags = draw(st.lists(flag(), max_size=7))
    seen, args = set(), []
    for tokens in flags:  # one spelling per flag name, as a user types each once
        key = tokens[0].split("=")[0].lstrip("-+")
        if key not in seen:
            seen.add(key)
            args += tokens
    after = draw(st.lists(st.sampled_from(["config/base.py"]), max_size=1))
    switch = draw(st.lists(st.sampled_from(["--bf16", "--gradient_checkpointing", "--no-cuda"]), unique=True,
                           max_size=2))
    words = draw(st.text(alphabet=string.ascii_lowercase, min_size=1, max_size=6))
    return [*env, *launcher, *before, *args, *switch, *after, words]


def _rendered(argv: list[str]) -> tuple[tuple[str, ...], dict[str, str], list[str]]:
    cmd = parse_command(argv)
    draft = build_spec(cmd, [], Observed(), name="shapes", cpus=2, default_threads=2)
    data = draft.data
    # Render at the step count and seed typed, as the user's own command ran.
    typed = {}  # contract field -> the value of the first flag that gives it, as init reads them
    for f in cmd.flags:
        typed.setdefault(contract_field_of(f), f.value)
    seq_len = typed.get("seq_len", 8)
    data["contract"].update(num_steps=max(int(typed.get("num_steps", 20)), 2), warmup_steps=1, seq_len=seq_len,
                            global_batch_tokens=8 * seq_len, seed=int(typed.get("seed", 1234)))
    data["metrics"].pop("tokens_per_step", None)
    data["metrics"]["tokens_pattern"] = r"tokens (?P<tokens>\d+)"
    data["contract"]["locked"] = ["train.py"]
    data.pop("fixed_products", None)  # the product's values are not what this test is about
    spec = parse_spec(data, source="shapes", base_dir=FOLDER)
    out, env = render_command(spec, spec.space, spec.space.validate(spec.baseline))
    return out, env, cmd.argv, spec


def _typed_part(rendered: tuple[str, ...], spec, typed: list[str]) -> list[str]:
    """``rendered`` less what the levers add: the flags appended after the command, each at
    its baseline, and a launcher option the command did not type, inserted before the entry
    with its knob's value."""
    appended = [t for k in spec.space.knobs if k.flag and not k.placeholder
                for t in flag_args(k, spec.baseline[k.name])]
    core = list(rendered[:len(rendered) - len(appended)])
    assert list(rendered[len(core):]) == appended
    knobs = {"{" + k.name + "}" for k in spec.space.knobs if k.placeholder}
    for option, value in zip(spec.command, spec.command[1:]):
        if option.startswith("--") and not {"{", "}"} & set(option) and option not in typed and value in knobs:
            i = core.index(option)
            assert core[i + 1] == str(spec.baseline[value.strip("{}")])
            del core[i:i + 2]
    return core


@settings(max_examples=300, deadline=None)
@given(command())
def test_the_baseline_renders_the_command_as_typed(argv):
    rendered, env, typed, spec = _rendered(argv)
    typed_env = dict(t.split("=", 1) for t in argv[:len(argv) - len(typed)] if t != "env")
    assert _typed_part(rendered, spec, typed) == typed
    carried = {k.env: str(spec.baseline[k.name]) for k in spec.space.knobs if k.env}
    assert env == {**typed_env, **carried} and all(env[k] == v for k, v in typed_env.items())


def test_a_positional_config_file_keeps_its_place_before_the_overrides():
    """The shape that broke: nanoGPT's configurator reads a config file, then --key=value
    overrides in order; the file moved after the overrides trained the file's model."""
    argv = ["python", "train.py", "config/small.py", "--device=cpu", "--n_layer=4", "--block_size=128",
            "--batch_size=12", "--gradient_accumulation_steps=4", "--max_iters=30", "--compile=False"]
    rendered, env, typed, spec = _rendered(argv)
    assert _typed_part(rendered, spec, argv) == argv and set(env) <= {"OMP_NUM_THREADS"}
    spec_command = build_spec(parse_command(argv), [], Observed(), name="x", cpus=2).data["command"]
    assert spec_command[:5] == ["python", "train.py", "config/small.py", "--device=cpu", "--n_layer=4"]
    assert "--block_size={seq_len}" in spec_command and "--batch_size={batch_size}" in spec_command
