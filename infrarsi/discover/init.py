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

import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import tomlkit

from infrarsi.discover.dry_run import DryRun, dry_run
from infrarsi.discover.contract_draft import contract_and_metrics
from infrarsi.discover.draft import (
    DRY_RUN_STEPS,
    Draft,
    batch_flags,
    Observed,
    contract_field_of,
    draft_command,
    typed_tokens_per_step,
)
from infrarsi.discover.command import Flag, ParsedCommand, help_flags, parse_command
from infrarsi.discover.log_patterns import guess_patterns
from infrarsi.core.errors import InfrarsiError


def build_spec(cmd: ParsedCommand, known: list[Flag], seen: Observed, *, name: str, cpus: int,
               default_threads: int | None = None) -> Draft:
    """The spec dict for ``cmd``, with its CONFIRM comments and header notes."""
    draft, facts = draft_command(cmd, known, seen, name=name, cpus=cpus, default_threads=default_threads)
    contract_and_metrics(draft, cmd, seen, facts)
    draft.data["resources"] = {"cpus_per_trial": cpus}
    return draft


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
    moved = None
    changes = _split(cmd)
    if changes and losses:
        other = _losses(dry_run(short_argv(cmd, known, DRY_RUN_STEPS, changes), cwd, env, timeout_s),
                        patterns.step_pattern)
        if other:
            moved = abs(other[0] - losses[0]) / max(abs(losses[0]), 1e-12)
    return Observed(patterns=patterns, num_losses=len(losses) if patterns.step_pattern else None,
                    first_loss=patterns.first_loss, fact_lines=patterns.fact_lines, files_read=run.files_read,
                    split_moved=moved)


def _losses(run: DryRun, pattern: str | None) -> list[float]:
    if not pattern:
        return []
    return [float(m["loss"]) for line in run.output.splitlines() for m in [re.search(pattern, line)] if m]


def torch_threads(cmd: ParsedCommand, cwd: Path, env: dict[str, str]) -> int | None:
    """torch's intra-op thread count in the job's own interpreter, where it is one process
    and python runs it (torchrun sets its own per worker): None elsewhere or on failure."""
    if not cmd.python_like or cmd.launcher != "python":
        return None
    try:
        out = subprocess.run([cmd.argv[0], "-c", "import torch; print(torch.get_num_threads())"], cwd=cwd, env=env,
                             capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return int(out.stdout.strip()) if out.returncode == 0 and out.stdout.strip().isdigit() else None


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
    known = help_flags(cmd, cwd, env)
    seen = _observe(cmd, known, cwd, env, dry_run_timeout_s) if run_job else Observed()
    entry = Path(cmd.script).stem if cmd.script else "-".join(Path(t).stem for t in cmd.entry if t != "-m")
    draft = build_spec(cmd, known, seen, name=name or re.sub(r"[^A-Za-z0-9_.-]+", "-", entry).strip("-.") or "job",
                       cpus=os.cpu_count() or 1, default_threads=torch_threads(cmd, cwd, env))
    draft.data["workload_dir"] = os.path.relpath(cwd, out_path.parent)
    out_path.write_text(render_toml(draft, command))
    return out_path
