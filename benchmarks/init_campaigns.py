"""`infrarsi init` then a campaign, as a user takes a job written elsewhere, one job after another.

Jobs:
- `ng48`: karpathy/nanoGPT's `train.py` on its shakespeare_char config as its README runs it on a
  CPU, typed with `env OMP_NUM_THREADS=1` and a 1 x 48 split of its batch;
- `ng12`: the same typed at 12 x 4 with no prefix;
- `trl`, `litgpt`, `torchtune`: the registry trainers of `tests/third_party/fixtures.py`, their
  published commands with a 100-step run.

nanoGPT is not part of this project: clone it and write its data with
`benchmarks/nanogpt_data.py` first. `--code DIR` runs the infrarsi of another checkout (put on
PYTHONPATH: a `git worktree` of an earlier commit measures the code before a change on the same
machine). Each run gets fresh data, bank, Prefect and Hugging Face folders under `--out`; one JSON
line per run (init's and the campaign's exit codes and seconds, the campaign's summary) is
appended to `--out`/results.jsonl.

    python benchmarks/init_campaigns.py --nanogpt ~/nanoGPT --out /tmp/runs ng48 ng12 trl
    python benchmarks/init_campaigns.py --code /tmp/before --label before --out /tmp/runs trl
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "third_party"))
import fixtures  # noqa: E402  (the registry trainers' inputs, made offline)

NANOGPT = ["python", "train.py", "config/train_shakespeare_char.py", "--device=cpu", "--compile=False",
           "--eval_iters=20", "--log_interval=1", "--block_size=64", "{split}", "--n_layer=4", "--n_head=4",
           "--n_embd=128", "--max_iters=2000", "--lr_decay_iters=2000", "--dropout=0.0"]
NUM_STEPS = 100  # the registry trainers' run length


def nanogpt(checkout: Path, split: list[str], prefix: list[str]):
    def build(folder: Path) -> fixtures.Launch:
        shutil.copytree(checkout, folder, ignore=shutil.ignore_patterns(".git", "campaign.toml", "out*"))
        argv = list(prefix)
        for token in NANOGPT:
            argv += split if token == "{split}" else [token]
        return fixtures.Launch(argv, {}, folder)
    return build


def registry(name: str):
    def build(folder: Path) -> fixtures.Launch:
        launch = {"trl": fixtures.trl_sft, "litgpt": fixtures.litgpt_pretrain,
                  "torchtune": fixtures.torchtune_full_finetune}[name](folder)
        argv = list(launch.argv)
        if name == "trl":
            argv[argv.index("--max_steps") + 1] = str(NUM_STEPS)
        elif name == "litgpt":
            argv[argv.index("--train.max_tokens") + 1] = str(NUM_STEPS * fixtures.TOKENS_PER_STEP)
        else:
            argv = [f"max_steps_per_epoch={NUM_STEPS}" if a.startswith("max_steps_per_epoch=") else a for a in argv]
        return fixtures.Launch(argv, launch.env, folder)
    return build


def run(job: str, build, root: Path, code: Path | None, label: str) -> dict:
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    launch = build(root / "work")
    path = os.pathsep.join([str(Path(sys.executable).parent), launch.env.get("PATH", os.environ["PATH"])])
    env = {**os.environ, **launch.env, "PATH": path, "INFRARSI_DATA_DIR": str(root / "data"),
           "PREFECT_HOME": str(root / "prefect"), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
           "HF_HOME": str(root / "hf_home"), **({"PYTHONPATH": str(code)} if code else {})}
    cli = [sys.executable, "-m", "infrarsi.cli"]
    started = time.time()
    init = subprocess.run([*cli, "init", "--", *launch.argv], cwd=launch.cwd, env=env, capture_output=True, text=True)
    (root / "init.log").write_text(init.stdout + init.stderr)
    out = {"label": label, "job": job, "code": str(code or REPO), "init_rc": init.returncode,
           "init_s": round(time.time() - started, 1)}
    if init.returncode == 0:
        started = time.time()
        done = subprocess.run([*cli, "campaign", "campaign.toml", "--json", "--no-progress", "--out", str(root / "out")],
                              cwd=launch.cwd, env=env, capture_output=True, text=True)
        (root / "campaign.log").write_text(done.stdout + "\n---\n" + done.stderr)
        out.update(campaign_rc=done.returncode, campaign_s=round(time.time() - started, 1))
        if done.returncode == 0:  # the last line: the code before the one-document --json printed lines above it
            out["summary"] = json.loads(done.stdout.strip().splitlines()[-1])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("jobs", nargs="+", choices=["ng48", "ng12", "trl", "litgpt", "torchtune"])
    parser.add_argument("--nanogpt", type=Path, help="a clone of karpathy/nanoGPT with its data written")
    parser.add_argument("--code", type=Path, help="a checkout whose infrarsi runs (default: this one)")
    parser.add_argument("--label", default="after", help="names the runs in results.jsonl (default: %(default)s)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    builds = {"trl": registry("trl"), "litgpt": registry("litgpt"), "torchtune": registry("torchtune")}
    if args.nanogpt:
        builds["ng48"] = nanogpt(args.nanogpt, ["--batch_size=1", "--gradient_accumulation_steps=48"],
                                 ["env", "OMP_NUM_THREADS=1"])
        builds["ng12"] = nanogpt(args.nanogpt, ["--batch_size=12", "--gradient_accumulation_steps=4"], [])
    for job in args.jobs:
        if job not in builds:
            parser.error(f"{job} needs --nanogpt")
        result = run(job, builds[job], args.out / f"{job}-{args.label}", args.code, args.label)
        with open(args.out / "results.jsonl", "a") as f:
            f.write(json.dumps(result) + "\n")
        print(json.dumps({k: v for k, v in result.items() if k != "summary"}), flush=True)


if __name__ == "__main__":
    main()
