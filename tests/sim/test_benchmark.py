import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_tiny_benchmark_writes_the_table(tmp_path):
    spec = importlib.util.spec_from_file_location("search_benchmark", ROOT / "benchmarks" / "search_benchmark.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    rc = bench.main(["--workloads", "debug", "--proposers", "random", "tpe", "--budgets", "5", "--seeds", "2",
                     "--processes", "1", "--out", str(tmp_path)])
    assert rc == 0
    table = (tmp_path / "results.md").read_text()
    assert "| random | debug | 5 |" in table and "| tpe | debug | 5 |" in table
    assert (tmp_path / "results.json").exists() and (tmp_path / "best_so_far.png").exists()


def test_generated_benchmark_resumes_and_writes_the_split_table(tmp_path):
    spec = importlib.util.spec_from_file_location("generated_benchmark", ROOT / "benchmarks" / "generated_benchmark.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    args = ["--split", "held-out", "--jobs", "1", "--proposers", "random", "tpe+warm", "--budgets", "3",
            "--seeds", "1", "--processes", "1", "--out", str(tmp_path)]
    assert bench.main(args) == 0
    log = (tmp_path / "runs.jsonl").read_text().splitlines()
    assert len(log) == 2
    table = (tmp_path / "results.md").read_text()
    assert "held-out split" in table and "| tpe+warm | the engine's start configs enqueued" in table
    assert "| gen-5000 |" in table
    # Resuming runs nothing new; the tables come from the log.
    assert bench.main(args + ["--resume"]) == 0
    assert len((tmp_path / "runs.jsonl").read_text().splitlines()) == 2
    # Each row carries job-resampled 90% intervals around its median, worst decile and mean.
    row = json.loads((tmp_path / "results.json").read_text())["overall"][0]
    for key in ("median", "worst_decile", "mean"):
        lo, hi = row["interval_90"][key]
        assert lo <= row[key] <= hi
    # Re-summarising a finished run keeps that run's wall time.
    meta = json.loads((tmp_path / "results.json").read_text())["meta"]
    assert bench.main(args + ["--summarise-only"]) == 0
    assert json.loads((tmp_path / "results.json").read_text())["meta"]["wall_s"] == meta["wall_s"]
