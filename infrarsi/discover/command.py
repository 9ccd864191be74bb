"""A launch command, read as typed: its environment prefix, the program and entry point,
and the entry's flags with where each stands.

``parse_command`` understands an environment prefix (``K=V cmd`` or ``env K=V cmd``),
``python train.py ...``, ``python -m pkg.train ...``,
``torchrun [options] train.py ...`` (and ``python -m torch.distributed.run``),
``accelerate launch [options] train.py ...``, and a console script with a subcommand
(``trl sft ...``, ``litgpt pretrain ...``). Nothing is reordered: every flag keeps the index
of its token in the typed argv, so a spec can replace a value where it stood.
``help_flags`` reads the flags an argparse-, HfArgumentParser- or jsonargparse-style
``--help`` lists, with defaults and choices where it shows them.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from infrarsi.core.errors import InfrarsiError

# Launcher options that take no value (torchrun, accelerate launch, deepspeed): every
# other option before the entry is taken to be followed by its value.
_BARE_LAUNCHER_OPTIONS = {"--standalone", "--no-python", "--no_python", "--run-path", "--run_path", "--cpu",
                          "--multi_gpu", "--multi-gpu", "--tpu", "--use_deepspeed", "--use_fsdp", "--use_megatron_lm",
                          "--debug", "-q", "--quiet", "--no-local-rank", "--no_local_rank"}
_PROCESS_OPTIONS = {"nproc_per_node", "num_processes", "num_gpus"}  # the launcher's processes per node
_PYTHON_OPTIONS_WITH_VALUE = {"-X", "-W", "-Q"}
_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=.*")
_KEY_VALUE = re.compile(r"[A-Za-z_][\w.]*=\S*")  # Hydra / nanoGPT configurator overrides: k=v, +k=v is a positional


@dataclass
class Flag:
    name: str          # as the script spells it, without dashes: batch_size, train.micro_batch_size
    spelled: str       # as it goes on the command line: --batch_size, --micro-batch, batch_size
    value: Any         # the value the command gives (or --help's default); True for a bare switch
    style: str         # separate | equals | switch
    choices: list | None = None  # what --help lists as its choices ({fp32,bf16})
    raw: str | None = None  # the value as typed (None: from --help, or a bare switch)
    index: int | None = None  # the token holding the value (the flag itself for equals and switch)
    origin: str = "the command"  # where the value was read: the command, --help, the job's settings, ...

    @property
    def key(self) -> str:
        """The last component of a dotted name, for kinds and contract fields (train.micro_batch_size)."""
        return self.name.rsplit(".", 1)[-1]


@dataclass
class ParsedCommand:
    argv: list[str]                      # the command as typed, without its environment prefix
    env: dict[str, str] = field(default_factory=dict)  # NAME=value assignments typed before it
    entry: list[str] = field(default_factory=list)     # what --help is asked of: program (and launcher) to the script
    script: str | None = None            # the script file, where the entry is one
    flags: list[Flag] = field(default_factory=list)    # the entry's flags, in order
    nproc: int | None = None             # processes per node the launcher starts
    nproc_index: int | None = None       # the token holding that count
    nproc_style: str = "separate"
    launcher: str = "python"             # python | torchrun | accelerate | program
    typed: list[str] = field(default_factory=list)  # the whole command as typed, prefix included
    launcher_flags: list[Flag] = field(default_factory=list)  # the launcher's own options, as typed
    entry_index: int | None = None       # the token where the entry (script or -m) starts
    module: str | None = None            # the entry module of ``python -m``

    @property
    def python_like(self) -> bool:
        return _is_python(self.argv[0])


def _is_python(program: str) -> bool:
    return re.fullmatch(r"python[\d.]*", Path(program).name) is not None


def _key(name: str) -> str:
    return name.lstrip("-").replace("-", "_").lower()


def literal(raw: str) -> Any:
    """A typed value as the number or boolean it spells, else the text."""
    low = raw.lower()
    if low in ("true", "false"):
        return low == "true"
    for cast in (int, float):
        try:
            return cast(raw)
        except ValueError:
            pass
    return raw


def parse_flags(argv: list[str], start: int) -> list[Flag]:
    """The flags among ``argv[start:]``, each with the index of the token holding its value."""
    flags: list[Flag] = []
    i = start
    while i < len(argv):
        tok = argv[i]
        if tok.startswith("-") and len(tok) > 1 and "=" in tok:
            name, _, raw = tok.partition("=")
            flags.append(Flag(_key(name), name, literal(raw), "equals", raw=raw, index=i))
        elif tok.startswith("-") and len(tok) > 1 and i + 1 < len(argv) and not argv[i + 1].startswith("-"):
            flags.append(Flag(_key(tok), tok, literal(argv[i + 1]), "separate", raw=argv[i + 1], index=i + 1))
            i += 1
        elif tok.startswith("-") and len(tok) > 1:
            flags.append(Flag(_key(tok), tok, True, "switch", index=i))
        elif _KEY_VALUE.fullmatch(tok):
            name, _, raw = tok.partition("=")
            flags.append(Flag(_key(name), name, literal(raw), "equals", raw=raw, index=i))
        i += 1
    return flags


def _launcher_options(cmd: ParsedCommand, i: int) -> int:
    """Skip the launcher's own options from ``argv[i]``, noting its process count; the index
    of the entry (a script, or ``-m module``)."""
    argv = cmd.argv
    while i < len(argv) and argv[i].startswith("-") and argv[i] not in ("-m", "--module"):
        name, eq, raw = argv[i].partition("=")
        bare = not eq and (argv[i] in _BARE_LAUNCHER_OPTIONS or i + 1 >= len(argv))
        value_at = i if eq else (None if bare else i + 1)
        if value_at is not None:
            typed = raw if eq else argv[i + 1]
            cmd.launcher_flags.append(Flag(_key(name), name, literal(typed), "equals" if eq else "separate",
                                           raw=typed, index=value_at))
        if _key(name) in _PROCESS_OPTIONS and value_at is not None:
            raw = raw if eq else argv[i + 1]
            cmd.nproc = int(raw) if raw.isdigit() else None
            cmd.nproc_index, cmd.nproc_style = value_at, "equals" if eq else "separate"
        i += 1 if (eq or bare) else 2
    return i


def _entry(cmd: ParsedCommand, i: int) -> int:
    """The entry at ``argv[i]`` (a script or ``-m module``): sets ``entry`` and ``script``;
    the index where the entry's own arguments start."""
    argv = cmd.argv
    if i >= len(argv):
        raise InfrarsiError(f"no script or module after the launcher in {' '.join(argv)}")
    cmd.entry_index = i
    if argv[i] in ("-m", "--module") and i + 1 < len(argv):
        cmd.entry = [*(["python"] if not cmd.python_like else argv[:1]), "-m", argv[i + 1]]
        cmd.module = argv[i + 1]
        return i + 2
    cmd.script = argv[i]
    cmd.entry = [argv[0], argv[i]] if cmd.python_like else ["python", argv[i]]
    return i + 1


