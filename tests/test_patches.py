"""Code patches: loading, the scope gate, patch knobs in the space, worktrees, the branch."""

from pathlib import Path
from types import SimpleNamespace

import git
import pytest
from tiny_gpt import GPT_DIR

from infrarsi.adapters.git_branch import check_patches_apply, patch_worktree, snapshot, stage_branch
from infrarsi.contract.spec_load import parse_spec
from infrarsi.core.errors import PatchError, SpecError
from infrarsi.core.files import glob_matches, matching_files
from infrarsi.patches.patch import Patch, check_scope, load_patches, make_diff, require_in_scope

EDITABLE, LOCKED = ["model.py", "train.py"], ["data.py", "metrics.py", "flavours.py"]
CONTRACT = SimpleNamespace(spec=SimpleNamespace(contract=SimpleNamespace(editable=EDITABLE, locked=LOCKED)),
                           locked_hashes=dict.fromkeys(LOCKED, "x"))


def patch(diff: str) -> Patch:
    return Patch(name="p", diff=diff, title="t")


def edit(rel: str) -> str:
    return make_diff(rel, "a\nb\n", "a\nc\n")


def test_the_builtin_patches_load_and_stay_in_scope():
    patches = load_patches(["cached_causal_mask", "checkpoint_lm_head"], base_dir=Path("."))
    assert [p.knob for p in patches] == ["patch_cached_causal_mask", "patch_checkpoint_lm_head"]
    assert all(check_scope(p, CONTRACT) == [] for p in patches)
    assert patches[0].expected_time_effect < 1 and patches[1].expected_memory_effect < 1


@pytest.mark.parametrize("diff,problem", [
    (edit("metrics.py"), "modifies locked file 'metrics.py'"),
    (edit("README.md"), "modifies 'README.md', outside the editable scope"),
    (edit("../outside.py"), "has a '..' component"),
    ("diff --git a//etc/x b//etc/x\n--- /etc/x\n+++ /etc/x\n@@ -1 +1 @@\n-a\n+b\n", "absolute path"),
    ("diff --git a/new.py b/new.py\nnew file mode 100644\n--- /dev/null\n+++ b/new.py\n@@ -0,0 +1 @@\n+x\n",
     "adds new file 'new.py' outside the editable scope"),
    ("diff --git a/data.py b/data.py\ndeleted file mode 100644\n--- a/data.py\n+++ /dev/null\n@@ -1 +0,0 @@\n-x\n",
     "deletes locked file 'data.py'"),
    ("diff --git a/data.py b/model.py\nsimilarity index 100%\nrename from data.py\nrename to model.py\n",
     "renames or copies 'data.py' -> 'model.py', touching a locked path"),
    ("diff --git a/model.py b/metrics.py\nsimilarity index 90%\ncopy from model.py\ncopy to metrics.py\n",
     "touching a locked path"),
    ("diff --git a/model.py b/model.py\nnew file mode 120000\n--- /dev/null\n+++ b/model.py\n@@ -0,0 +1 @@\n"
     "+data.py\n\\ No newline at end of file\n", "symlink"),
    # git reads the mode in octal, leading zeros and all: 0120000 is a symlink too
    ("diff --git a/model.py b/model.py\nnew file mode 0120000\n--- /dev/null\n+++ b/model.py\n@@ -0,0 +1 @@\n"
     "+data.py\n\\ No newline at end of file\n", "symlink"),
    # The header names model.py only; git apply renames the locked data.py onto it.
    ("diff --git a/model.py b/model.py\nsimilarity index 100%\nrename from data.py\nrename to model.py\n",
     "renames or copies 'data.py' -> 'model.py', touching a locked path"),
    ('diff --git "a/data.py" "b/model.py"\nsimilarity index 100%\ncopy from "data.py"\ncopy to "model.py"\n',
     "touching a locked path"),
    ("diff --git a/model.py b/model.py\n--- a/model.py\n+++ b/model.py\n@@ -1,3 +1,3 @@\n a\n-b\n+c\n",
     "git cannot read the diff"),
])
def test_the_scope_gate_names_every_escape(diff, problem):
    problems = check_scope(patch(diff), CONTRACT)
    assert any(problem in p for p in problems), problems
    with pytest.raises(PatchError, match="fix the diff or remove it"):
        require_in_scope(patch(diff), CONTRACT)


@pytest.mark.parametrize("pattern,matched,unmatched", [
    ("model.py", ["model.py"], ["sub/model.py", "model.py/x"]),  # anchored, never by last segment alone
    ("*.py", ["a.py", ".config.py"], ["sub/a.py"]),  # dot-files are ordinary names
    ("**/*.py", ["a.py", ".github/x.py", "a/.b/c.py"], ["a.pyc", ".git/x.py", "sub/.git/x.py"]),
    ("src", ["src"], ["src/a.py"]),  # a file, not everything under a folder
    ("src/", [], ["src", "src/a.py"]),
    ("src/**", ["src/a.py", "src/a/b.py"], ["src", "srcx/a.py"]),
    ("a/**/b.py", ["a/b.py", "a/x/y/b.py"], ["a/b.py/c"]),
    ("a**b", ["ab", "axb"], ["a/b"]),  # ** inside a segment is *
    ("x?.py", ["x1.py"], ["x.py", "x/.py"]),
    ("[ab].py", ["a.py", "b.py"], ["c.py"]),
    ("./train.py", ["train.py"], []),
    ("!x", ["!x"], ["x"]),  # no negation, no comment: a pattern is a path
])
def test_one_glob_rule_for_editable_and_locked_files(pattern, matched, unmatched):
    assert [p for p in matched + unmatched if glob_matches(p, [pattern])] == matched


