"""Trial slots as Ray actors, each pinned to the devices one trial needs.

Ray's resource scheduler does the pinning: an actor that asks for ``num_gpus=g`` runs
with ``CUDA_VISIBLE_DEVICES`` set to its GPUs, and the trial process it launches inherits
that. An actor that dies mid-trial (its node lost, the process killed) is replaced and
the trial is retried once on the fresh actor; both attempts are returned so both are
recorded. A trial that spans nodes (``nodes_per_trial > 1``) runs on a placement group
instead (``infrarsi.adapters.ray_placement``); a node lost mid-trial is retried the same way.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from dataclasses import dataclass
from typing import Any

from infrarsi.core.trial import Outcome, TrialResult
from infrarsi.harness.launcher import TrialRequest

MAX_ATTEMPTS = 2


def run_trial(req: TrialRequest) -> TrialResult:
    """Dispatch one trial to its backend; runs inside the actor."""
    if req.backend == "sim":
        from infrarsi.sim.trial import run_sim_trial

        return run_sim_trial(req)
    from infrarsi.harness.launcher import run_process_trial

    return run_process_trial(req)


class _TrialActor:
    def run(self, req: TrialRequest) -> TrialResult:
        return run_trial(req)


@dataclass(frozen=True, kw_only=True)
class PoolSettings:
    address: str | None = None  # None: a local Ray on this machine
    gpus_per_trial: int = 0
    cpus_per_trial: float = 1.0
    concurrency: int | None = None
    # Multi-node trials: gpus_per_trial and cpus_per_trial are then per node.
    nodes_per_trial: int = 1
    processes_per_node: int | None = None
    placement_strategy: str = "STRICT_SPREAD"
    placement_timeout_s: float = 60.0
    node_resources: dict[str, float] = dataclasses.field(default_factory=dict)


def ensure_ray(address: str | None) -> Any:
    import ray

    if not ray.is_initialized():
        os.environ.setdefault("RAY_AUTH_MODE", "disabled" if address is None else "token")
        # "local" always starts a private Ray: with None, Ray would join whatever cluster a
        # `ray start` on this machine last announced in /tmp/ray, someone else's included.
        ray.init(address=address or "local", include_dashboard=False, logging_level=logging.WARNING,
                 log_to_driver=False, configure_logging=False)
    return ray


def device_slots(settings: PoolSettings) -> int:
    """Independent device slots: GPUs per trial slots, or one CPU device."""
    ray = ensure_ray(settings.address)
    resources = ray.cluster_resources()
    if settings.nodes_per_trial > 1:
        return 1  # a trial holds several nodes: one at a time unless the spec says otherwise
    if settings.gpus_per_trial:
        return max(1, int(resources.get("GPU", 0) // settings.gpus_per_trial))
    # On CPU the machine is one device: concurrent trials would share cores and disturb timing.
    return 1


def _placement_actor(ray: Any, settings: PoolSettings) -> tuple[Any, tuple]:
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from infrarsi.adapters.ray_placement import PlacementSettings, PlacementTrialActor
    from infrarsi.harness.multinode import NodeLayout

    layout = NodeLayout(num_nodes=settings.nodes_per_trial, processes_per_node=settings.processes_per_node,
                        gpus_per_node=settings.gpus_per_trial, cpus_per_node=settings.cpus_per_trial)
    placement = PlacementSettings(layout=layout, strategy=settings.placement_strategy,
                                  timeout_s=settings.placement_timeout_s, node_resources=settings.node_resources,
                                  max_attempts=MAX_ATTEMPTS)
    # The coordinator holds no resources and lives on the driver's node, so losing a trial
    # node does not take it down (the campaign would not survive its own node anyway); its
    # node actors die with it if it goes.
    here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
    cls = ray.remote(PlacementTrialActor).options(num_cpus=0, max_restarts=0, scheduling_strategy=here)
    return cls, (placement,)


class TrialPool:
    def __init__(self, settings: PoolSettings) -> None:
        self.ray = ensure_ray(settings.address)
        self.settings = settings
        self.num_slots = settings.concurrency or device_slots(settings)
        if settings.nodes_per_trial > 1:
            self._cls, self._args = _placement_actor(self.ray, settings)
        else:
            self._cls, self._args = self.ray.remote(_TrialActor).options(
                num_gpus=settings.gpus_per_trial, num_cpus=min(settings.cpus_per_trial, self._max_cpus()),
                max_restarts=0), ()
        self._idle = [self._cls.remote(*self._args) for _ in range(self.num_slots)]
        self._inflight: dict[Any, tuple[Any, TrialRequest]] = {}

    def _max_cpus(self) -> float:
        return float(self.ray.cluster_resources().get("CPU", 1))

    @property
    def free_slots(self) -> int:
        return len(self._idle)

    @property
    def busy(self) -> bool:
        return bool(self._inflight)

    def submit(self, req: TrialRequest) -> None:
        assert self._idle, "submit() needs a free slot"
        actor = self._idle.pop()
        self._inflight[actor.run.remote(req)] = (actor, req)

    def wait(self, timeout_s: float | None = None) -> list[TrialResult]:
        """Results of trials that finished (at least one unless the timeout passed)."""
        if not self._inflight:
            return []
        done, _ = self.ray.wait(list(self._inflight), num_returns=1, timeout=timeout_s)
        out = []
        for ref in done:
            actor, req = self._inflight.pop(ref)
            try:
                result = self.ray.get(ref)
            except self.ray.exceptions.RayActorError as exc:
                out.append(self._actor_died(req, exc))
                continue
            out.append(result)
            if result.extra.get("actor_died") and result.extra.get("retried"):
                # A node of a multi-node trial was lost; its slot's actor is alive.
                again = dataclasses.replace(req, attempt=req.attempt + 1)
                self._inflight[actor.run.remote(again)] = (actor, again)
            else:
                self._idle.append(actor)
        return out

    def _actor_died(self, req: TrialRequest, exc: Exception) -> TrialResult:
        fresh = self._cls.remote(*self._args)
        retry = req.attempt < MAX_ATTEMPTS
        record = TrialResult(trial_id=req.trial_id, config=dict(req.config), role=req.role, attempt=req.attempt,
                             outcome=Outcome.CRASH, reason=f"the Ray actor died mid-trial: {type(exc).__name__}",
                             extra={"actor_died": True, "retried": retry})
        if retry:
            again = dataclasses.replace(req, attempt=req.attempt + 1)
            self._inflight[fresh.run.remote(again)] = (fresh, again)
        else:
            self._idle.append(fresh)
        return record

    def run_one(self, req: TrialRequest) -> list[TrialResult]:
        """Run one trial to its end (retry included); every attempt's record, last is final."""
        self.submit(req)
        out: list[TrialResult] = []
        while self._inflight:
            out += self.wait()
        return out

    def close(self) -> None:
        for actor, _ in self._inflight.values():
            self.ray.kill(actor)
        for actor in self._idle:
            self.ray.kill(actor)
        self._idle, self._inflight = [], {}
