"""A private two-node Ray cluster on this machine, and multi-node GPT trials on it.

Run by tests/test_multinode.py in its own process, so that its Ray (a ``Cluster``: a head
and a worker node, each offering one ``trial_node`` bundle; its address file in a private
temporary folder instead of /tmp/ray) never meets the session's local Ray, and nobody
else's ``ray.init()`` or ``ray.init("auto")`` can find it. Writes OUT_DIR/report.json (the
trials' records and what the cluster saw) before it shuts the cluster down.

    python tests/multinode_scenario.py OUT_DIR
"""

import json
import os
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
NUM_STEPS = 40
# The trial whose node is lost runs long enough that the loss surely lands mid-trial,
# however fast the machine: removing a node takes seconds.
NUM_STEPS_LONG = 400
TINY_GPT = ("--flavour", "tiny", "--seq-len", "64", "--global-batch-tokens", "1024", "--lr", "3e-3",
            "--micro-batch", "4", "--checkpointing", "none", "--attention", "naive", "--threads", "1")


def say(message: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {message}", file=sys.stderr, flush=True)


def request(out_dir: Path, trial_id: str, num_steps: int = NUM_STEPS):
    from infrarsi.launcher import TrialRequest
    from infrarsi.trial import Role

    argv = (sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1",
            "workloads/gpt/train.py", *TINY_GPT, "--steps", str(num_steps))
    return TrialRequest(trial_id=trial_id, config={"nodes": 2}, role=Role.SEARCH, argv=argv, env={},
                        cwd=str(REPO_ROOT), trial_dir=str(out_dir / trial_id), memory_capacity_bytes=2**32,
                        emulate_capacity=True, timeout_s=240, warmup_steps=2, num_steps=num_steps,
                        devices_per_trial=2)


def first_step_written(trial_dir: Path) -> bool:
    for metrics in trial_dir.glob("node*/metrics.jsonl"):
        if '"event": "step"' in metrics.read_text():
            return True
    return False


def kill_orphans(out_dir: Path) -> int:
    """Trial processes of a removed node outlive its raylet (they run in their own session)."""
    import psutil

    killed = 0
    for proc in psutil.process_iter():
        try:
            if proc.environ().get("INFRARSI_METRICS_FILE", "").startswith(str(out_dir)):
                proc.kill()
                killed += 1
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            pass
    return killed


def kill_node(cluster, node) -> None:
    """What losing a machine does: its raylet and every process under it die at once, the
    trial's own process tree included (Ray alone would let a removed node's workers finish
    their task, and the trial processes run in their own session)."""
    import psutil

    # Ray's workers on that node name its raylet socket on their command line.
    socket_name = node._raylet_socket_name
    doomed = []
    for proc in psutil.process_iter(["cmdline"]):
        if any(socket_name in arg for arg in proc.info["cmdline"] or []):
            doomed += [proc, *proc.children(recursive=True)]
    for proc in doomed:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass
    cluster.remove_node(node, allow_graceful=False)


def main(out_dir: Path) -> None:
    os.environ["RAY_TMPDIR"] = tempfile.mkdtemp(prefix="rmn", dir="/tmp")  # short: socket paths
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    import ray
    from ray.cluster_utils import Cluster

    from infrarsi.adapters.ray_pool import PoolSettings, TrialPool
    from infrarsi.ledger import Ledger

    node = {"num_cpus": 1, "resources": {"trial_node": 1}}
    cluster = Cluster(initialize_head=True, head_node_args={**node, "include_dashboard": False})
    worker = cluster.add_node(**node)
    ray.init(address=cluster.address, log_to_driver=False, configure_logging=False)
    say(f"cluster up: {cluster.address}")
    ledger = Ledger(out_dir / "ledger.jsonl")
    settings = dict(address=cluster.address, cpus_per_trial=1, nodes_per_trial=2, node_resources={"trial_node": 1},
                    placement_strategy="STRICT_SPREAD", placement_timeout_s=30)
    report: dict = {"node_ids": [cluster.head_node.node_id, worker.node_id]}
    pool = TrialPool(PoolSettings(**settings))
    try:
        # 1. A whole trial over two nodes.
        for result in pool.run_one(request(out_dir, "t1")):
            ledger.append_trial(result)
        # 2. A node lost mid-trial: remove the worker once rank 0 has reported a step, then
        # bring up a replacement so the retry can be placed. (The head holds the driver and
        # the trial's coordinator; a real campaign loses worker nodes the same way.)
        say("t1 done")
        pool.submit(request(out_dir, "t2", NUM_STEPS_LONG))
        deadline = time.monotonic() + 90
        while not first_step_written(out_dir / "t2") and time.monotonic() < deadline:
            time.sleep(0.05)
        report["step_seen_before_kill"] = first_step_written(out_dir / "t2")
        report["killed_node_id"] = worker.node_id
        kill_node(cluster, worker)
        say("worker removed")
        report["replacement_node_id"] = cluster.add_node(**node).node_id
        attempts = []
        while pool.busy:
            attempts += pool.wait()
        for result in attempts:
            ledger.append_trial(result)
    finally:
        pool.close()
    say("t2 done")
    # 3. A placement group that cannot be placed (three nodes asked, two exist) times out.
    pool = TrialPool(PoolSettings(**{**settings, "nodes_per_trial": 3, "placement_timeout_s": 3}))
    try:
        for result in pool.run_one(request(out_dir, "t3")):
            ledger.append_trial(result)
    finally:
        pool.close()
    from ray.util import placement_group_table

    report["placement_group_states"] = sorted(g["state"] for g in placement_group_table().values())
    report["trials"] = [t.to_json() for t in Ledger(out_dir / "ledger.jsonl").trials()]
    report["address_file_is_private"] = not _public_address_file_names(cluster.address)
    report["orphans_killed"] = kill_orphans(out_dir)
    (out_dir / "report.json").write_text(json.dumps(report, default=str))
    say("report written")
    ray.shutdown()
    cluster.shutdown()
    say("cluster down")


def _public_address_file_names(address: str) -> bool:
    public = Path("/tmp/ray/ray_current_cluster")
    return public.exists() and public.read_text().strip() == address


if __name__ == "__main__":
    sys.path.insert(0, str(REPO_ROOT))
    main(Path(sys.argv[1]).resolve())
