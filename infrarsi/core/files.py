"""The workload's files: the one glob rule for locked and editable paths, and their hashes.

The spec checks its globs with it, the contract lists and hashes the locked files with it,
and the patch scope gate judges a diff's paths with it, so the three never disagree.
"""

from __future__ import annotations

import hashlib
import itertools
import os
from functools import lru_cache
from pathlib import Path, PurePosixPath
from typing import Iterable

import pathspec


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def glob_matches(path: str, patterns: Iterable[str]) -> bool:
    """Whether the workload-relative file ``path`` matches one of the contract's globs: the
    one rule for locked and editable files, used both to list them at init and by the
    patch scope gate.

    Git's wildmatch (pathspec's gitignore patterns), anchored at the workload folder: ``*``
    matches within one path segment, ``?`` one character, ``[...]`` one of a set, ``**`` any
    number of whole segments (``**/x``, ``a/**/x``, ``a/**``) and ``\\`` escapes the next
    character. Unlike a .gitignore line, a pattern names files: it matches the path itself,
    never by its last segment alone (``model.py`` is the top-level file) and never a file
    under a folder it names (``src`` is not ``src/x.py``); one ending in ``/`` matches no file.

    Dot-files are ordinary names, as in git: ``*.py`` matches ``.config.py`` and ``**``
    enters ``.github/``. Python's glob skipped them, which left them out of the locked
    files hashed at init while the scope gate counted them. Nothing under a ``.git``
    folder ever matches.
    """
    if ".git" in PurePosixPath(path).parts:
        return False
    return _file_spec(tuple(patterns)).match_file(f"{path}/{_END}")


# A last segment added to each path and pattern, so that gitignore's "a folder matches
# everything under it" can only reach this segment; no path holds a NUL.
_END = "\0"
_WILDCARDS = frozenset("*?[\\")


@lru_cache(maxsize=64)
def _file_spec(patterns: tuple[str, ...]) -> pathspec.PathSpec:
    lines = []
    for pattern in patterns:
        anchored = "/" + "/".join(s for s in pattern.split("/") if s != ".")  # "./x" is "x"
        if anchored.endswith("/"):  # a folder, not a file
            continue
        if anchored.endswith("/**"):  # the files under the folder, not the folder
            anchored += "/*"
        lines.append(f"{anchored}/{_END}")
    return pathspec.GitIgnoreSpec.from_lines(lines)


def matching_files(root: Path, patterns: list[str]) -> list[str]:
    """Workload-relative paths of the files under ``root`` that ``glob_matches`` any of
    ``patterns``, sorted. A symlink to a file counts; wildcards do not enter ``.git`` or
    folders behind symlinks."""
    root = Path(root)
    candidates: set[str] = set()
    for pattern in patterns:
        segments = [s for s in pattern.split("/") if s != "."]
        fixed = list(itertools.takewhile(lambda s: s and not _WILDCARDS.intersection(s), segments))
        if len(fixed) == len(segments):  # no wildcard: the one file it names, if it exists
            candidates.add("/".join(fixed))
            continue
        for folder, dirs, files in os.walk(root.joinpath(*fixed)):  # every match lies under it
            dirs[:] = [d for d in dirs if d != ".git"]
            rel = Path(folder).relative_to(root)
            candidates.update((rel / name).as_posix() for name in files)
    return sorted(p for p in candidates if glob_matches(p, patterns) and (root / p).is_file())


def hash_files(root: Path, rel_paths: list[str]) -> dict[str, str]:
    return {rel: sha256_file(root / rel) for rel in rel_paths}
