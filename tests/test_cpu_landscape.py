"""The CPU landscape replay (benchmarks/cpu_landscape.py) on the committed measurements."""

import importlib.util
import json
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LANDSCAPE = ROOT / "docs" / "benchmark" / "cpu_landscape" / "landscape.json"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("cpu_landscape", ROOT / "benchmarks" / "cpu_landscape.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_capacity_rule_lets_the_baseline_fit_and_the_hungriest_corner_oom(bench):
    table = bench.Table(json.loads(LANDSCAPE.read_text())["rows"])
    corner = {**bench.BASELINE, "micro_batch": 64, "checkpointing": "none"}
    assert len(table.time) == 120
    assert table.peak[bench._key(bench.BASELINE)] <= table.capacity < table.peak[bench._key(corner)]
    assert table.oracle > 1.0 and 0.0 < table.noise < 0.5


def test_replay_is_deterministic_and_counts_ooms(bench, tmp_path):
    shutil.copy(LANDSCAPE, tmp_path / "landscape.json")
    table = bench.Table(json.loads(LANDSCAPE.read_text())["rows"])
    runs = [bench.search(table, "random", seed, budget=12) for seed in range(3)]
    assert runs == [bench.search(table, "random", seed, budget=12) for seed in range(3)]
    for run in runs:
        assert 0 < run["speedup"] <= table.oracle + 1e-9 or run["best"] == bench.BASELINE
    # Random search over a space with over-capacity configs: some OOM, and OOMs are never best.
    over = {k for k, peak in table.peak.items() if peak > table.capacity}
    assert over and all(bench._key(r["best"]) not in over for r in runs)
    assert sum(r["oom"] for r in runs) >= 1
    bench.replay(tmp_path / "landscape.json", ["engine", "random"], seeds=2, budget=4, out=tmp_path)
    assert "| engine |" in (tmp_path / "replay.md").read_text()
    assert len(json.loads((tmp_path / "replay.json").read_text())) == 4
