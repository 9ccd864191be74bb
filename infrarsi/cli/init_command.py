"""``infrarsi init``: a starting campaign spec from the command that launches a job.

From ``python train.py --batch_size=12 ...`` (or a torchrun line) it reads the flags the
command gives and, where the script answers ``--help`` the argparse way, the flags it
knows. Flags whose names say what they do become knobs with a kind and candidate values
(micro-batch / accumulation splits of the same global batch, precision, compile, threads,
processes, optimizer implementations of one algorithm, ...); the sequence length, step
count and seed, from the command or else from ``--help``'s defaults, become the contract's
placeholders; one short dry run of the command shows its log lines, from which the log
adapter's patterns are guessed. What only the user can know is marked ``CONFIRM``.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomlkit

from infrarsi.cli.init_knobs import draft_knob, flag_argv, kind_of, one_knob_per_kind, powers_of_two
from infrarsi.cli.launch_command import Flag, ParsedCommand, help_flags, parse_command
from infrarsi.cli.log_patterns import GuessedPatterns, guess_patterns
from infrarsi.core.errors import InfrarsiError

CONTRACT_NAMES = {
    "num_steps": ("max_iters", "max_steps", "steps", "num_steps", "iters", "train_steps", "total_steps"),
    "seq_len": ("block_size", "seq_len", "seq_length", "max_seq_length", "context_length", "sequence_length",
                "max_length"),
    "seed": ("seed",),
}
DRY_RUN_STEPS = 3
MAX_TRIAL_STEPS = 20


def contract_field_of(name: str) -> str | None:
    return next((k for k, names in CONTRACT_NAMES.items() if name in names), None)


def dry_run(command: list[str], cwd: Path, timeout_s: float) -> tuple[str, int | None]:
    """Output (stdout and stderr) and exit code of one run; None when it ran out of time."""
    try:
        out = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=timeout_s,
                             stdin=subprocess.DEVNULL, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        return out.stdout + "\n" + out.stderr, out.returncode
    except subprocess.TimeoutExpired as exc:
        text = (exc.stdout or b"").decode(errors="replace") if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        return text, None


@dataclass
class Draft:
    """The spec being written, with comments for the keys the user must look at."""

    data: dict[str, Any]
    confirm: dict[str, str] = field(default_factory=dict)   # "table.key" or "key" -> why
    notes: list[str] = field(default_factory=list)           # header lines


def _usable_default(field_name: str, flag: Flag) -> bool:
    """Whether a contract flag the command does not give goes into the spec with --help's
    default: an integer seed or a positive sequence length; any step flag, since a trial
    sets its own step count."""
    value = flag.value
    if field_name == "num_steps":
        return True
    return isinstance(value, int) and not isinstance(value, bool) and (value > 0 or field_name == "seed")


def build_spec(cmd: ParsedCommand, known: list[Flag], patterns: GuessedPatterns, *, name: str,
               spec_name: str, cpus: int) -> Draft:
    """The spec dict for ``cmd``: ``known`` adds flags from ``--help`` the command does not give."""
    given = {f.name for f in cmd.flags}
    every = cmd.flags + [f for f in known if f.name not in given]
    style = max(("separate", "equals"), key=lambda s: sum(f.style == s for f in cmd.flags))
    draft = Draft(data={})
    knobs: dict[str, dict] = {}
    baseline: dict[str, Any] = {}
    contract: dict[str, Any] = {}
    template = list(cmd.launcher) + [cmd.script]
    by_kind = {kind_of(f.name): f for f in every if kind_of(f.name)}
    mb, ga = by_kind.get("micro_batch"), by_kind.get("grad_accum")
    split = mb is not None and ga is not None and isinstance(mb.value, int) and isinstance(ga.value, int)
    product = mb.value * ga.value if split else None
    from_help: set[str] = set()  # contract fields taken from --help's defaults
    knob_product = product * (cmd.nproc or 1) if split else None
    left_out = one_knob_per_kind(every, given, knob_product, style, cpus)
    for kept in {f.name: f for f in left_out.values()}.values():
        names = [f.spelled for f in every if f.name in left_out and left_out[f.name] is kept]
        kind = kind_of(kept.name)
        why = ("two precision switches could both be on (--bf16 with --fp16 the Trainer rejects); fp16 is a knob "
               "only where the command turns it on, as CPUs run it poorly if at all" if kind == "precision" else
               f"two {kind} knobs could clash or be aliases of one setting")
        draft.notes.append(f"{', '.join(names)} {'is' if len(names) == 1 else 'are'} not a knob: {kept.spelled} is "
                           f"the one {kind} knob, since {why}")
    for flag in every:
        field_name = contract_field_of(flag.name)
        if field_name and field_name not in contract and (flag.name in given or _usable_default(field_name, flag)):
            contract[field_name] = flag.value
            template += flag_argv(flag, "{" + field_name + "}")
            if flag.name not in given:
                from_help.add(field_name)
            continue
        knob = None if flag.name in left_out else draft_knob(flag, knob_product, style, cpus)
        if knob is None:
            if flag.name in given:
                template += [flag.spelled] if flag.style == "switch" else flag_argv(flag, flag.value)
            if kind_of(flag.name) == "optimizer" and len(flag.choices or ()) > 1:
                draft.notes.append(f"{flag.spelled} is not a knob: its values ({', '.join(map(str, flag.choices[:4]))}"
                                   ", ...) are other optimizers, which change what is trained; a knob may only "
                                   "switch between implementations of one algorithm")
            continue
        baseline[flag.name] = knob.pop("baseline")
        knobs[flag.name] = knob
        if flag.name not in given:
            draft.confirm[f"baseline.{flag.name}"] = "from --help, not the command: is this what the job runs today?"
    for item in cmd.args:
        if isinstance(item, str):
            template.append(item)
    if split:
        draft.data["fixed_products"] = [{"knobs": [mb.name, ga.name], "value": product}]
    elif mb is not None:
        draft.notes.append(f"{mb.name} is not a knob: without an accumulation flag it changes the global batch.")
    if "threads" not in {k["kind"] for k in knobs.values()}:
        knobs["omp_threads"] = {"values": powers_of_two(cpus), "env": "OMP_NUM_THREADS", "kind": "threads",
                                "description": "torch's intra-op threads, read at start-up"}
        baseline["omp_threads"] = powers_of_two(cpus)[-1]
    if cmd.nproc is not None:
        knobs["nproc"] = {"values": sorted({cmd.nproc, *powers_of_two(cpus)}), "placeholder": True,
                          "kind": "processes", "description": "torchrun processes"}
        baseline["nproc"] = cmd.nproc
        if split:
            draft.data["fixed_products"][0]["knobs"].append("nproc")
            draft.data["fixed_products"][0]["value"] = product * cmd.nproc
            draft.notes.append("CONFIRM fixed_products: micro-batch x accumulation x processes is the global batch "
                               "in sequences (if your script splits the batch over processes itself, drop nproc)")
    draft.data.update(name=name, workload_dir=".", repository="copy", command=template, flag_style=style,
                      baseline=baseline)
    draft.data["knobs"] = knobs
    draft.data["metrics"] = _metrics(patterns, draft)
    draft.data["contract"] = _contract(contract, from_help, cmd, patterns, product, draft, spec_name)
    draft.data["device"] = {"memory_capacity": "8GiB"}
    draft.confirm["device.memory_capacity"] = "per trial: on CPU the resident memory above which a trial is an OOM"
    draft.data["resources"] = {"cpus_per_trial": cpus}
    draft.data["budget"] = {"num_trials": 12, "trial_timeout_s": 300, "doctor_repeats": 3, "num_finalists": 1,
                            "verify_pairs": 3}
    return draft


def _metrics(p: GuessedPatterns, draft: Draft) -> dict[str, Any]:
    out: dict[str, Any] = {"source": "log", "stream": "both"}
    if p.step_pattern:
        out["step_pattern"] = p.step_pattern
        draft.notes.append(f"step_pattern was guessed from {p.num_step_lines} lines like: {p.step_example}")
    else:
        out["step_pattern"] = r"step (?P<step>\d+).*loss (?P<loss>[-+0-9.eE]+)"
        draft.confirm["metrics.step_pattern"] = "no loss line was found in the dry run: write the regex"
    if p.eval_pattern:
        out["eval_pattern"] = p.eval_pattern
    if p.tokens_pattern:
        out["tokens_pattern"] = p.tokens_pattern
    return out


def _contract(found: dict, from_help: set[str], cmd: ParsedCommand, p: GuessedPatterns, product: int | None,
              draft: Draft, spec_name: str) -> dict[str, Any]:
    """The contract: values from the command, else --help's defaults, else the dry run's tokens
    line; a value none of them gives is a placeholder, and every value is marked CONFIRM."""
    steps = found.get("num_steps")
    steps = min(steps, MAX_TRIAL_STEPS) if isinstance(steps, int) and steps > 1 else MAX_TRIAL_STEPS
    sequences = product * (cmd.nproc or 1) if product else None  # per optimizer step
    seq_len = found.get("seq_len")
    if seq_len is None and p.tokens_per_step and sequences:
        seq_len, seq_why = p.tokens_per_step // sequences, "derived from the dry run's tokens line"
    elif seq_len is None:
        seq_why = "PLACEHOLDER: neither the command nor --help gives it; write the job's tokens per sequence"
    else:
        seq_why = "--help's default (the command does not give it)" if "seq_len" in from_help else "from the command"
    if p.tokens_per_step:
        tokens, tokens_why = p.tokens_per_step, "from the tokens line of the dry run"
    elif sequences and seq_len:
        tokens, tokens_why = sequences * seq_len, f"computed: {sequences} sequences per step x seq_len"
    else:
        tokens, tokens_why = (sequences or 1) * (seq_len or 1), "PLACEHOLDER: write the job's tokens per step"
    seed = found.get("seed", 1234)
    c = {"seq_len": int(seq_len or 1), "global_batch_tokens": int(tokens), "num_steps": steps,
         "warmup_steps": 2 if steps > 3 else 1, "seed": int(seed), "loss_signal": "step",
         "editable": [cmd.script], "locked": [spec_name]}
    draft.confirm.update({
        "contract.seq_len": f"tokens per sequence, {seq_why}",
        "contract.global_batch_tokens": f"tokens per optimizer step, {tokens_why}",
        "contract.num_steps": "optimizer steps per trial, warm-up included (keep it short)",
        "contract.loss_signal": "'step' if the printed loss is the mean over the whole global batch (a Hugging "
                                "Face Trainer's is); 'window' (a moving mean over contract.loss_window steps, 4 "
                                "by default) if it is one micro-batch's (nanoGPT prints the last one's); 'eval' "
                                "to compare the eval losses. Doctor checks it: docs/loss-contract.md",
        "contract.locked": "the files that define what is trained (data, model, loss): hashed around every trial",
        "contract.editable": "the files a code patch may change",
    })
    if "seed" not in found:
        draft.confirm["contract.seed"] = ("PLACEHOLDER: the command passes no seed; add the script's seed flag as "
                                          "--seed={seed} (say) so verification's canary seeds reach the job")
    elif "seed" in from_help:
        draft.confirm["contract.seed"] = "--help's default (the command does not give it)"
    if not p.tokens_pattern:
        draft.data["metrics"]["tokens_per_step"] = c["global_batch_tokens"]
        draft.confirm["metrics.tokens_per_step"] = "the job prints no tokens line: a declared constant"
    return c


def render_toml(draft: Draft, command: list[str]) -> str:
    """The spec as TOML, with a header and ``# CONFIRM`` comments on the keys to check."""
    items = {key: tomlkit.item(value) for key, value in draft.data.items()}
    doc = tomlkit.document()
    # Plain keys before tables, as TOML needs them, so that tomlkit sets each table apart.
    doc.update(sorted(items.items(), key=lambda kv: isinstance(kv[1], (tomlkit.items.Table, tomlkit.items.AoT))))
    doc["command"].multiline(True)  # one argument a line reads like the command
    for name, why in draft.confirm.items():
        *tables, key = name.split(".")
        container = doc
        for table in tables:
            container = container[table]
        item = container.item(key)  # the tomlkit item even of a bool, which [key] unwraps
        item.comment(f"CONFIRM: {why}")
        item.trivia.comment_ws = "  "
    header = [f"# Written by `infrarsi init -- {shlex.join(command)}`.",
              "# Check every line marked CONFIRM, trim the knobs you do not want searched, then run",
              "#   infrarsi campaign <this file>",
              *(f"# {n}" for n in draft.notes), ""]
    return "\n".join(header) + "\n" + tomlkit.dumps(doc)


