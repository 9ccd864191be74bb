"""``infrarsi init``: a starting campaign spec from the command that launches a job.

It reads the command as typed (``infrarsi.discover.command``) and, where the entry answers
``--help``, the flags it knows; runs the command once for a few steps exactly as typed but
for its step count (``infrarsi.discover.dry_run``), to read its log lines, count the losses it
prints per step, see the files it reads and what it states about its model; where the
command splits its batch into micro-batches, runs one honest split too, to see whether the
printed loss is the global batch's. The spec (``infrarsi.discover.draft`` and
``infrarsi.discover.contract_draft``) keeps the command token for token, checks every guess against the
command's own numbers and marks what only the user can know ``CONFIRM``.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Mapping

import tomlkit

from infrarsi.discover.dry_run import DryRun, dry_run
from infrarsi.discover.contract_draft import contract_and_metrics
from infrarsi.discover.draft import (
    DRY_RUN_STEPS,
    Draft,
    batch_flags,
    Observed,
    SplitComparison,
    contract_field_of,
    draft_command,
    typed_tokens_per_step,
)
from infrarsi.discover.command import Flag, ParsedCommand, help_flags, parse_command
from infrarsi.discover.lever_knobs import Machine, levers_for
from infrarsi.discover.levers import Family, JobFacts, families_of
from infrarsi.discover.settings import argparse_defaults, python_settings, yaml_settings
from infrarsi.discover.log_patterns import guess_patterns
from infrarsi.core.errors import InfrarsiError
from infrarsi.harness.log_adapter import printed_quantum


def build_spec(cmd: ParsedCommand, known: list[Flag], seen: Observed, *, name: str, cpus: int,
               default_threads: int | None = None, gpus: int = 0, environ: Mapping[str, str] | None = None,
               families: tuple[Family, ...] | None = None, source: str = "") -> Draft:
    """The spec dict for ``cmd``, with its CONFIRM comments and header notes. ``families``
    default to those the command, ``known`` and ``seen`` show (``source``: the script's text)."""
    machine = Machine(cpus=cpus, gpus=gpus, torch_threads=default_threads)
    levers = levers_for(cmd, job_facts(cmd, known, seen, source), machine, families)
    draft, facts = draft_command(cmd, known, seen, name=name, levers=levers, environ=environ or {})
    contract_and_metrics(draft, cmd, seen, facts)
    draft.data["resources"] = {"cpus_per_trial": cpus, **({"gpus_per_trial": gpus} if gpus else {})}
    if gpus:
        draft.confirm["resources.gpus_per_trial"] = (f"every GPU the job's interpreter sees ({gpus}): one trial at a "
                                                     "time, free to run as many processes as there are GPUs")
    if levers.families:
        draft.notes[:0] = ["trainer families (infrarsi/discover/levers/): "
                           + ", ".join(f.family for f in levers.families),
                           *(f.note for f in levers.families if f.note)]
    return draft


def job_facts(cmd: ParsedCommand, known: list[Flag], seen: Observed, source: str) -> JobFacts:
    return JobFacts(program=Path(cmd.argv[0]).name, launcher=cmd.launcher, module=cmd.module, script=cmd.script,
                    help=frozenset(f.name for f in known if f.origin == "--help"), files_read=seen.files_read,
                    source=source)


def short_argv(cmd: ParsedCommand, known: list[Flag], steps: int, changes: dict[int, str] | None = None) -> list[str]:
    """The command as typed with its step count set to ``steps`` (in place, or added where
    only --help knows the step flag), and any token replaced by ``changes`` (index -> token)."""
    argv = list(cmd.argv)
    for i, token in (changes or {}).items():
        argv[i] = token
    given = next((f for f in cmd.flags if contract_field_of(f) == "num_steps"), None)
    tokens = next((f for f in cmd.flags if contract_field_of(f) == "num_tokens"), None)
    per_step = typed_tokens_per_step(cmd, known)
    if given is None and tokens is not None:  # the length in tokens: as typed where a step's tokens are unknown
        given, steps = (tokens, steps * per_step) if per_step else (None, None)
        if given is None:
            return argv
    if given is not None:
        argv[given.index] = f"{given.spelled}={steps}" if given.style == "equals" else str(steps)
        return argv
    helped = next((f for f in known if contract_field_of(f) == "num_steps"), None)
    if helped is not None:
        argv += [f"{helped.spelled}={steps}"] if helped.style == "equals" else [helped.spelled, str(steps)]
    return argv


def _split(cmd: ParsedCommand) -> dict[int, str] | None:
    """Tokens that run an honest split of the command's own batch: micro-batch halved (or
    doubled) and accumulation the other way, or, where the job derives its accumulation from
    a global batch, the micro-batch alone; None where the command gives no such pair."""
    mb, ga, gb = batch_flags(cmd.flags)
    if mb is None or (ga is None and gb is None):
        return None
    total = mb.value * ga.value if ga else gb.value
    m = mb.value // 2 if mb.value % 2 == 0 else mb.value * 2
    if m < 1 or total % m:
        return None

    def token(flag: Flag, value: int) -> str:
        return f"{flag.spelled}={value}" if flag.style == "equals" else str(value)
    return {mb.index: token(mb, m), **({ga.index: token(ga, total // m)} if ga else {})}


def _observe(cmd: ParsedCommand, known: list[Flag], cwd: Path, env: dict[str, str], timeout_s: float) -> Observed:
    """Run the command short (and an honest split of it), and read what it printed."""
    run = dry_run(short_argv(cmd, known, DRY_RUN_STEPS), cwd, env, timeout_s)
    patterns = guess_patterns(run.output)
    if run.exit_code not in (0, None) and not patterns.step_pattern:
        raise InfrarsiError(f"the dry run of the command exited {run.exit_code} and printed no loss line; "
                            f"its last output:\n{run.output.strip()[-1500:]}\nfix the command first "
                            "(or pass --no-dry-run and write the spec's metrics by hand)")
    losses = _losses(run, patterns.step_pattern)
    split = None
    changes = _split(cmd)
    if changes and losses:
        other = _losses(dry_run(short_argv(cmd, known, DRY_RUN_STEPS, changes), cwd, env, timeout_s),
                        patterns.step_pattern)
        split = compare_losses(losses, other)
    return Observed(patterns=patterns, num_losses=len(losses) if patterns.step_pattern else None,
                    first_loss=patterns.first_loss, fact_lines=patterns.fact_lines, files_read=run.files_read,
                    split=split)


def _losses(run: DryRun, pattern: str | None) -> list[str]:
    """The losses the run printed, as printed."""
    if not pattern:
        return []
    return [m["loss"] for line in run.output.splitlines() for m in [re.search(pattern, line)] if m]


def compare_losses(ours: list[str], theirs: list[str]) -> SplitComparison | None:
    """Every step both runs printed, compared: the largest relative difference, and the
    relative size of one last printed digit (a difference below it cannot be told from
    rounding)."""
    pairs = [(float(a), float(b), a) for a, b in zip(ours, theirs)]
    if not pairs:
        return None
    moved = [abs(b - a) / max(abs(a), 1e-12) for a, b, _ in pairs]
    worst = max(range(len(moved)), key=moved.__getitem__)
    resolution = max(printed_quantum(text) / max(abs(a), 1e-12) for a, _, text in pairs)
    return SplitComparison(moved=moved[worst], at_step=worst, num_compared=len(pairs), resolution=resolution)


def probe_machine(cmd: ParsedCommand, cwd: Path, env: dict[str, str]) -> tuple[int | None, int]:
    """(torch's intra-op thread count, CUDA devices) in the job's own interpreter: the
    command's python, or the interpreter a console script or launcher names in its first
    line; (None, 0) where it cannot be asked."""
    python = cmd.argv[0] if cmd.python_like else _interpreter(cmd.argv[0], cwd)
    if python is None:
        return None, 0
    code = "import torch; print(torch.get_num_threads(), torch.cuda.device_count())"
    try:
        out = subprocess.run([python, "-c", code], cwd=cwd, env=env, capture_output=True, text=True, timeout=120,
                             stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return None, 0
    words = out.stdout.split()
    if out.returncode != 0 or len(words) != 2 or not all(w.isdigit() for w in words):
        return None, 0
    return int(words[0]), int(words[1])


def _interpreter(program: str, cwd: Path) -> str | None:
    """The python a console script runs on (its ``#!`` line), if it is one."""
    path = shutil.which(program) or (str(cwd / program) if (cwd / program).is_file() else None)
    try:
        first = Path(path).read_bytes()[:256].split(b"\n", 1)[0].decode() if path else ""
    except (OSError, UnicodeDecodeError):
        return None
    words = first[2:].split() if first.startswith("#!") else []
    if words and Path(words[0]).name == "env" and len(words) > 1:
        words = words[1:]
    return words[0] if words and re.fullmatch(r"python[\d.]*", Path(words[0]).name) else None


def parser_flags(cmd: ParsedCommand, cwd: Path, help_known: list[Flag], families: tuple[Family, ...]) -> list[Flag]:
    """The flags the job's parser knows: --help's, with defaults a plain argparse script's
    source gives where its help shows none, and the settings its families read (a
    configurator's module-level names, a YAML config's keys)."""
    script = cwd / cmd.script if cmd.script else None
    source_defaults = argparse_defaults(script) if script else {}
    known = [f if f.value is not None or f.name not in source_defaults else
             dataclasses.replace(f, value=source_defaults[f.name]) for f in help_known]
    names = {f.name for f in known}
    for family in families:
        extra: list[Flag] = []
        if family.settings.python and script is not None:
            configs = [cwd / t for t in cmd.argv[(cmd.entry_index or 0) + 1:]
                       if t.endswith(".py") and not t.startswith("-") and (cwd / t).is_file()]
            extra = python_settings(script, configs)
        if family.settings.config_flag:
            given = next((f for f in cmd.flags if f.spelled == family.settings.config_flag), None)
            if given is not None and (cwd / str(given.value)).is_file():
                extra = yaml_settings(cwd / str(given.value))
        known += [f for f in extra if f.name not in names]
        names |= {f.name for f in extra}
    return known


def _source(cwd: Path, cmd: ParsedCommand) -> str:
    try:
        return (cwd / cmd.script).read_text(errors="replace") if cmd.script else ""
    except OSError:
        return ""


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


def init_spec(command: list[str], *, cwd: Path, out_path: Path, name: str | None = None,
              dry_run_timeout_s: float = 120.0, run_job: bool = True, force: bool = False) -> Path:
    """Write a starting spec for ``command`` (run from ``cwd``) to ``out_path``."""
    cwd, out_path = Path(cwd).resolve(), Path(out_path).resolve()
    if out_path.exists() and not force:
        raise InfrarsiError(f"{out_path} exists; pass --force to overwrite it or -o to write elsewhere")
    cmd = parse_command(command)
    if cmd.script is not None and not (cwd / cmd.script).is_file():
        raise InfrarsiError(f"script {cmd.script!r} not found under {cwd}; run infrarsi init from the folder "
                            "you launch the job from")
    if shutil.which(cmd.argv[0]) is None and not (cwd / cmd.argv[0]).is_file():
        raise InfrarsiError(f"{cmd.argv[0]!r} is not on PATH; activate the environment you launch the job from, "
                            "then run infrarsi init again")
    env = {**os.environ, **cmd.env}
    source = _source(cwd, cmd)
    help_known = help_flags(cmd, cwd, env)
    families = families_of(job_facts(cmd, help_known, Observed(), source))
    known = parser_flags(cmd, cwd, help_known, families)
    seen = _observe(cmd, known, cwd, env, dry_run_timeout_s) if run_job else Observed()
    found = families_of(job_facts(cmd, help_known, seen, source))
    if found != families:  # the dry run showed a family (a file it read): read its settings too
        families, known = found, parser_flags(cmd, cwd, help_known, found)
    threads, gpus = probe_machine(cmd, cwd, env)
    entry = Path(cmd.script).stem if cmd.script else "-".join(Path(t).stem for t in cmd.entry if t != "-m")
    draft = build_spec(cmd, known, seen, name=name or re.sub(r"[^A-Za-z0-9_.-]+", "-", entry).strip("-.") or "job",
                       cpus=os.cpu_count() or 1, default_threads=threads, gpus=gpus, environ=os.environ,
                       families=families, source=source)
    draft.data["workload_dir"] = os.path.relpath(cwd, out_path.parent)
    out_path.write_text(render_toml(draft, command))
    return out_path
