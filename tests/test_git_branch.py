"""Git adapter on real repositories in tmp_path: snapshots, staged branches, diff paths."""

from __future__ import annotations

from pathlib import Path

import git
import pytest

from infrarsi.adapters.git_branch import BranchError, changed_paths, repository_root, snapshot, stage_branch
from infrarsi.core.errors import PatchError

TRAIN_PY = "lr = 3e-4\nbatch = 8\nsteps = 100\n"
FUSED_PATCH = """\
diff --git a/train.py b/train.py
--- a/train.py
+++ b/train.py
@@ -1,3 +1,4 @@
 lr = 3e-4
 batch = 8
 steps = 100
+fused = True
"""
COMPILE_PATCH = """\
diff --git a/train.py b/train.py
--- a/train.py
+++ b/train.py
@@ -2,3 +2,4 @@
 batch = 8
 steps = 100
 fused = True
+compile = True
"""


@pytest.fixture(autouse=True)
def no_user_git_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Behave like a fresh machine: no global or system git identity."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", "/dev/null")
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    for var in ("GIT_AUTHOR_NAME", "GIT_AUTHOR_EMAIL", "GIT_COMMITTER_NAME",
                "GIT_COMMITTER_EMAIL", "EMAIL"):
        monkeypatch.delenv(var, raising=False)


def make_user_repo(path: Path) -> git.Repo:
    """A user's checkout on branch 'work' with a dirty file, a staged file and untracked."""
    path.mkdir()
    repo = git.Repo.init(path, initial_branch="main")
    with repo.config_writer() as config:
        config.set_value("user", "name", "User")
        config.set_value("user", "email", "user@example.com")
    (path / "train.py").write_text(TRAIN_PY)
    (path / "model.py").write_text("layers = 2\n")
    (path / "notes.md").write_text("notes\n")
    repo.git.add("--all")
    repo.git.commit("-m", "initial")
    repo.git.checkout("-b", "work")
    (path / "model.py").write_text("layers = 4  # uncommitted\n")
    (path / "notes.md").write_text("staged notes\n")
    repo.git.add("notes.md")
    (path / "scratch.txt").write_text("untracked\n")
    return repo


def checkout_state(repo: git.Repo) -> tuple:
    root = Path(repo.working_tree_dir)
    return (
        repo.active_branch.name,
        repo.head.commit.hexsha,
        repo.git.status("--porcelain", "--untracked-files=all"),
        repo.git.diff(),
        repo.git.diff("--cached"),
        {p.name: p.read_text() for p in root.iterdir() if p.is_file()},
        repo.git.worktree("list", "--porcelain").count("worktree "),
    )


def test_repository_root_is_the_top_level_of_a_work_tree(tmp_path: Path) -> None:
    repo = make_user_repo(tmp_path / "user")
    (tmp_path / "user" / "src").mkdir()
    assert repository_root(tmp_path / "user" / "src") == Path(repo.working_tree_dir)
    assert repository_root(tmp_path) is None


def test_a_plain_directory_is_snapshot_into_a_new_repository(tmp_path: Path) -> None:
    source = tmp_path / "job"
    (source / "pkg").mkdir(parents=True)
    (source / "train.py").write_text(TRAIN_PY)
    (source / "pkg" / "model.py").write_text("layers = 2\n")
    dest = tmp_path / "snap"

    assert repository_root(source) is None
    assert snapshot(source, dest) == dest
    snap = git.Repo(dest)
    assert snap.head.commit.message.strip() == f"infrarsi: snapshot of {source}"
    assert snap.head.commit.author.email == "infrarsi@localhost"
    assert sorted(snap.git.ls_files().splitlines()) == ["pkg/model.py", "train.py"]
    assert snap.git.status("--porcelain") == ""
    assert not (source / ".git").exists()
    # A resumed campaign reuses the snapshot; a foreign directory is refused.
    assert snapshot(source, dest) == dest
    assert len(list(snap.iter_commits())) == 1
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "x").write_text("x")
    with pytest.raises(Exception, match="not empty"):
        snapshot(source, tmp_path / "other")