def _short(command: list[str], cmd: ParsedCommand, known: list[Flag]) -> list[str]:
    """``command`` with its step count cut to ``DRY_RUN_STEPS`` (given, or added where only
    --help knows the step flag), run by the interpreter the campaign's ``{python}`` will be
    (this one)."""
    prog = Path(command[0]).name
    head = [sys.executable] if prog.startswith("python") else [sys.executable, "-m", "torch.distributed.run"]
    steps = next((f for f in cmd.flags if contract_field_of(f.name) == "num_steps"), None)
    out, skip = head, False
    for tok in command[1:]:
        if skip:
            out.append(str(DRY_RUN_STEPS))
            skip = False
        elif steps is not None and steps.style == "equals" and tok.startswith(steps.spelled + "="):
            out.append(f"{steps.spelled}={DRY_RUN_STEPS}")
        else:
            skip = steps is not None and steps.style == "separate" and tok == steps.spelled
            out.append(tok)
    if steps is None:
        out += next(([f.spelled, str(DRY_RUN_STEPS)] for f in known if contract_field_of(f.name) == "num_steps"), [])
    return out


def init_spec(command: list[str], *, cwd: Path, out_path: Path, name: str | None = None,
              dry_run_timeout_s: float = 120.0, run_job: bool = True, force: bool = False) -> Path:
    """Write a starting spec for ``command`` (run from ``cwd``) to ``out_path``."""
    cwd, out_path = Path(cwd).resolve(), Path(out_path).resolve()
    if out_path.exists() and not force:
        raise InfrarsiError(f"{out_path} exists; pass --force to overwrite it or -o to write elsewhere")
    cmd = parse_command(command)
    if not (cwd / cmd.script).is_file():
        raise InfrarsiError(f"script {cmd.script!r} not found under {cwd}; run infrarsi init from the folder "
                            "you launch the job from")
    known = help_flags(cmd, cwd)
    patterns = GuessedPatterns()
    if run_job:
        output, code = dry_run(_short(command, cmd, known), cwd, dry_run_timeout_s)
        patterns = guess_patterns(output)
        if code not in (0, None) and not patterns.step_pattern:
            raise InfrarsiError(f"the dry run of the command exited {code} and printed no loss line; "
                                f"its last output:\n{output.strip()[-1500:]}\nfix the command first")
    try:
        spec_name = out_path.relative_to(cwd).as_posix()
    except ValueError:
        spec_name = cmd.script
    draft = build_spec(cmd, known, patterns, name=name or re.sub(r"\W+", "-", Path(cmd.script).stem).strip("-"),
                       spec_name=spec_name, cpus=os.cpu_count() or 1)
    draft.data["workload_dir"] = os.path.relpath(cwd, out_path.parent)
    out_path.write_text(render_toml(draft, command))
    return out_path
