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
    from infrarsi.core.trial import Role
    from infrarsi.harness.launcher import TrialRequest

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


def _actor_worker(rank):
    """The ``ray::`` worker above a trial rank (its node actor's process), the trial's
    processes below that worker (the rank, its torchrun) and the worker's parent."""
    chain = [rank, *rank.parents()]
    for i, proc in enumerate(chain[1:-1], start=1):
        if proc.name().startswith("ray::") or proc.cmdline()[0].startswith("ray::"):
            return proc, chain[:i], chain[i + 1]
    return None, [], None


def lose_node(cluster, node, trial_dir: Path) -> dict:
    """What losing a machine does to the trial. The Ray worker that hosts the trial's node
    actor on ``node`` dies (SIGKILL) and the node leaves the cluster, while the trial's
    processes on it are frozen (SIGSTOP): as on a machine that vanished, their connections
    go silent instead of being reset, so the surviving node's rank waits on its collective
    until the harness cancels it. (Killed on one machine, the lost rank's sockets would be
    reset and the survivor would die by itself, cancel or not. ``Cluster.remove_node``
    alone kills neither the node's workers nor the trial, which runs in sessions of its
    own.) The actor's worker is found from the trial's ranks: their ancestor named
    ``ray::`` whose parent is this node's raylet (its command line names the node's raylet
    socket); the other ranks and their torchrun are the survivors. Returns what it did,
    with the frozen and the surviving processes (psutil) under ``frozen`` and ``survivors``."""
    import psutil

    socket_name = node._raylet_socket_name
    workers, survivors = {}, []
    for rank in trial_ranks(trial_dir):
        try:
            worker, trial_procs, raylet = _actor_worker(rank)
            if worker is None:
                continue
            if any(socket_name in arg for arg in raylet.cmdline()):
                workers[worker.pid] = (worker, rank)
            else:
                survivors += trial_procs
        except (psutil.NoSuchProcess, IndexError):
            pass
    loss = {"workers": len(workers), "ranks": [], "killed": [], "frozen": [], "survivors": survivors}
    for worker, rank in workers.values():
        loss["ranks"].append(rank.environ()["INFRARSI_METRICS_FILE"])
        for proc in reversed([worker, *worker.children(recursive=True)]):  # the rank first
            try:
                name = " ".join(proc.cmdline())[:300]
                if proc is worker:
                    proc.kill()
                    loss["killed"].append(name)
                else:
                    proc.suspend()
                    loss["frozen"].append(proc)
            except psutil.NoSuchProcess:
                pass
    cluster.remove_node(node, allow_graceful=False)
    return loss


def _alive(proc) -> bool:
    import psutil

    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _kill(procs) -> None:
    import psutil

    for proc in procs:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass


def _names(procs) -> list[str]:
    import psutil

    names = []
    for proc in procs:
        try:
            names.append(" ".join(proc.cmdline())[:300])
        except psutil.Error:
            names.append(f"pid {proc.pid}")
    return names


def main(out_dir: Path) -> None:
    os.environ["RAY_TMPDIR"] = tempfile.mkdtemp(prefix="rmn", dir="/tmp")  # short: socket paths
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    import ray
    from ray.cluster_utils import Cluster

    from infrarsi.adapters.ray_pool import PoolSettings, TrialPool
    from infrarsi.core.ledger import Ledger

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
    frozen: list = []
    try:
        # 1. A whole trial over two nodes.
        for result in pool.run_one(request(out_dir, "t1")):
            ledger.append_trial(result)
        # 2. A node lost mid-trial: once both nodes' ranks run, lose the worker node (its
        # actor killed, its share of the trial frozen, the node removed), then bring up a
        # replacement so the retry can be placed. (The head holds the driver and the
        # trial's coordinator; a real campaign loses worker nodes the same way.)
        say("t1 done")
        pool.submit(request(out_dir, "t2", NUM_STEPS_LONG))
        report["ranks_running_at_kill"] = wait_until_ranks_run(out_dir / "t2", num_nodes=2, timeout_s=90)
        report["killed_node_id"] = worker.node_id
        loss = lose_node(cluster, worker, out_dir / "t2")
        frozen += loss.pop("frozen")
        survivors = loss.pop("survivors")
        report["killed"] = {**loss, "frozen": _names(frozen), "survivors": _names(survivors)}
        say(f"lost the worker node: {report['killed']}")
        report["replacement_node_id"] = cluster.add_node(**node).node_id
        attempts = pool.wait()  # the lost attempt; the pool has resubmitted the trial
        # Nothing but the harness's cancel could have stopped the survivors by now: their
        # peer is frozen, not dead.
        report["survivors_alive_after_lost_attempt"] = _names(p for p in survivors if _alive(p))
        _kill(frozen)  # the machine is gone for good
        while pool.busy:
            attempts += pool.wait()
        for result in attempts:
            ledger.append_trial(result)
    finally:
        _kill(frozen)  # never leave a stopped process behind
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