def test_stage_branch_leaves_the_user_checkout_untouched(tmp_path: Path) -> None:
    repo = make_user_repo(tmp_path / "user")
    before = checkout_state(repo)
    base = repo.head.commit.hexsha

    sha = stage_branch(
        tmp_path / "user", "infrarsi/promoted", patches=[FUSED_PATCH, COMPILE_PATCH],
        files={"configs/launch.yaml": "micro_batch: 4\n"},
        message="infrarsi: promote micro_batch=4\n\nspeedup 1.42x [1.31, 1.55]",
    )

    assert checkout_state(repo) == before
    commit = repo.commit("infrarsi/promoted")
    assert commit.hexsha == sha
    assert [p.hexsha for p in commit.parents] == [base]
    assert commit.author.name == "infrarsi" and commit.author.email == "infrarsi@localhost"
    assert commit.message == "infrarsi: promote micro_batch=4\n\nspeedup 1.42x [1.31, 1.55]\n"
    assert repo.git.show(f"{sha}:train.py") == (TRAIN_PY + "fused = True\ncompile = True").rstrip()
    assert repo.git.show(f"{sha}:configs/launch.yaml") == "micro_batch: 4"
    assert repo.git.show(f"{sha}:model.py") == "layers = 2"  # the commit, not the dirty file
    assert sorted(repo.git.diff("--name-only", base, sha).splitlines()) == [
        "configs/launch.yaml", "train.py"]


def test_patch_that_does_not_apply_names_the_patch_and_leaves_no_branch(
    tmp_path: Path,
) -> None:
    repo = make_user_repo(tmp_path / "user")
    before = checkout_state(repo)
    with pytest.raises(PatchError, match=r"compile does not apply.*train\.py"):
        stage_branch(tmp_path / "user", "infrarsi/bad", message="m",
                     patches={"compile": COMPILE_PATCH})  # needs the fused patch first
    assert checkout_state(repo) == before
    assert "infrarsi/bad" not in [h.name for h in repo.heads]


def test_existing_branch_needs_replace(tmp_path: Path) -> None:
    repo = make_user_repo(tmp_path / "user")
    first = stage_branch(tmp_path / "user", "infrarsi/promoted", message="first",
                         files={"a.txt": "1\n"})
    with pytest.raises(BranchError, match="already exists.*replace=True"):
        stage_branch(tmp_path / "user", "infrarsi/promoted", message="second",
                     files={"a.txt": "2\n"})
    assert repo.commit("infrarsi/promoted").hexsha == first

    second = stage_branch(tmp_path / "user", "infrarsi/promoted", message="second",
                          files={"a.txt": "2\n"}, replace=True)
    assert repo.commit("infrarsi/promoted").hexsha == second != first
    # The branch the user has checked out is never moved under them.
    before = checkout_state(repo)
    with pytest.raises(BranchError, match="'work'"):
        stage_branch(tmp_path / "user", "work", message="x", files={"a.txt": "3\n"},
                     replace=True)
    assert checkout_state(repo) == before


def test_bad_arguments_are_refused(tmp_path: Path) -> None:
    make_user_repo(tmp_path / "user")
    with pytest.raises(BranchError, match="not a valid branch name"):
        stage_branch(tmp_path / "user", "bad..name", message="m")
    with pytest.raises(BranchError, match="not a commit"):
        stage_branch(tmp_path / "user", "ok", base="no-such-ref", message="m")
    with pytest.raises(BranchError, match="inside the repository"):
        stage_branch(tmp_path / "user", "ok", message="m", files={"../escape.py": ""})


def test_changed_paths_of_real_git_diff(tmp_path: Path) -> None:
    repo = make_user_repo(tmp_path / "user")
    root = tmp_path / "user"
    repo.git.stash("--include-untracked")
    (root / "big.py").write_text("".join(f"line {i}\n" for i in range(50)))
    (root / "gone.py").write_text("bye\n")
    (root / "run.sh").write_text("echo\n")
    repo.git.add("--all")
    repo.git.commit("-m", "more files")
    base = repo.head.commit.hexsha

    repo.git.mv("big.py", "renamed big.py")
    repo.git.rm("gone.py")
    (root / "new dir").mkdir()
    (root / "new dir" / "módulo.py").write_text("--- not a header\n+++ nor this\n")
    (root / "blob.bin").write_bytes(bytes(range(256)))
    (root / "run.sh").chmod(0o755)
    (root / "train.py").write_text(TRAIN_PY.replace("8", "16"))
    repo.git.add("--all")
    diff = repo.git.diff("--cached", "-M", "--binary", base) + "\n"

    assert sorted(changed_paths(diff), key=str) == sorted([
        (None, "blob.bin"),
        ("big.py", "renamed big.py"),
        ("gone.py", None),
        (None, "new dir/módulo.py"),
        ("run.sh", "run.sh"),
        ("train.py", "train.py"),
    ], key=str)
    # The parser and git agree on which diff applies where.
    repo.git.reset("--hard", base)
    (tmp_path / "d.patch").write_text(diff)
    repo.git.apply("--check", str(tmp_path / "d.patch"))