def parse_command(command: list[str]) -> ParsedCommand:
    """Read a launch command as typed; nothing is reordered or dropped."""
    if not command:
        raise InfrarsiError("infrarsi init needs the launch command after '--', e.g. "
                            "infrarsi init -- python train.py --batch_size=12")
    env: dict[str, str] = {}
    n = 1 if Path(command[0]).name == "env" else 0
    if n and len(command) > 1 and command[1].startswith("-"):
        raise InfrarsiError(f"`env {command[1]}` is not read: give the environment as NAME=value assignments "
                            f"before the program (env NAME=value python train.py ...)")
    while n < len(command) - 1 and _ASSIGNMENT.fullmatch(command[n]):
        name, _, value = command[n].partition("=")
        env[name] = value
        n += 1
    if n >= len(command):
        raise InfrarsiError(f"no program after the environment prefix in {' '.join(command)}")
    cmd = ParsedCommand(argv=list(command[n:]), env=env, typed=list(command))
    argv, prog = cmd.argv, Path(cmd.argv[0]).name
    if cmd.python_like:
        i = 1
        while i < len(argv) and argv[i].startswith("-") and argv[i] not in ("-m", "-c"):
            i += 2 if argv[i] in _PYTHON_OPTIONS_WITH_VALUE else 1
        if argv[i:i + 2] == ["-m", "torch.distributed.run"]:
            cmd.launcher = "torchrun"
            start = _entry(cmd, _launcher_options(cmd, i + 2))
        else:
            start = _entry(cmd, i)
    elif prog == "torchrun":
        cmd.launcher = "torchrun"
        start = _entry(cmd, _launcher_options(cmd, 1))
    elif prog == "accelerate" and argv[1:2] == ["launch"]:
        cmd.launcher = "accelerate"
        start = _entry(cmd, _launcher_options(cmd, 2))
    else:
        # A console script: its subcommand (trl sft, litgpt pretrain) is part of the entry.
        cmd.launcher = "program"
        start = 2 if len(argv) > 1 and re.fullmatch(r"[a-z][\w-]*", argv[1]) else 1
        cmd.entry = argv[:start]
    if cmd.script is not None and not cmd.script.endswith(".py"):
        raise InfrarsiError(f"{cmd.script!r} after the launcher is not a .py script; give the command that runs "
                            "your training script (python train.py ..., torchrun ... train.py ...)")
    cmd.flags = parse_flags(argv, start)
    return cmd


