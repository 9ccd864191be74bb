"""Soak of the fault suite: the fault-injection tests (``-m fault``) run again and again in
one process, and after each round what they may have left behind is counted.

Each round is one ``pytest.main`` session (its session fixtures, a local Ray and a
temporary Prefect server, start and stop with it) with its own ``--basetemp``. After a
round, and a short grace for processes on their way out:

- leaked processes: live processes other than this one that carry this soak's marker in
  their environment (every process the tests start inherits it: Ray's, Prefect's, trial
  jobs, orphans included), and the Ray processes among them;
- MLflow runs left RUNNING: trial runs in any store the round wrote, and campaign runs in
  the stores of the tests that run a whole campaign (the tracker's own tests start
  campaign runs they never end, on purpose);
- file descriptors, threads and memory of this process, against the first round (which
  pays for imports and caches once). Descriptors on MLflow SQLite stores are counted
  apart: MLflow keeps one engine per store URI for the life of the process
  (``SqlAlchemyStore._engine_map``), and every round's tests make new stores.

Not part of CI: a round takes minutes. Run it at low priority on a shared machine:

    nice -n 10 python benchmarks/fault_soak.py --rounds 20 --out soak.json
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import sys
import tempfile
import time
import uuid
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
MARKER = "INFRARSI_SOAK_ID"
FAULT_FILES = ("tests/test_outside_systems.py", "tests/test_stage_retry.py", "tests/test_ray_pool.py",
               "tests/test_tracking.py", "tests/test_llm_adapter.py")
# Tests that run whole campaigns: every campaign run they leave must be closed.
CAMPAIGN_TESTS = ("test_a_search_that_loses", "test_a_degraded_campaign")  # tmp folders: 30 chars at most


class Outcomes:
    """A pytest plugin counting test outcomes of one session."""

    def __init__(self) -> None:
        self.counts = {"passed": 0, "failed": 0, "skipped": 0}
        self.failed: list[str] = []

    def pytest_runtest_logreport(self, report) -> None:
        if report.when == "call" or report.outcome != "passed":
            self.counts[report.outcome] = self.counts.get(report.outcome, 0) + 1
            if report.outcome == "failed":
                self.failed.append(report.nodeid)


def marked_processes(soak_id: str) -> list[psutil.Process]:
    me, found = os.getpid(), []
    for proc in psutil.process_iter(["pid"]):
        if proc.pid == me:
            continue
        try:
            if proc.environ().get(MARKER) == soak_id and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def _name(proc: psutil.Process) -> str:
    try:
        return " ".join(proc.cmdline())[:120] or proc.name()
    except psutil.Error:
        return "?"


def running_runs(basetemp: Path) -> dict[str, int]:
    """RUNNING trial runs in every store, and RUNNING campaign runs in campaign tests' stores."""
    trial_runs = campaign_runs = 0
    for db in basetemp.rglob("*.db"):
        try:
            with sqlite3.connect(db) as conn:
                rows = conn.execute(
                    "SELECT t.value FROM runs r JOIN tags t ON t.run_uuid = r.run_uuid "
                    "WHERE r.status = 'RUNNING' AND r.lifecycle_stage = 'active' AND t.key = 'infrarsi.kind'"
                ).fetchall()
        except sqlite3.Error:  # not an MLflow store
            continue
        trial_runs += sum(kind == "trial" for (kind,) in rows)
        if any(name in str(db) for name in CAMPAIGN_TESTS):
            campaign_runs += sum(kind == "campaign" for (kind,) in rows)
    return {"trial_runs_running": trial_runs, "campaign_runs_running": campaign_runs}


def open_fds() -> dict[str, int]:
    """This process's descriptors: on SQLite files (MLflow's cached store engines), and the rest."""
    targets = []
    for fd in Path("/proc/self/fd").iterdir():
        try:
            targets.append(os.readlink(fd))
        except OSError:  # closed while listed
            continue
    on_db = sum(t.endswith(".db") for t in targets)
    return {"fds": len(targets) - on_db, "fds_mlflow_stores": on_db}


