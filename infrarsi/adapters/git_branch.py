"""Git: snapshot a plain directory into a repository, stage a change as a branch, read diffs.

This is the only module in infrarsi that talks to git. ``stage_branch`` works in a
temporary worktree on a detached HEAD and moves the branch ref only once the commit exists,
so the user's checkout (branch, index, working tree, untracked files) is never touched and a
failed patch leaves no half-made branch behind.
"""

from __future__ import annotations

import re
import shutil
import tempfile
from pathlib import Path, PurePosixPath
from typing import Mapping, Sequence

import git

from infrarsi.errors import InfrarsiError, PatchError

__all__ = ["BranchError", "changed_paths", "check_patches_apply", "clone", "ensure_repository", "patch_worktree",
           "repository_root", "snapshot", "stage_branch"]

AUTHOR_NAME = "infrarsi"
AUTHOR_EMAIL = "infrarsi@localhost"
_IDENTITY = {
    "GIT_AUTHOR_NAME": AUTHOR_NAME, "GIT_AUTHOR_EMAIL": AUTHOR_EMAIL,
    "GIT_COMMITTER_NAME": AUTHOR_NAME, "GIT_COMMITTER_EMAIL": AUTHOR_EMAIL,
}


class BranchError(InfrarsiError):
    """A branch cannot be staged: it exists, its name is invalid, or the base is unknown."""


def repository_root(path: Path) -> Path | None:
    """Top level of the git work tree holding ``path``, or None outside git."""
    try:
        repo = git.Repo(Path(path).resolve(), search_parent_directories=True)
    except (git.InvalidGitRepositoryError, git.NoSuchPathError):
        return None
    return None if repo.bare or repo.working_tree_dir is None else Path(repo.working_tree_dir)


def clone(url: str, dest: Path, *, ref: str | None = None) -> Path:
    """A shallow clone of ``url`` (at branch or tag ``ref``) at ``dest``."""
    args = ["--depth", "1"] + (["--branch", ref] if ref else [])
    try:
        git.Repo.clone_from(url, Path(dest), multi_options=args)
    except git.GitCommandError as exc:
        raise InfrarsiError(f"cannot clone {url}{'@' + ref if ref else ''}: {_git_message(exc)}; check the URL "
                            "and that this machine can reach it") from None
    return Path(dest)


def ensure_repository(source_dir: Path, dest_dir: Path) -> Path:
    """Return the top level of the git work tree holding ``source_dir``.

    A directory outside git is copied to ``dest_dir`` and committed there as a snapshot
    (``.gitignore`` rules apply), so patches and branches have a base commit. An existing
    snapshot of the same source at ``dest_dir`` (a resumed campaign) is reused.
    """
    return repository_root(source_dir) or snapshot(source_dir, dest_dir)