def test_the_scope_gate_and_the_contract_listing_agree_on_dot_files_and_nested_folders(tmp_path):
    files = ["model.py", "train.py", ".hidden.py", ".env", "sub/x.py", "sub/.y.py", ".github/ci.py",
             "src/README.md", "src/a/b/c.py", "src/a/.d/e.py", "data/raw.bin", ".git/hooks/pre.py"]
    for rel in files:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("a\nb\n")
    editable, locked = ["*.py", "src/**", ".github/*.py"], ["**/.*.py", "src/a/**/*.py", "data/**"]
    listed_locked = matching_files(tmp_path, locked)
    listed_editable = [p for p in matching_files(tmp_path, editable) if p not in listed_locked]  # as init lists
    assert listed_locked == [".hidden.py", "data/raw.bin", "src/a/.d/e.py", "src/a/b/c.py", "sub/.y.py"]
    assert listed_editable == [".github/ci.py", "model.py", "src/README.md", "train.py"]
    for hashed in (listed_locked, []):  # the gate by the hashes taken at init, and by the globs alone
        contract = SimpleNamespace(spec=SimpleNamespace(contract=SimpleNamespace(editable=editable, locked=locked)),
                                   locked_hashes=dict.fromkeys(hashed, "x"))
        verdicts = {rel: check_scope(patch(edit(rel)), contract) for rel in files}
        assert sorted(rel for rel, problems in verdicts.items() if not problems) == listed_editable
        assert sorted(rel for rel, problems in verdicts.items()
                      if any("modifies locked file" in p for p in problems)) == listed_locked


def test_an_unknown_patch_names_the_builtin_ones(tmp_path):
    with pytest.raises(PatchError, match="built-in patches are .*cached_causal_mask"):
        load_patches(["no_such_patch"], base_dir=tmp_path)


def spec_data(**extra) -> dict:
    return {"name": "x", "workload_dir": str(GPT_DIR), "command": ["{python}", "train.py"],
            "knobs": {"micro_batch": {"values": [2, 4], "flag": "--micro-batch"}}, "baseline": {"micro_batch": 2},
            "contract": {"seq_len": 128, "global_batch_tokens": 1024, "num_steps": 3, "warmup_steps": 1,
                         "editable": EDITABLE, "locked": LOCKED},
            "device": {"memory_capacity": "1GiB"}, **extra}


def test_each_patch_is_a_boolean_knob_that_the_baseline_leaves_off():
    spec = parse_spec(spec_data(patches=["cached_causal_mask"]), source="t", base_dir=Path("."))
    knob = spec.space.knob("patch_cached_causal_mask")
    assert knob.values == (False, True) and knob.flag is knob.env is None
    assert spec.space.validate(spec.baseline)["patch_cached_causal_mask"] is False


def test_patches_need_the_process_backend():
    with pytest.raises(SpecError, match="patches need backend = 'process'"):
        parse_spec(spec_data(patches=["x"], backend="sim"), source="t", base_dir=Path("."))


def test_a_patch_worktree_leaves_the_snapshot_untouched_and_conflicts_become_pairs(tmp_path):
    repo = snapshot(GPT_DIR, tmp_path / "repo")
    diffs = {p.name: p.diff for p in load_patches(["cached_causal_mask", "checkpoint_lm_head"], Path("."))}
    clash = make_diff("model.py", (GPT_DIR / "model.py").read_text(),
                      (GPT_DIR / "model.py").read_text().replace("    seq_len = q.size(-2)\n", "    seq_len = q.shape[-2]\n"))
    assert check_patches_apply(repo, {**diffs, "clash": clash}) == [("cached_causal_mask", "clash")]
    tree = patch_worktree(repo, tmp_path / "worktrees" / "k", diffs)
    assert "_future_mask" in (tree / "model.py").read_text() and "_head_loss" in (tree / "model.py").read_text()
    assert patch_worktree(repo, tmp_path / "worktrees" / "k", diffs) == tree  # reused
    r = git.Repo(repo)
    assert r.active_branch.name == "main" and not r.is_dirty(untracked_files=True)
    assert "_future_mask" not in (repo / "model.py").read_text()


def test_the_promoted_branch_carries_the_patch(tmp_path):
    repo = snapshot(GPT_DIR, tmp_path / "repo")
    [p] = load_patches(["cached_causal_mask"], Path("."))
    sha = stage_branch(repo, "infrarsi/x", files={"infrarsi_promoted.toml": "[config]\npatch_cached_causal_mask = true\n"},
                       patches={p.name: p.diff}, message="promote")
    shown = git.Repo(repo).git.show(f"{sha}:model.py")
    assert "_future_mask" in shown
    assert git.Repo(repo).active_branch.name == "main"
