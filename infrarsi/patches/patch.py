"""Code patches: a unified diff plus what it claims, gated before it becomes a knob.

A patch lives in a folder: ``patch.diff`` (paths relative to the workload folder, e.g.
``model.py``) and ``meta.toml`` (title, description, files_touched,
expected_time_effect and expected_memory_effect as multipliers, preconditions; and for
the built-in library's matching, optional: ``phases``, the doctor phases it shortens or
``"memory"`` for a memory saver; ``requires_text``, snippets the files it touches must
contain; ``pays_with``, knob settings under which it has an effect; ``numerics``). Every
patch a spec lists passes ``check_scope`` (it touches only the editable scope and
leaves locked files alone) and must apply to the snapshot (checked at init); a patch
proposed during the run passes the same gate (``infrarsi.patches.sources``). It then
becomes the boolean knob ``patch_<name>``, baseline False. Whether it keeps the loss
trajectory is checked on every trial that enables it, like any other knob.
"""

from __future__ import annotations

import difflib
import re
import tomllib
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path, PurePosixPath
from typing import Any, Iterable, Mapping

from infrarsi.core.errors import PatchError
from infrarsi.core.files import glob_matches  # the rule that listed the locked files at init
from infrarsi.core.knobs import patch_knob_name
from infrarsi.core.serial import Record

__all__ = ["BUILTIN_DIR", "Patch", "builtin_patches", "check_scope", "enabled_patches",
           "load_patches", "make_diff", "require_in_scope"]


def _builtin_dir() -> Path:
    # Found through the import system, not as a folder beside infrarsi/: an installed
    # package may sit anywhere on sys.path. From a wheel or an editable install,
    # files() is a real directory.
    try:
        return Path(resources.files("infra_patches"))
    except ModuleNotFoundError:
        raise ModuleNotFoundError("the built-in patch library (package infra_patches) is not installed; "
                                  "reinstall infrarsi (in a checkout: pip install -e .)",
                                  name="infra_patches") from None


BUILTIN_DIR = _builtin_dir()
_TUPLES = ("files_touched", "phases", "requires_text")
META_KEYS = {"title", "description", "files_touched", "expected_time_effect", "expected_memory_effect",
             "preconditions", "phases", "requires_text", "pays_with", "numerics"}
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]*$")
# Header lines (never hunk content, which starts with ' ', '+', '-' or '\') that give a
# file the symlink mode.
_SYMLINK = re.compile(r"^(new file mode|new mode|old mode|deleted file mode|index \S+) 0*120000\b")
# Headers naming an absolute path (changed_paths strips one component, as git apply -p1
# does, which would turn "/etc/x" into "etc/x" and hide the intent).
_ABSOLUTE = re.compile(r"^(--- |\+\+\+ |diff --git a/|rename from |rename to |copy from |copy to )/(?!dev/null\b)")


@dataclass(frozen=True, kw_only=True)
class Patch(Record):
    name: str
    diff: str
    title: str
    description: str = ""
    files_touched: tuple[str, ...] = ()
    expected_time_effect: float = 1.0  # multiplier on step time: 0.9 = 10% faster
    expected_memory_effect: float = 1.0  # multiplier on peak memory
    preconditions: str = ""
    source: str = ""
    phases: tuple[str, ...] = ()  # doctor phases it shortens ("forward_s", ...) or "memory"
    requires_text: tuple[str, ...] = ()  # snippets the touched files must contain
    pays_with: Mapping[str, Any] = field(default_factory=dict)  # knob settings it needs to matter
    numerics: str = "bit-identical"  # or e.g. "fp32 rounding": what the loss check may see

    def __post_init__(self) -> None:
        if not _NAME.match(self.name):
            raise PatchError(f"patch name {self.name!r}: expected letters, digits, '_' or '-'; rename its folder")
        if not self.diff.strip():
            raise PatchError(f"patch {self.name!r}: patch.diff is empty; regenerate it (git diff)")
        for effect in ("expected_time_effect", "expected_memory_effect"):
            if not getattr(self, effect) > 0:
                raise PatchError(f"patch {self.name!r}: {effect} must be a positive multiplier, "
                                 f"got {getattr(self, effect)}")

    @property
    def knob(self) -> str:
        return patch_knob_name(self.name)