def snapshot(source_dir: Path, dest_dir: Path) -> Path:
    """Copy ``source_dir`` to ``dest_dir`` and commit it there as a new repository, even
    when the source already lives in git (the built-in workload inside this project)."""
    source_dir = Path(source_dir).resolve()
    dest_dir = Path(dest_dir).resolve()
    message = f"infrarsi: snapshot of {source_dir}"
    if (dest_dir / ".git").exists():
        if git.Repo(dest_dir).head.commit.message.strip() == message:
            return dest_dir
        raise InfrarsiError(f"{dest_dir} is a git repository but not a snapshot of "
                            f"{source_dir}; remove it or choose another destination")
    if dest_dir.is_relative_to(source_dir):
        raise InfrarsiError(f"snapshot destination {dest_dir} lies inside the source "
                            f"{source_dir}; choose a destination outside it")
    if dest_dir.exists() and any(dest_dir.iterdir()):
        raise InfrarsiError(f"snapshot destination {dest_dir} is not empty; remove it or "
                            "choose another destination")

    shutil.copytree(source_dir, dest_dir, symlinks=True, dirs_exist_ok=True,
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc", ".git"))
    repo = git.Repo.init(dest_dir, initial_branch="main")
    with repo.config_writer() as config:  # works on a machine without any git config
        config.set_value("user", "name", AUTHOR_NAME)
        config.set_value("user", "email", AUTHOR_EMAIL)
        config.set_value("commit", "gpgsign", "false")
    repo.git.add("--all")
    repo.git.commit("--allow-empty", "--no-verify", "-m", message)
    return dest_dir


def stage_branch(
    repo_path: Path,
    branch: str,
    *,
    base: str = "HEAD",
    files: Mapping[str, str] | None = None,
    patches: Sequence[str] | Mapping[str, str] = (),
    message: str,
    replace: bool = False,
    directory: str = "",
) -> str:
    """Commit ``patches`` (unified diffs, applied in order) and ``files`` (repo-relative
    path -> new content) on top of ``base`` as ``branch``; return the commit sha.

    ``patches`` may map a name to each diff, for the error message; ``directory`` is the
    folder (relative to the repository root) their paths are relative to. An existing branch
    is an error unless ``replace=True``. Raises PatchError when a patch does not apply.
    """
    repo = git.Repo(repo_path)
    _check_branch_name(repo, branch)
    exists = _rev(repo, f"refs/heads/{branch}") is not None
    if exists and not replace:
        raise BranchError(f"branch {branch!r} already exists in {repo.working_tree_dir}; "
                          "pass replace=True to overwrite it or choose another name")
    base_sha = _rev(repo, f"{base}^{{commit}}")
    if base_sha is None:
        raise BranchError(f"base {base!r} is not a commit in {repo.working_tree_dir}")
    named = dict(patches) if isinstance(patches, Mapping) else {
        f"patch #{i + 1}": diff for i, diff in enumerate(patches)}

    scratch = Path(tempfile.mkdtemp(prefix="infrarsi-worktree-"))
    worktree = scratch / "tree"
    try:
        repo.git.worktree("add", "--detach", str(worktree), base_sha)
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)
        raise
    try:
        wt = git.Repo(worktree)
        for name, diff in named.items():
            _apply_patch(wt, name, diff, scratch / "patch.diff", directory)
        for rel_path, content in (files or {}).items():
            target = worktree / _safe_relative(rel_path)
            target.parent.mkdir(parents=True, exist_ok=True)
            with target.open("w", newline="") as f:
                f.write(content)
        wt.git.add("--all")
        with wt.git.custom_environment(**_IDENTITY):
            wt.git.commit("--allow-empty", "--no-verify", "--no-gpg-sign", "-m", message)
        sha = wt.head.commit.hexsha
    finally:
        repo.git.worktree("remove", "--force", str(worktree))
        shutil.rmtree(scratch, ignore_errors=True)
    try:
        # Without -f this refuses to overwrite; with -f git still refuses a branch that is
        # checked out somewhere, which protects the user's checkout.
        repo.git.branch(*(["-f"] if exists else []), branch, sha)
    except git.GitCommandError as exc:
        raise BranchError(f"cannot point branch {branch!r} at {sha[:12]}: "
                          f"{_git_message(exc)}") from exc
    return sha


def changed_paths(diff: str) -> list[tuple[str | None, str | None]]:
    """The (old path, new path) of every file a unified diff touches, in order.

    A new file has old path None, a deleted file new path None; a rename or copy has
    both. Understands ``git diff`` output (renames, modes, binary, quoted names) and plain
    ``diff -u`` output, whose first path component is stripped like ``git apply -p1``.
    """
    pairs: list[tuple[str | None, str | None]] = []
    old: str | None = None
    new: str | None = None
    in_file = plus_seen = False
    old_left = new_left = 0  # hunk lines still to read: their text is content, not headers

    for line in diff.splitlines():
        if old_left > 0 or new_left > 0:
            if not line.startswith("\\"):  # "\ No newline at end of file" counts for none
                old_left -= line[:1] in (" ", "-", "")
                new_left -= line[:1] in (" ", "+", "")
            continue
        if line.startswith("diff --git "):
            if in_file:
                pairs.append((old, new))
            old, new = _split_git_header(line[len("diff --git "):])
            in_file, plus_seen = True, False
        elif line.startswith("--- "):
            if in_file and plus_seen:  # plain diff -u: the next file starts here
                pairs.append((old, new))
            if not in_file or plus_seen:
                new, in_file, plus_seen = None, True, False
            old = _diff_path(line[4:])
        elif not in_file:
            continue
        elif line.startswith("+++ "):
            new, plus_seen = _diff_path(line[4:]), True
        elif line.startswith(("rename from ", "copy from ")):
            old = _unquote(line.split(" from ", 1)[1])
        elif line.startswith(("rename to ", "copy to ")):
            new = _unquote(line.split(" to ", 1)[1])
        elif line.startswith("new file mode"):
            old = None
        elif line.startswith("deleted file mode"):
            new = None
        elif (match := _HUNK.match(line)) is not None:
            old_left = int(match["old_len"] or 1)
            new_left = int(match["new_len"] or 1)
    if in_file:
        pairs.append((old, new))
    return pairs


