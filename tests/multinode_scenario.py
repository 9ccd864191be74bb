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
# How long every node's rank has run before the node is lost.
RANKS_SETTLE_S = 2.0
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


def trial_ranks(trial_dir: Path) -> list:
    """The trial's running ranks: torchrun's workers (torchrun gives them ``RANK``) whose
    metrics file, inherited from the node's launcher, lies under ``trial_dir``."""
    import psutil

    ranks = []
    for proc in psutil.process_iter():
        try:
            env = proc.environ()
            if env.get("INFRARSI_METRICS_FILE", "").startswith(f"{trial_dir}/") and "RANK" in env:
                ranks.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            pass
    return ranks


def wait_until_ranks_run(trial_dir: Path, num_nodes: int, timeout_s: float) -> bool:
    """True once every node's rank has been running for ``RANKS_SETTLE_S``: the rendezvous
    of all nodes is done and the job is under way (400 steps take far longer), so a loss
    now lands mid-trial."""
    import psutil

    deadline = time.monotonic() + timeout_s
    first_seen = None
    while time.monotonic() < deadline:
        ranks = trial_ranks(trial_dir)
        if len(ranks) == num_nodes:
            first_seen = first_seen or time.monotonic()
            try:
                if time.monotonic() - first_seen > RANKS_SETTLE_S:
                    return all(r.is_running() for r in ranks)
            except psutil.NoSuchProcess:
                pass
        time.sleep(0.25)
    return False


def kill_orphans(out_dir: Path) -> int:
    """Kill any trial process still alive (they run in sessions of their own, so neither a
    removed raylet nor a killed actor takes them along); the test expects none."""
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


def kill_node(cluster, node, trial_dir: Path) -> dict:
    """What losing a machine does to the trial: the Ray worker that hosts the trial's node
    actor on ``node`` and that actor's whole trial process tree die at once (SIGKILL), then
    the node leaves the cluster. (``Cluster.remove_node`` alone kills the node's raylet but
    not its workers, and the trial processes run in sessions of their own.) The actor's
    worker is found from the trial's ranks: their ancestor named ``ray::`` whose parent is
    this node's raylet (its command line names the node's raylet socket)."""
    import psutil

    socket_name = node._raylet_socket_name
    workers = {}
    for rank in trial_ranks(trial_dir):
        try:
            chain = rank.parents()
            for child, parent in zip(chain, chain[1:]):
                if child.name().startswith("ray::") or child.cmdline()[0].startswith("ray::"):
                    if any(socket_name in arg for arg in parent.cmdline()):
                        workers[child.pid] = (child, rank)
                    break
        except (psutil.NoSuchProcess, IndexError):
            pass
    doomed, killed = [], {"workers": len(workers), "ranks": [], "processes": []}
    for worker, rank in workers.values():
        doomed += [worker, *worker.children(recursive=True)]
        killed["ranks"].append(rank.environ()["INFRARSI_METRICS_FILE"])
    for proc in reversed(doomed):  # the ranks first: torchrun's death would take them along
        try:
            name = " ".join(proc.cmdline())[:300]
            proc.kill()
            killed["processes"].append(name)
        except psutil.NoSuchProcess:
            pass
    cluster.remove_node(node, allow_graceful=False)
    return killed


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
        # 2. A node lost mid-trial: once both nodes' ranks run, kill the worker node's share
        # of the trial and remove the node, then bring up a replacement so the retry can be
        # placed. (The head holds the driver and
        # the trial's coordinator; a real campaign loses worker nodes the same way.)
        say("t1 done")
        pool.submit(request(out_dir, "t2", NUM_STEPS_LONG))
        report["ranks_running_at_kill"] = wait_until_ranks_run(out_dir / "t2", num_nodes=2, timeout_s=90)
        report["killed_node_id"] = worker.node_id
        report["killed"] = kill_node(cluster, worker, out_dir / "t2")
        say(f"killed {report['killed']}")
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