def soak_round(index: int, basetemp: Path, soak_id: str, grace_s: float, files: list[str]) -> dict:
    import pytest

    outcomes = Outcomes()
    started = time.monotonic()
    # -s: Prefect binds its console log handler to the stderr of its import, in round 1;
    # pytest's capture of that round closes with it.
    code = pytest.main(["-q", "-s", "-m", "fault", "-p", "no:cacheprovider", f"--basetemp={basetemp}",
                        *files], plugins=[outcomes])
    wall_s = time.monotonic() - started
    time.sleep(grace_s)
    left = marked_processes(soak_id)
    me = psutil.Process()
    return {"round": index, "exit_code": int(code), "wall_s": round(wall_s, 1), **outcomes.counts,
            "failed_tests": outcomes.failed, "leaked_processes": len(left),
            "leaked_ray_processes": sum("ray" in _name(p) for p in left),
            "leaked": [_name(p) for p in left][:10], **running_runs(basetemp),
            **open_fds(), "threads": me.num_threads(), "rss_mib": round(me.memory_info().rss / 2**20, 1)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--grace-s", type=float, default=5.0, help="wait after a round before counting what is left")
    p.add_argument("--out", type=Path, help="write the rounds and the summary as JSON here")
    p.add_argument("--files", nargs="+", default=list(FAULT_FILES),
                   help="test files whose fault tests run (default: every file holding one), e.g. to find "
                        "which one a growth comes from")
    args = p.parse_args()

    os.chdir(ROOT)
    sys.path.insert(0, str(ROOT))
    soak_id = uuid.uuid4().hex
    os.environ[MARKER] = soak_id  # inherited by every process the tests start
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    rounds = []
    with tempfile.TemporaryDirectory(prefix="infrarsi-soak-") as tmp:
        for i in range(1, args.rounds + 1):
            r = soak_round(i, Path(tmp) / f"round-{i}", soak_id, args.grace_s, args.files)
            rounds.append(r)
            print(f"round {i:2d}: exit {r['exit_code']} passed {r['passed']} failed {r['failed']} "
                  f"({r['wall_s']:.0f} s); leaked processes {r['leaked_processes']} (Ray {r['leaked_ray_processes']}); "
                  f"RUNNING runs: trial {r['trial_runs_running']}, campaign {r['campaign_runs_running']}; "
                  f"fds {r['fds']} (+{r['fds_mlflow_stores']} on MLflow stores) threads {r['threads']} "
                  f"rss {r['rss_mib']} MiB", flush=True)
            for name in r["leaked"]:
                print(f"    left: {name}", flush=True)
    first, last = rounds[0], rounds[-1]
    summary = {
        "rounds": len(rounds), "tests_per_round": first["passed"] + first["failed"] + first["skipped"],
        "rounds_all_passed": sum(r["failed"] == 0 and r["exit_code"] == 0 for r in rounds),
        "max_leaked_processes": max(r["leaked_processes"] for r in rounds),
        "max_leaked_ray_processes": max(r["leaked_ray_processes"] for r in rounds),
        "max_trial_runs_running": max(r["trial_runs_running"] for r in rounds),
        "max_campaign_runs_running": max(r["campaign_runs_running"] for r in rounds),
        "fds_first_last": [first["fds"], last["fds"]],
        "fds_on_mlflow_stores_first_last": [first["fds_mlflow_stores"], last["fds_mlflow_stores"]],
        "threads_first_last": [first["threads"], last["threads"]],
        "rss_mib_first_last": [first["rss_mib"], last["rss_mib"]],
        "median_round_s": sorted(r["wall_s"] for r in rounds)[len(rounds) // 2],
    }
    print(json.dumps(summary, indent=1))
    if args.out:
        args.out.write_text(json.dumps({"summary": summary, "rounds": rounds}, indent=1))
    return 0 if summary["rounds_all_passed"] == len(rounds) else 1


if __name__ == "__main__":
    raise SystemExit(main())
