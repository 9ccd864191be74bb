"""A launch command, read: launcher, script and the script's flags in order.

``parse_command`` splits ``python train.py ...`` or a torchrun line; ``help_flags`` reads
the flags an argparse-style ``--help`` lists, with defaults and choices where it shows them.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from infrarsi.core.errors import InfrarsiError


@dataclass
class Flag:
    name: str          # as the script spells it, without dashes: batch_size
    spelled: str       # as it goes on the command line: --batch_size, --micro-batch, batch_size
    value: Any         # the value the command gives (or --help's default); True for a bare switch
    style: str         # separate | equals | switch
    choices: list | None = None  # what --help lists as its choices ({fp32,bf16})


@dataclass
class ParsedCommand:
    launcher: list[str]                  # ["{python}"] or ["{python}", "-m", "torch.distributed.run", ...]
    script: str
    args: list[Flag | str] = field(default_factory=list)  # the script's arguments, in order
    nproc: int | None = None             # torchrun's --nproc-per-node

    @property
    def flags(self) -> list[Flag]:
        return [a for a in self.args if isinstance(a, Flag)]


def _key(name: str) -> str:
    return name.lstrip("-").replace("-", "_").lower()


def _literal(raw: str) -> Any:
    low = raw.lower()
    if low in ("true", "false"):
        return low == "true"
    for cast in (int, float):
        try:
            return cast(raw)
        except ValueError:
            pass
    return raw


def _parse_args(args: list[str]) -> list[Flag | str]:
    flags: list[Flag | str] = []
    i = 0
    while i < len(args):
        tok = args[i]
        if tok.startswith("-") and "=" in tok:
            name, _, raw = tok.partition("=")
            flags.append(Flag(_key(name), name, _literal(raw), "equals"))
        elif tok.startswith("-") and i + 1 < len(args) and not args[i + 1].startswith("-"):
            flags.append(Flag(_key(tok), tok, _literal(args[i + 1]), "separate"))
            i += 1
        elif tok.startswith("-"):
            flags.append(Flag(_key(tok), tok, True, "switch"))
        elif re.fullmatch(r"[A-Za-z_][\w.]*=\S*", tok):
            name, _, raw = tok.partition("=")
            flags.append(Flag(_key(name), name, _literal(raw), "equals"))
        else:
            flags.append(tok)
        i += 1
    return flags


def parse_command(command: list[str]) -> ParsedCommand:
    """Split a launch command into its launcher, script and the script's flags."""
    if not command:
        raise InfrarsiError("infrarsi init needs the launch command after '--', e.g. "
                            "infrarsi init -- python train.py --batch_size=12")
    prog = Path(command[0]).name
    rest = list(command[1:])
    if prog == "torchrun" or (re.fullmatch(r"python[\d.]*", prog) and rest[:2] == ["-m", "torch.distributed.run"]):
        rest = rest if prog == "torchrun" else rest[2:]
        launcher = ["{python}", "-m", "torch.distributed.run"]
        nproc = None
        while rest and not rest[0].endswith(".py"):
            tok = rest.pop(0)
            name, eq, raw = tok.partition("=")
            if _key(name) == "nproc_per_node":
                raw = raw if eq else rest.pop(0)
                nproc = int(raw) if raw.isdigit() else None
                launcher += ["--nproc-per-node", "{nproc}"]
            else:
                launcher.append(tok)
    elif re.fullmatch(r"python[\d.]*", prog):
        launcher, nproc = ["{python}"], None
    else:
        raise InfrarsiError(f"infrarsi init understands 'python script.py ...' and 'torchrun ... script.py ...', "
                            f"not {command[0]!r}; write the spec by hand (README: Tune your own job)")
    scripts = [t for t in rest if t.endswith(".py")]
    if not scripts:
        raise InfrarsiError(f"no .py script in {shlex.join(command)}; give the command that runs your training script")
    at = rest.index(scripts[0])
    return ParsedCommand(launcher=launcher + rest[:at], script=scripts[0], args=_parse_args(rest[at + 1:]),
                         nproc=nproc)


def help_flags(command: ParsedCommand, cwd: Path, timeout_s: float = 120) -> list[Flag]:
    """Flags an argparse-style ``--help`` lists, with their defaults where it shows them
    (None where it shows none, or shows ``(default: None)``)."""
    try:
        out = subprocess.run([sys.executable, command.script, "--help"], cwd=cwd, capture_output=True, text=True,
                             timeout=timeout_s, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return []
    if out.returncode != 0:
        return []
    found = []
    for m in re.finditer(r"^\s{1,8}(?:-\w, )?(--[\w-]+)(?:[ =]([A-Z_{}\[\],\w-]+))?(.*(?:\n\s{12,}.*)*)",
                         out.stdout, re.M):
        spelled, metavar, text = m.group(1), m.group(2), m.group(3)
        default = re.search(r"\(default:\s*([^)]*)\)|defaults? to `?([^`\s.,)]+)", text)
        raw = (default.group(1) or default.group(2)).strip() if default else None
        value = None if raw in (None, "None") else _literal(raw)  # argparse prints a missing default as None
        style = "switch" if metavar is None else "separate"
        choices = [_literal(c) for c in metavar[1:-1].split(",")] if metavar and metavar.startswith("{") else None
        if spelled != "--help":
            found.append(Flag(_key(spelled), spelled, value, style, choices))
    return found
