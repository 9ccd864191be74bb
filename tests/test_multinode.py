"""Multi-node trials: each node's torchrun line, merging node results, and a real run on a
private two-node Ray cluster (a trial over both nodes, a node lost mid-trial, a placement
group that cannot be placed)."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from infrarsi.core.errors import SpecError
from infrarsi.core.trial import Outcome, Role, TrialResult
from infrarsi.harness.launcher import TrialRequest
from infrarsi.harness.multinode import NodeLayout, merge_node_results, node_argv, node_request

REPO_ROOT = Path(__file__).resolve().parents[1]
LAYOUT = NodeLayout(num_nodes=2, processes_per_node=None, gpus_per_node=0, cpus_per_node=1)


def _req(tmp_path, **changes):
    fields = dict(trial_id="t7", config={"micro_batch": 4}, role=Role.SEARCH,
                  argv=("py", "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "train.py",
                        "--steps", "3"),
                  env={}, cwd=str(tmp_path), trial_dir=str(tmp_path / "t7"), memory_capacity_bytes=1000,
                  emulate_capacity=True, timeout_s=60, warmup_steps=1, num_steps=3, devices_per_trial=4)
    return TrialRequest(**{**fields, **changes})


def test_node_argv_replaces_the_single_node_rendezvous_with_c10d_on_the_first_node():
    argv = ("py", "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "--max-restarts=0",
            "train.py", "--standalone-like-arg", "1")
    first = node_argv(argv, layout=LAYOUT, rdzv_endpoint="10.0.0.1:29400", rdzv_id="t1-a1", hosts_store=True)
    assert first == ("py", "-m", "torch.distributed.run", "--nnodes", "2", "--rdzv-backend", "c10d",
                     "--rdzv-endpoint", "10.0.0.1:29400", "--rdzv-id", "t1-a1", "--rdzv-conf", "is_host=1",
                     "--nproc-per-node", "2", "--max-restarts=0", "train.py", "--standalone-like-arg", "1")
    other = node_argv(argv, layout=LAYOUT, rdzv_endpoint="10.0.0.1:29400", rdzv_id="t1-a1", hosts_store=False)
    assert [t for t in first if t != "is_host=1"] == [t for t in other if t != "is_host=0"]


def test_node_argv_sets_processes_per_node_and_drops_old_rendezvous_options():
    layout = NodeLayout(num_nodes=4, processes_per_node=8, gpus_per_node=8, cpus_per_node=16)
    argv = ("torchrun", "--nnodes=1", "--nproc_per_node", "1", "--master-port", "1234", "--no-python", "job.sh")
    out = node_argv(argv, layout=layout, rdzv_endpoint="h:1", rdzv_id="x", hosts_store=False)
    assert out == ("torchrun", "--nnodes", "4", "--rdzv-backend", "c10d", "--rdzv-endpoint", "h:1", "--rdzv-id", "x",
                   "--rdzv-conf", "is_host=0", "--nproc-per-node", "8", "--no-python", "job.sh")


def test_a_command_that_is_not_torchrun_cannot_span_nodes():
    with pytest.raises(SpecError, match="needs a torchrun command"):
        node_argv(("python", "train.py"), layout=LAYOUT, rdzv_endpoint="h:1", rdzv_id="x", hosts_store=True)


def test_each_node_runs_in_its_own_folder_of_the_attempt(tmp_path):
    req = _req(tmp_path, attempt=2)
    node = node_request(req, node_index=1, layout=LAYOUT, rdzv_endpoint="h:1")
    assert node.trial_dir == str(tmp_path / "t7-a2" / "node1") and node.attempt == 1
    assert "t7-a2" in node.argv and node.devices_per_trial == 1


def _node(outcome, *, rank0=False, peak=100, returncode=0, reason=""):
    extra = {"returncode": returncode, "start": {"world_size": 2} if rank0 else {}}
    ok = dict(step_time_s=0.5, step_times_s=(0.5, 0.5), losses=(3.0, 2.0, 1.0)) if outcome is Outcome.OK else {}
    return TrialResult(trial_id="t7", config={}, role=Role.SEARCH, outcome=outcome, peak_memory_bytes=peak,
                       host_peak_rss_bytes=peak, wall_time_s=10.0, extra=extra, reason=reason, **ok)


def test_merge_takes_rank0s_clock_and_every_nodes_memory(tmp_path):
    req = _req(tmp_path)
    # The node without rank 0 exits 0 with no metrics: its launcher calls that a crash.
    merged = merge_node_results(req, [_node(Outcome.CRASH, peak=900, reason="reported 0 of 3 steps"),
                                      _node(Outcome.OK, rank0=True, peak=300)])
    assert merged.outcome is Outcome.OK and merged.step_time_s == 0.5 and merged.losses == (3.0, 2.0, 1.0)
    assert merged.peak_memory_bytes == 900 and merged.device_seconds == 40.0
    assert [n["has_rank0_metrics"] for n in merged.extra["nodes"]] == [False, True]


def test_merge_reports_the_worst_node_failure_with_a_censored_oom_peak(tmp_path):
    req = _req(tmp_path)
    merged = merge_node_results(req, [_node(Outcome.CRASH, rank0=True, returncode=1, reason="peer closed"),
                                      _node(Outcome.OOM, peak=700, returncode=-9, reason="over capacity")])
    assert merged.outcome is Outcome.OOM and merged.reason == "node 1: over capacity"
    assert merged.peak_memory_bytes == 1000 and merged.step_time_s is None
    nobody = merge_node_results(req, [_node(Outcome.CRASH), _node(Outcome.CRASH)])
    assert nobody.outcome is Outcome.CRASH and "none reported rank 0" in nobody.reason


@pytest.fixture(scope="module")
def cluster_run(tmp_path_factory):
    """Runs tests/multinode_scenario.py once; its report and the trials by id."""
    out = tmp_path_factory.mktemp("multinode")
    proc = subprocess.Popen([sys.executable, str(REPO_ROOT / "tests" / "multinode_scenario.py"), str(out)],
                            cwd=REPO_ROOT, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        log, _ = proc.communicate(timeout=400)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        log, _ = proc.communicate()
    report_path = out / "report.json"
    assert report_path.exists(), log[-3000:]
    report = json.loads(report_path.read_text())
    by_id: dict = {}
    for t in (TrialResult.from_json(t) for t in report["trials"]):
        by_id.setdefault(t.trial_id, []).append(t)
    return report, by_id


@pytest.mark.slow
def test_a_trial_spans_two_nodes_of_a_local_ray_cluster(cluster_run):
    report, by_id = cluster_run
    # Two nodes x one process on gloo: rank 0's clock and losses, both nodes' memory.
    [t1] = by_id["t1"]
    assert t1.outcome is Outcome.OK, t1.reason
    assert len(t1.losses) == 40 and t1.losses[-1] < t1.losses[0] - 0.5 and t1.tokens_per_step == 1024
    assert t1.extra["start"]["world_size"] == 2
    assert sorted(t1.extra["node_ids"]) == sorted(report["node_ids"])  # one bundle on each node
    nodes = t1.extra["nodes"]
    assert [n["has_rank0_metrics"] for n in nodes].count(True) == 1
    assert all(n["host_peak_rss_bytes"] > 0 for n in nodes)
    assert t1.peak_memory_bytes == max(n["peak_memory_bytes"] for n in nodes)
    assert report["address_file_is_private"]  # the cluster was never announced in /tmp/ray


@pytest.mark.slow
def test_a_placement_group_that_cannot_be_placed_times_out_and_is_removed(cluster_run):
    report, by_id = cluster_run
    [t3] = by_id["t3"]  # three nodes asked of two
    assert t3.outcome is Outcome.CRASH and t3.extra["placement_timeout"] and "could not be placed" in t3.reason
    assert set(report["placement_group_states"]) == {"REMOVED"}


@pytest.mark.slow
def test_a_node_lost_mid_trial_is_recorded_and_the_trial_retried(cluster_run):
    report, by_id = cluster_run
    # The loss was real and mid-trial: both nodes' ranks were running; the lost node's
    # actor worker was SIGKILLed, its torchrun and its rank frozen (SIGSTOP: no connection
    # reset, so the surviving rank could not die of its peer's death by itself).
    assert report["ranks_running_at_kill"]
    killed = report["killed"]
    assert killed["workers"] == 1 and len(killed["ranks"]) == 1 and "/t2/node" in killed["ranks"][0]
    assert len(killed["killed"]) == 1 and killed["killed"][0].startswith("ray::")
    for share in (killed["frozen"], killed["survivors"]):
        assert any("torch.distributed.run" in p for p in share) and any("train.py" in p for p in share)
    # The harness cancelled the surviving node's share: its torchrun and rank were gone by
    # the time the lost attempt came back.
    assert report["survivors_alive_after_lost_attempt"] == []
    lost, retry = by_id["t2"]
    assert (lost.attempt, lost.outcome, retry.attempt, retry.outcome) == (1, Outcome.CRASH, 2, Outcome.OK)
    assert lost.extra["actor_died"] and lost.extra["retried"] and "lost mid-trial" in lost.reason
    assert lost.extra["lost_node_id"] == report["killed_node_id"]
    assert report["replacement_node_id"] in retry.extra["node_ids"]
    assert report["killed_node_id"] not in retry.extra["node_ids"]
    # The surviving node's share came back (stopped, not left waiting for its lost peer),
    # and no trial process outlived the scenario.
    assert [n["outcome"] for n in lost.extra["nodes"]] == ["crash"] and report["orphans_killed"] == 0
    [t1] = by_id["t1"]  # the completed trial is still in the ledger
    assert len(retry.losses) == 400 and retry.losses[:40] == pytest.approx(t1.losses, rel=1e-6)
