import importlib.util
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