def help_flags(command: ParsedCommand, cwd: Path, env: dict[str, str], timeout_s: float = 120) -> list[Flag]:
    """Flags the entry's ``--help`` lists, with their defaults where it shows them (None
    where it shows none, or shows ``None``/``null``). Empty when the entry has no such help."""
    try:
        out = subprocess.run([*command.entry, "--help"], cwd=cwd, capture_output=True, text=True,
                             timeout=timeout_s, stdin=subprocess.DEVNULL, env=env)
    except (OSError, subprocess.TimeoutExpired):
        return []
    if out.returncode != 0:
        return []
    return parse_help(out.stdout)


def parse_help(text: str) -> list[Flag]:
    """The flags a ``--help`` text lists, with the default and choices it shows for each
    (argparse's and jsonargparse's layout, and tyro's, whose groups are drawn in boxes)."""
    text = "\n".join(re.sub(r"\s*│\s*$", "", re.sub(r"^│ ", "  ", line)) for line in text.splitlines())
    found: dict[str, Flag] = {}
    for m in re.finditer(r"^\s{1,8}(?:-\w, )?(--[\w.-]+)(?:[ =]([A-Z_{}\[\],\w.-]+))?(.*(?:\n\s{12,}.*)*)",
                         text, re.M):
        spelled, metavar, text_after = m.group(1), m.group(2), m.group(3)
        default = re.search(r"default:\s*([^),]*)\)?|defaults? to `?([^`\s.,)]+)", text_after)
        raw = (default.group(1) or default.group(2) or "").strip() if default else None
        value = None if raw in (None, "", "None", "null") else literal(raw)
        style = "switch" if metavar is None else "separate"
        if style == "switch" and value is None and not _key(spelled).startswith("no_"):
            value = False  # argparse's store_true: off unless typed
        choices = [literal(c) for c in metavar[1:-1].split(",")] if metavar and metavar.startswith("{") else None
        if spelled != "--help" and _key(spelled) not in found:
            found[_key(spelled)] = Flag(_key(spelled), spelled, value, style, choices, origin="--help")
    return list(found.values())