_HUNK = re.compile(r"^@@ -\d+(?:,(?P<old_len>\d+))? \+\d+(?:,(?P<new_len>\d+))? @@")
_ESCAPES = {"n": "\n", "t": "\t", '"': '"', "\\": "\\", "a": "\a", "b": "\b", "f": "\f",
            "r": "\r", "v": "\v"}


def _apply_patch(wt: git.Repo, name: str, diff: str, patch_file: Path, directory: str = "") -> None:
    patch_file.write_text(diff if diff.endswith("\n") else diff + "\n")
    where = [f"--directory={directory}"] if directory not in ("", ".") else []
    try:
        wt.git.apply("--check", *where, str(patch_file))
    except git.GitCommandError as exc:
        raise PatchError(f"{name} does not apply to the base commit: {_git_message(exc)}; "
                         "regenerate it against this commit") from exc
    wt.git.apply("--index", *where, str(patch_file))


def check_patches_apply(repo_path: Path, patches: Mapping[str, str], *, directory: str = "",
                        base: str = "HEAD") -> list[tuple[str, str]]:
    """Raise PatchError unless every patch applies to ``base`` on its own; return the pairs
    that do not apply together (in order). Works in a throwaway worktree: ``repo_path``'s
    checkout is not touched."""
    if not patches:
        return []
    repo = git.Repo(repo_path)
    scratch = Path(tempfile.mkdtemp(prefix="infrarsi-check-"))
    where = [f"--directory={directory}"] if directory not in ("", ".") else []
    files = {}
    for i, (name, diff) in enumerate(patches.items()):
        files[name] = scratch / f"{i}.diff"
        files[name].write_text(diff if diff.endswith("\n") else diff + "\n")
    try:
        repo.git.worktree("add", "--detach", str(scratch / "tree"), base)
        wt = git.Repo(scratch / "tree")
        for name, diff in patches.items():
            _apply_patch(wt, name, diff, scratch / "patch.diff", directory)
            wt.git.reset("--hard", "-q")
        conflicts = []
        names = list(patches)
        for i, a in enumerate(names):
            for b in names[i + 1:]:
                # One `git apply --check a b` checks each against the base; apply a for real.
                wt.git.apply(*where, str(files[a]))
                try:
                    wt.git.apply("--check", *where, str(files[b]))
                except git.GitCommandError:
                    conflicts.append((a, b))
                wt.git.reset("--hard", "-q")
                wt.git.clean("-fdq")
        return conflicts
    finally:
        if (scratch / "tree").exists():
            repo.git.worktree("remove", "--force", str(scratch / "tree"))
        shutil.rmtree(scratch, ignore_errors=True)


