"""``infrarsi init``'s dry run: the user's command run once, short, exactly as typed but for
its step count, recording what it printed and which files under its folder it read.

Files are seen through a Python audit hook (``sys.addaudithook``, event ``open``) that a
``sitecustomize`` module on ``PYTHONPATH`` installs in every Python process of the run
(torchrun's workers included); each process writes the files it opened to its own list
when it exits. What a job reads this way is its code (imported modules), its config files
and its data; files it wrote are not counted. A ``sitecustomize`` the environment already
had still runs after the hook is installed.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

_HOOK = '''\
import atexit, os, sys

_read, _written = set(), set()


def _infrarsi_open(event, args):
    if event != "open" or not args or not isinstance(args[0], (str, os.PathLike)):
        return
    path, mode = os.path.abspath(os.fspath(args[0])), str(args[1] or "r")
    (_written if any(c in mode for c in "wax+") else _read).add(path)


sys.addaudithook(_infrarsi_open)


@atexit.register
def _infrarsi_write():
    folder = os.environ.get("INFRARSI_DRY_RUN_FILES")
    if folder:
        with open(os.path.join(folder, f"{os.getpid()}.txt"), "w") as fh:
            fh.write("\\n".join(sorted(p for p in _read - _written)))


def _infrarsi_chain():
    """Run the sitecustomize this one shadows, if the environment has one."""
    import importlib.machinery, importlib.util
    here = os.path.dirname(os.path.abspath(__file__))
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", [p for p in sys.path if os.path.abspath(p or ".") != here])
    if spec is not None and spec.loader is not None:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)


_infrarsi_chain()
'''


@dataclass(frozen=True, kw_only=True)
class DryRun:
    output: str  # stdout's lines, then stderr's
    exit_code: int | None  # None: it ran out of time (then the output is what it printed so far)
    files_read: tuple[str, ...] = field(default=())  # under the working folder, relative, sorted


def dry_run(argv: list[str], cwd: Path, env: dict[str, str], timeout_s: float) -> DryRun:
    """Run ``argv`` in ``cwd`` with ``env`` (the whole environment) and the file hook."""
    cwd = Path(cwd).resolve()
    with tempfile.TemporaryDirectory(prefix="infrarsi-dry-run-") as tmp:
        hook, files = Path(tmp) / "hook", Path(tmp) / "files"
        hook.mkdir()
        files.mkdir()
        (hook / "sitecustomize.py").write_text(_HOOK)
        path = os.pathsep.join(p for p in (str(hook), env.get("PYTHONPATH", "")) if p)
        run_env = {**env, "PYTHONPATH": path, "PYTHONUNBUFFERED": "1", "INFRARSI_DRY_RUN_FILES": str(files)}
        try:
            done = subprocess.run(argv, cwd=cwd, env=run_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True, timeout=timeout_s, stdin=subprocess.DEVNULL)
            output, code = _both(done.stdout, done.stderr), done.returncode
        except subprocess.TimeoutExpired as exc:
            output, code = _both(exc.stdout, exc.stderr), None
        except OSError as exc:
            return DryRun(output=f"{argv[0]}: {exc}", exit_code=127)
        read = set()
        for listing in files.glob("*.txt"):
            read.update(line for line in listing.read_text().splitlines() if line)
    return DryRun(output=output, exit_code=code, files_read=tuple(sorted(_under(cwd, read))))


def _both(stdout: str | bytes | None, stderr: str | bytes | None) -> str:
    """stdout, then stderr, as lines: read apart, as the harness reads them, so a progress bar
    on one stream never runs into a log line of the other; a carriage return (a bar
    redrawing itself) ends a line too."""
    def text(raw: str | bytes | None) -> str:
        return (raw.decode(errors="replace") if isinstance(raw, bytes) else raw or "").replace("\r", "\n")
    return text(stdout) + "\n" + text(stderr)


def _under(root: Path, paths: set[str]) -> list[str]:
    """The files of ``paths`` inside ``root`` that still exist, relative to it: no compiled
    bytecode, no installed packages, nothing hidden (a virtual environment or tool cache
    inside the folder)."""
    out = []
    for p in paths:
        try:
            rel = Path(p).resolve().relative_to(root)
        except ValueError:
            continue
        if {"__pycache__", "site-packages", "dist-packages"} & set(rel.parts) or any(
                part.startswith(".") for part in rel.parts):
            continue
        if (root / rel).is_file():
            out.append(rel.as_posix())
    return out
