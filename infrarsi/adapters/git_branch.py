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

from infrarsi.core.errors import InfrarsiError, PatchError

__all__ = ["BranchError", "changed_paths", "check_patches_apply", "clone", "patch_worktree",
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
    """The (old path, new path) of every file a unified diff touches, in order, as
    ``git apply`` reads it: git itself parses the diff, so these are the paths applying it
    writes.

    A new file has old path None, a deleted file new path None; a rename or copy has
    both. Understands ``git diff`` output (renames, copies, modes, binary, quoted names) and
    plain ``diff -u`` output, whose first path component is stripped (``git apply -p1``).
    Raises PatchError when git cannot read the diff.
    """
    scratch = Path(tempfile.mkdtemp(prefix="infrarsi-diff-")).resolve()
    try:
        patch_file = scratch / "patch.diff"
        _write_patch(patch_file, diff)
        # Run outside any repository (the ceiling stops git's search): inside one, git apply
        # would leave out every file outside the folder it runs in.
        outside = git.Git(scratch)
        outside.update_environment(GIT_CEILING_DIRECTORIES=str(scratch.parent))
        new_names, summary = _numstat(outside, patch_file, "--summary")
        old_names, _ = _numstat(outside, patch_file, "-R")  # a reversed patch names each old path
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    pairs: list[tuple[str | None, str | None]] = []
    pos = 0
    for old, new in zip(reversed(old_names), new_names, strict=True):  # -R lists files last to first
        if old == new:
            # --summary says " create mode 100644 <path>" (or delete) for each new (or deleted)
            # file, in the diff's order.
            mark = re.compile(rf"^ (create|delete) (?:mode \d+ )?{re.escape(new)}$", re.M).search(summary, pos)
            if mark is not None:
                pos = mark.end()
                old, new = (None, new) if mark[1] == "create" else (old, None)
        pairs.append((old, new))
    return pairs


def _numstat(outside: git.Git, patch_file: Path, *flags: str) -> tuple[list[str], str]:
    """The path ``git apply --numstat -z`` names for each file of the patch (the new one, or
    the old one of a deleted file), unquoted, and the output after that list (``--summary``'s)."""
    try:
        out = outside.apply("--numstat", "-z", "--allow-empty", *flags, str(patch_file),
                            stdout_as_string=False, strip_newline_in_stdout=False)
    except git.GitCommandError as exc:
        raise PatchError(f"git cannot read the diff: {_git_message(exc)}; regenerate it (git diff)") from None
    *records, rest = out.decode("utf-8", errors="surrogateescape").split("\0")
    return [record.split("\t", 2)[2] for record in records], rest  # "added<TAB>deleted<TAB>path"


def _write_patch(patch_file: Path, diff: str) -> None:
    """The file git reads a diff from: the same bytes for reading its paths and applying it."""
    patch_file.write_text(diff if diff.endswith("\n") else diff + "\n")


def _apply_patch(wt: git.Repo, name: str, diff: str, patch_file: Path, directory: str = "") -> None:
    _write_patch(patch_file, diff)
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
        _write_patch(files[name], diff)
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