def test_changed_paths_of_plain_unified_diff() -> None:
    diff = (
        "diff -ruN old/a.py new/a.py\n"
        "--- old/a.py\t2024-05-01 10:00:00.000000000 +0000\n"
        "+++ new/a.py\t2024-05-01 10:01:00.000000000 +0000\n"
        "@@ -1,2 +1,2 @@\n"
        "--- x = 1\n"
        "+++ x = 2\n"
        " y = 1\n"
        "--- /dev/null\n"
        "+++ new/b.py\n"
        "@@ -0,0 +1 @@\n"
        "+print('b')\n"
    )
    assert changed_paths(diff) == [("a.py", "a.py"), (None, "b.py")]
    assert changed_paths("") == []


def test_changed_paths_of_copies_modes_and_names_git_quotes(tmp_path: Path) -> None:
    root = tmp_path / "repo"
    root.mkdir()
    repo = git.Repo.init(root, initial_branch="main")
    with repo.config_writer() as config:
        config.set_value("user", "name", "User")
        config.set_value("user", "email", "user@example.com")
    for name in ("data.py", "run.sh", 'say "hi".py', "tab\there.py"):
        (root / name).write_text(f"{name}\n" * 20)
    repo.git.add("--all")
    repo.git.commit("-m", "base")
    (root / "copy of data.py").write_text((root / "data.py").read_text())
    (root / "run.sh").chmod(0o755)
    (root / 'say "hi".py').write_text("changed\n")
    repo.git.mv("tab\there.py", "ñ dir.py")
    repo.git.add("--all")
    diff = repo.git.diff("--cached", "-C", "--find-copies-harder") + "\n"
    assert '"b/say \\"hi\\".py"' in diff and "copy to copy of data.py" in diff  # git quoted and copied

    assert changed_paths(diff) == [
        ("data.py", "copy of data.py"),
        ("run.sh", "run.sh"),
        ('say "hi".py', 'say "hi".py'),
        ("tab\there.py", "ñ dir.py"),
    ]


def test_changed_paths_of_hand_written_quoted_names_with_spaces() -> None:
    diff = ('diff --git "a/my model.py" "b/my model.py"\n'
            "new file mode 100644\n"
            "--- /dev/null\n"
            '+++ "b/my model.py"\n'
            "@@ -0,0 +1 @@\n"
            "+x = 1\n"
            'diff --git "a/old \\303\\251.py" "b/old \\303\\251.py"\n'
            "deleted file mode 100644\n"
            '--- "a/old \\303\\251.py"\n'
            "+++ /dev/null\n"
            "@@ -1 +0,0 @@\n"
            "-y = 2\n")
    assert changed_paths(diff) == [(None, "my model.py"), ("old é.py", None)]


def test_changed_paths_takes_a_rename_from_its_own_lines_as_git_apply_does() -> None:
    # The header names model.py twice, but git apply renames data.py onto it.
    diff = "diff --git a/model.py b/model.py\nsimilarity index 100%\nrename from data.py\nrename to model.py\n"
    assert changed_paths(diff) == [("data.py", "model.py")]


def test_changed_paths_does_not_depend_on_the_folder_git_runs_in(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    # Run inside a repository's subfolder, git apply would skip the files outside it.
    make_user_repo(tmp_path / "user")
    (tmp_path / "user" / "sub").mkdir()
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path / "user" / "sub"))
    monkeypatch.chdir(tmp_path / "user" / "sub")
    assert changed_paths(FUSED_PATCH) == [("train.py", "train.py")]


def test_a_diff_git_cannot_read_is_a_patch_error() -> None:
    corrupt = "diff --git a/x.py b/x.py\n--- a/x.py\n+++ b/x.py\n@@ -1,3 +1,3 @@\n a\n-b\n+c\n"
    with pytest.raises(PatchError, match="git cannot read the diff: .*corrupt patch"):
        changed_paths(corrupt)