def load_patch(folder: Path) -> Patch:
    diff_path, meta_path = folder / "patch.diff", folder / "meta.toml"
    if not diff_path.is_file() or not meta_path.is_file():
        raise PatchError(f"{folder}: a patch folder needs patch.diff and meta.toml; add the missing file")
    try:
        meta = tomllib.loads(meta_path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise PatchError(f"{meta_path}: not valid TOML ({exc}); fix the syntax") from None
    if set(meta) - META_KEYS or "title" not in meta:
        raise PatchError(f"{meta_path}: expected keys {sorted(META_KEYS)} (title required), "
                         f"found {sorted(meta)}")
    return Patch(name=folder.name, diff=diff_path.read_text(), source=str(folder),
                 **{**meta, **{k: tuple(meta.get(k, ())) for k in _TUPLES}})


def load_patches(names_or_paths: Iterable[str], base_dir: Path) -> list[Patch]:
    """Patches by built-in name (a folder of ``infra_patches/``) or by folder path
    relative to ``base_dir`` (the spec file's folder)."""
    out = []
    for ref in names_or_paths:
        local = Path(base_dir) / ref
        folder = local if local.is_dir() else BUILTIN_DIR / ref
        if not folder.is_dir():
            builtin = sorted(p.name for p in BUILTIN_DIR.iterdir() if (p / "meta.toml").is_file())
            raise PatchError(f"patch {ref!r}: no folder {local} and no built-in patch of that name; "
                             f"built-in patches are {builtin}")
        out.append(load_patch(folder))
    knobs = [p.knob for p in out]
    if len(set(knobs)) != len(knobs):
        raise PatchError(f"patches {list(names_or_paths)} give duplicate knobs {knobs}; rename a folder")
    return out


def builtin_patches() -> list[Patch]:
    """Every patch of the built-in library (the package ``infra_patches``), by folder name."""
    return [load_patch(f) for f in sorted(BUILTIN_DIR.iterdir()) if (f / "meta.toml").is_file()]


def _path_problem(path: str) -> str | None:
    pure = PurePosixPath(path)
    if path.startswith("/") or pure.is_absolute():
        return f"{path!r} is an absolute path"
    if ".." in pure.parts:
        return f"{path!r} has a '..' component"
    if pure.parts and pure.parts[0] == ".git":
        return f"{path!r} is inside .git"
    return None


def check_scope(patch: Patch, contract: Any) -> list[str]:
    """Every way ``patch`` escapes the contract's editable scope; empty when it stays inside."""
    from infrarsi.adapters.git_branch import changed_paths

    c = contract.spec.contract
    locked = lambda p: p in contract.locked_hashes or glob_matches(p, c.locked)  # noqa: E731
    editable = lambda p: glob_matches(p, c.editable) and not locked(p)  # noqa: E731
    try:
        pairs = changed_paths(patch.diff)
    except PatchError as exc:
        return [str(exc)]
    problems = [f"{p!r}: {why}" for old, new in pairs for p in (old, new) if p is not None
                if (why := _path_problem(p))]
    if problems:
        return problems
    if not pairs:
        problems.append("the diff names no file")
    if any(_ABSOLUTE.match(line) for line in patch.diff.splitlines()):
        problems.append("the diff names an absolute path")
    if any(_SYMLINK.match(line) for line in patch.diff.splitlines()):
        problems.append("the diff creates or changes a symlink (mode 120000)")
    for old, new in pairs:
        if new is None:
            problems.append(f"deletes locked file {old!r}" if locked(old) else
                            None if editable(old) else f"deletes {old!r}, outside the editable scope")
        elif old is None:
            problems.append(None if editable(new) else f"adds new file {new!r} outside the editable scope")
        elif old != new:
            if locked(old) or locked(new):
                problems.append(f"renames or copies {old!r} -> {new!r}, touching a locked path")
            elif not editable(new):
                problems.append(f"renames or copies into {new!r}, outside the editable scope")
        elif locked(new):
            problems.append(f"modifies locked file {new!r}")
        elif not editable(new):
            problems.append(f"modifies {new!r}, outside the editable scope")
    return [p for p in problems if p]


def require_in_scope(patch: Patch, contract: Any) -> None:
    problems = check_scope(patch, contract)
    if problems:
        c = contract.spec.contract
        raise PatchError(f"patch {patch.name!r} ({patch.source}) escapes the contract's scope: "
                         + "; ".join(problems) + f". A patch may touch only {c.editable} and never "
                         f"{c.locked}; fix the diff or remove it from the spec's `patches`")


def enabled_patches(config: Mapping[str, Any], patches: Iterable[Patch]) -> list[Patch]:
    """The patches a config switches on, in the spec's order."""
    return [p for p in patches if config.get(p.knob) is True]


def contract_patches(contract: Any) -> list[Patch]:
    """The patches frozen into the contract at init."""
    return [Patch.from_json(d) for d in contract.extra.get("patches", ())]


def make_diff(rel_path: str, old_text: str, new_text: str) -> str:
    """A ``git apply``-able unified diff of one file, from its old and new text."""
    lines = difflib.unified_diff(old_text.splitlines(keepends=True), new_text.splitlines(keepends=True),
                                 f"a/{rel_path}", f"b/{rel_path}")
    return f"diff --git a/{rel_path} b/{rel_path}\n" + "".join(lines)