def patch_worktree(repo_path: Path, dest: Path, patches: Mapping[str, str], *, directory: str = "",
                   base: str = "HEAD") -> Path:
    """A worktree of ``base`` at ``dest`` with ``patches`` applied and committed on a detached
    HEAD; created once, then reused. It is never silently repaired: trials of the same patch
    set may run in it at once, and a trial that edits a locked file must leave the evidence
    for the launcher's check. The checkout at ``repo_path`` and its branches are never touched."""
    dest = Path(dest).resolve()
    ready = dest.with_name(dest.name + ".ready")
    if not ready.exists():
        repo = git.Repo(repo_path)
        if dest.exists():  # a half-made worktree from an interrupted campaign
            repo.git.worktree("remove", "--force", str(dest))
        dest.parent.mkdir(parents=True, exist_ok=True)
        repo.git.worktree("add", "--detach", str(dest), base)
        wt = git.Repo(dest)
        for name, diff in patches.items():
            _apply_patch(wt, name, diff, dest.parent / f"{dest.name}.diff", directory)
        with wt.git.custom_environment(**_IDENTITY):
            wt.git.commit("--allow-empty", "--no-verify", "--no-gpg-sign", "-q",
                          "-m", "infrarsi: patches " + ", ".join(patches))
        ready.write_text("\n".join(patches) + "\n")
    return dest


def _check_branch_name(repo: git.Repo, branch: str) -> None:
    try:
        repo.git.check_ref_format("--branch", branch)
    except git.GitCommandError as exc:
        raise BranchError(f"{branch!r} is not a valid branch name: {_git_message(exc)}") from exc


def _rev(repo: git.Repo, rev: str) -> str | None:
    try:
        return repo.git.rev_parse("--verify", "--quiet", rev)
    except git.GitCommandError:
        return None


def _safe_relative(rel_path: str) -> PurePosixPath:
    path = PurePosixPath(rel_path)
    if path.is_absolute() or ".." in path.parts or not path.parts or path.parts[0] == ".git":
        raise BranchError(f"file path {rel_path!r}: expected a path inside the repository, "
                          "relative, without '..' and outside .git")
    return path


def _git_message(exc: git.GitCommandError) -> str:
    text = exc.stderr if isinstance(exc.stderr, str) else str(exc)
    text = text.strip().removeprefix("stderr:").strip().strip("'").strip()
    return " ".join(text.split())


def _diff_path(raw: str) -> str | None:
    # "--- a/x.py\t2024-01-01 ..." (diff -u) carries a timestamp after a tab.
    path = _unquote(raw.split("\t", 1)[0].rstrip())
    if path == "/dev/null":
        return None
    parts = path.split("/", 1)  # strip one leading component, as git apply -p1 does
    return parts[1] if len(parts) == 2 else path


def _split_git_header(rest: str) -> tuple[str, str]:
    """Paths from "a/x b/x"; later rename / ---/+++ lines override this guess."""
    if rest.startswith('"'):
        old, tail = _take_quoted(rest)
        new = _unquote(tail.strip())
    else:
        # Unquoted names may hold spaces; the header names the same path twice unless
        # the file is renamed, and renames say their paths again on their own lines.
        half = (len(rest) - 1) // 2
        if rest[:half][2:] == rest[half + 1:][2:] and rest[half] == " ":
            old, new = rest[:half], rest[half + 1:]
        else:
            old, _, new = rest.partition(" ")
            if new.startswith('"'):
                new = _unquote(new)
    return old.split("/", 1)[-1], new.split("/", 1)[-1]


def _take_quoted(text: str) -> tuple[str, str]:
    i = 1
    while i < len(text) and text[i] != '"':
        i += 2 if text[i] == "\\" else 1
    return _unquote(text[: i + 1]), text[i + 1:]


def _unquote(text: str) -> str:
    """Undo git's C-style quoting of paths with unusual characters (octal is UTF-8)."""
    if not (len(text) >= 2 and text.startswith('"') and text.endswith('"')):
        return text
    out = bytearray()
    body, i = text[1:-1], 0
    while i < len(body):
        ch = body[i]
        if ch == "\\" and i + 1 < len(body):
            nxt = body[i + 1]
            if nxt in "01234567":
                out.append(int(body[i + 1:i + 4], 8))
                i += 4
                continue
            out += _ESCAPES.get(nxt, nxt).encode()
            i += 2
            continue
        out += ch.encode()
        i += 1
    return out.decode("utf-8", errors="surrogateescape")
