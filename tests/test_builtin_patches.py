"""Every built-in patch keeps the loss it declares. Model patches: the patched model.py
loaded next to the original, same seed and batch, loss and every gradient compared in
this process. The DDP patch: the trainer under torchrun, patched copy vs original."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tiny_gpt import GPT_DIR

from infrarsi.patches.patch import builtin_patches
from workloads.gpt.flavours import get_flavour

# patch -> (the model's attention and checkpointing where the patch changes what runs,
#           max relative difference of loss and gradients; 0 = bit-identical)
MODEL_PATCHES = {
    "cached_causal_mask": (("naive", "full"), 0.0),
    "checkpoint_lm_head": (("naive", "full"), 0.0),
    # 16 x 128 = 2048 tokens: two chunks of 1024, summed in another order
    "chunked_cross_entropy": (("naive", "none"), 1e-5),
}
TRAINER_PATCHES = {"ddp_bucket_view": 0.0}


def patched_tree(name: str, tmp: Path) -> Path:
    patch = next(p for p in builtin_patches() if p.name == name)
    tree = tmp / "gpt"
    shutil.copytree(GPT_DIR, tree, ignore=shutil.ignore_patterns("__pycache__"))
    (tmp / "p.diff").write_text(patch.diff)
    subprocess.run(["git", "apply", str(tmp / "p.diff")], cwd=tree, check=True)
    return tree


def loss_and_grads(model_file: Path, attention: str, checkpointing: str) -> tuple[torch.Tensor, list[torch.Tensor]]:
    spec = importlib.util.spec_from_file_location(f"model_{abs(hash(str(model_file)))}", model_file)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    torch.manual_seed(0)
    model = module.GPT(get_flavour("tiny"), attention=attention, checkpointing=checkpointing)
    gen = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, 256, (16, 129), generator=gen)
    loss = model(tokens[:, :-1], tokens[:, 1:])
    loss.backward()
    return loss.detach(), [p.grad for p in model.parameters()]


def test_every_builtin_patch_has_a_loss_check():
    assert sorted({**MODEL_PATCHES, **TRAINER_PATCHES}) == sorted(p.name for p in builtin_patches())


@pytest.mark.parametrize("name", sorted(MODEL_PATCHES))
def test_a_model_patch_keeps_the_loss_and_gradients_it_declares(name, tmp_path):
    torch.set_num_threads(1)
    (attention, checkpointing), tolerance = MODEL_PATCHES[name]
    assert ("bit-identical" in next(p for p in builtin_patches() if p.name == name).numerics) == (tolerance == 0)
    loss, grads = loss_and_grads(patched_tree(name, tmp_path) / "model.py", attention, checkpointing)
    ref_loss, ref_grads = loss_and_grads(GPT_DIR / "model.py", attention, checkpointing)
    if tolerance == 0:
        assert torch.equal(loss, ref_loss) and all(torch.equal(a, b) for a, b in zip(grads, ref_grads))
    else:
        assert abs(loss.item() - ref_loss.item()) <= tolerance * abs(ref_loss.item())
        assert all(torch.allclose(a, b, rtol=10 * tolerance, atol=1e-7) for a, b in zip(grads, ref_grads))


def _start_trainer(workdir: Path, metrics: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "train.py",
         "--flavour", "tiny", "--seq-len", "64", "--global-batch-tokens", "1024", "--steps", "3",
         "--micro-batch", "4", "--threads", "1"],
        cwd=workdir, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "INFRARSI_METRICS_FILE": str(metrics)})


def _losses(proc: subprocess.Popen, metrics: Path) -> list[float]:
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-2000:]
    return [e["loss"] for e in map(json.loads, metrics.read_text().splitlines()) if e["event"] == "step"]


def test_gradients_as_bucket_views_keep_the_ddp_loss_bit_identical(tmp_path):
    # Both trainings at once (each is two gloo processes): the comparison is of losses, not time.
    runs = {name: (_start_trainer(tree, tmp_path / f"{name}.jsonl"), tmp_path / f"{name}.jsonl")
            for name, tree in (("patched", patched_tree("ddp_bucket_view", tmp_path)), ("original", GPT_DIR))}
    patched, original = (_losses(*runs[n]) for n in ("patched", "original"))
    assert patched == original and len(patched) == 3
