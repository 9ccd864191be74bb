"""Multi-node trials on Ray: one placement group per trial, one bundle per node.

A ``PlacementTrialActor`` (one per trial slot, no resources of its own) runs a trial as:
reserve a placement group of ``nodes_per_trial`` bundles (each ``gpus_per_trial`` GPUs and
``cpus_per_trial`` CPUs, STRICT_SPREAD or PACK as the spec says), waiting at most
``placement_timeout_s`` and removing the group when it cannot be placed (Ray would keep an
infeasible group pending forever); start one node actor in each bundle; pick the
rendezvous endpoint (address and a free port) on the first bundle's node; run every
node's torchrun line through ``infrarsi.harness.launcher.run_process_trial`` at once; merge the
node results (``infrarsi.harness.multinode``). When a node's actor dies mid-trial (its node was
lost), the other nodes' trial processes are killed, the attempt is returned as a crash
marked ``actor_died`` with the lost node, and the pool retries the trial once on a fresh
placement group. The group is removed at the end of every attempt.
"""

from __future__ import annotations

import socket
import time
from typing import Any

from infrarsi.core.trial import Outcome, TrialResult
from infrarsi.harness.launcher import TrialRequest, run_process_trial
from infrarsi.harness.multinode import NodeLayout, merge_node_results, node_request

__all__ = ["PlacementTrialActor", "PlacementSettings"]


class _NodeActor:
    """Runs one node's share of a trial; ``cancel`` may be called while ``run`` runs."""

    def rendezvous_endpoint(self) -> str:
        import ray

        host = ray.util.get_node_ip_address()
        with socket.socket() as sock:  # a port free on this node now; torchrun binds it next
            sock.bind((host, 0))
            port = sock.getsockname()[1]
        return f"{host}:{port}"

    def node_id(self) -> str:
        import ray

        return ray.get_runtime_context().get_node_id()

    def run(self, req: TrialRequest) -> TrialResult:
        return run_process_trial(req)

    def cancel(self) -> int:
        """Kill the trial's whole process tree: the launcher starts the job in a session of
        its own and torchrun starts each worker in another, so every descendant is signalled,
        not just the job's process group."""
        import psutil

        doomed = psutil.Process().children(recursive=True)
        for proc in doomed:
            try:
                proc.kill()
            except psutil.NoSuchProcess:
                pass
        return len(doomed)


class PlacementSettings:
    """What a placement trial needs from the spec's resources section."""

    def __init__(self, *, layout: NodeLayout, strategy: str, timeout_s: float, node_resources: dict[str, float],
                 max_attempts: int) -> None:
        self.layout, self.strategy, self.timeout_s = layout, strategy, timeout_s
        self.node_resources, self.max_attempts = dict(node_resources), max_attempts

    @property
    def bundle(self) -> dict[str, float]:
        bundle = {"CPU": self.layout.cpus_per_node, **self.node_resources}
        if self.layout.gpus_per_node:
            bundle["GPU"] = self.layout.gpus_per_node
        return bundle


class PlacementTrialActor:
    """Runs multi-node trials, one at a time (see the module docstring)."""

    def __init__(self, settings: PlacementSettings) -> None:
        self.settings = settings

    def run(self, req: TrialRequest) -> TrialResult:
        import ray
        from ray.util.placement_group import placement_group, remove_placement_group

        s = self.settings
        self._started_s = time.monotonic()
        group = placement_group([s.bundle] * s.layout.num_nodes, strategy=s.strategy,
                                name=f"infrarsi-{req.trial_id}-a{req.attempt}")
        try:
            ready, _ = ray.wait([group.ready()], timeout=s.timeout_s)
            if not ready:
                return self._failed(req, f"the placement group of {s.layout.num_nodes} x {s.bundle} "
                                         f"({s.strategy}) could not be placed within {s.timeout_s:.0f} s; removed. "
                                         "Add nodes, lower resources.nodes_per_trial or raise "
                                         "resources.placement_timeout_s", placement_timeout=True)
            return self._run_placed(req, group)
        finally:
            remove_placement_group(group)

    def _run_placed(self, req: TrialRequest, group: Any) -> TrialResult:
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        s = self.settings
        resources = {k: v for k, v in s.bundle.items() if k not in ("CPU", "GPU")}
        actors = [ray.remote(_NodeActor).options(
            num_cpus=s.layout.cpus_per_node, num_gpus=s.layout.gpus_per_node, resources=resources,
            max_concurrency=2, max_restarts=0,
            scheduling_strategy=PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=i)).remote()
            for i in range(s.layout.num_nodes)]
        try:
            try:
                endpoint = ray.get(actors[0].rendezvous_endpoint.remote())
                node_ids = ray.get([a.node_id.remote() for a in actors])
            except ray.exceptions.RayActorError as exc:
                return self._failed(req, f"a node was lost before the trial started: {type(exc).__name__}",
                                    actor_died=True)
            refs = [a.run.remote(node_request(req, node_index=i, layout=s.layout, rdzv_endpoint=endpoint))
                    for i, a in enumerate(actors)]
            results: dict[int, TrialResult] = {}
            pending = list(refs)
            while pending:
                done, pending = ray.wait(pending, num_returns=1)
                index = refs.index(done[0])
                try:
                    results[index] = ray.get(done[0])
                except ray.exceptions.RayActorError as exc:
                    return self._node_lost(req, index, node_ids[index], exc, actors, refs, results)
            merged = merge_node_results(req, [results[i] for i in range(len(refs))])
            return merged.replace(extra={**merged.extra, "node_ids": node_ids, "rdzv_endpoint": endpoint,
                                         "coordinator_node_id": ray.get_runtime_context().get_node_id()})
        finally:
            for actor in actors:
                ray.kill(actor)

    def _node_lost(self, req: TrialRequest, index: int, node_id: str, exc: Exception, actors: list,
                   refs: list, results: dict) -> TrialResult:
        """Stop the surviving nodes' processes (their peers are gone) and report the attempt."""
        import ray

        for i, actor in enumerate(actors):
            if i != index and i not in results:
                try:
                    ray.get(actor.cancel.remote(), timeout=30)
                except (ray.exceptions.RayError, TimeoutError):
                    pass
        for i, ref in enumerate(refs):
            if i != index and i not in results:
                try:
                    results[i] = ray.get(ref, timeout=60)
                except (ray.exceptions.RayError, TimeoutError):
                    pass
        return self._failed(req, f"node {index} ({node_id[:12]}) was lost mid-trial: {type(exc).__name__}",
                            actor_died=True, lost_node=index, lost_node_id=node_id,
                            nodes=[{"node": i, "outcome": r.outcome.value, "log_path": r.log_path}
                                   for i, r in sorted(results.items())])

    def _failed(self, req: TrialRequest, reason: str, **extra: Any) -> TrialResult:
        retry = bool(extra.get("actor_died")) and req.attempt < self.settings.max_attempts
        wall_s = time.monotonic() - self._started_s
        return TrialResult(trial_id=req.trial_id, config=dict(req.config), role=req.role, attempt=req.attempt,
                           outcome=Outcome.CRASH, reason=reason, memory_capacity_bytes=req.memory_capacity_bytes,
                           wall_time_s=wall_s, device_seconds=wall_s * req.devices_per_trial,
                           extra={**extra, "retried": retry} if extra.get("actor_died") else extra)
