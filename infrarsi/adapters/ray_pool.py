"""Trial slots as Ray actors, each pinned to the devices one trial needs and running the trial
function the pool is given (the campaign backend's, ``infrarsi.backends``).

Ray's resource scheduler does the pinning: an actor that asks for ``num_gpus=g`` runs
with ``CUDA_VISIBLE_DEVICES`` set to its GPUs, and the trial process it launches inherits
that. An actor that dies mid-trial (its node lost, the process killed) is replaced and
the trial is retried once on the fresh actor; both attempts are returned so both are
recorded. An actor lost on the retry too, or a lost connection to Ray, is a fault of the
infrastructure, not a result of the config: ``TrialInfrastructureError``, which the
campaign's stage task retries on a fresh pool. A trial that spans nodes
(``nodes_per_trial > 1``) runs on a placement group instead
(``infrarsi.adapters.ray_placement``); a node lost mid-trial is retried the same way.

``probe_ray_address`` checks a cluster's address answers before ``ray.init`` would spend
well over a minute retrying one that does not.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import socket
import threading
from dataclasses import dataclass
from typing import Any, Callable

from infrarsi.core.errors import TrialInfrastructureError, UnreachableError
from infrarsi.core.trial import Outcome, TrialResult
from infrarsi.harness.launcher import TrialRequest, run_process_trial

MAX_ATTEMPTS = 2
PROBE_TIMEOUT_S = 5.0


class _TrialActor:
    """One trial slot: runs the pool's trial function (sent by name: a module-level function)."""

    def __init__(self, run_trial: Callable[[TrialRequest], TrialResult]) -> None:
        self._run_trial = run_trial

    def run(self, req: TrialRequest) -> TrialResult:
        return self._run_trial(req)


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


def probe_ray_address(address: str | None, timeout_s: float = PROBE_TIMEOUT_S) -> None:
    """Raise ``UnreachableError`` unless something listens at ``address`` (``host:port``
    of a cluster's GCS, or ``ray://host:port``), within ``timeout_s``. None (a private
    local Ray) and ``auto`` (Ray looks the cluster up) are not probed."""
    if address is None or address == "auto":
        return
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        raise UnreachableError(f"--ray-address {address!r}: expected host:port (a Ray cluster's GCS address, "
                               "as `ray start --head` prints it), ray://host:port, or auto")
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except OSError as exc:
        raise UnreachableError(
            f"no Ray cluster answers at {address} ({type(exc).__name__}: {exc}): start it (`ray start --head "
            f"--port {port}` on {host}), or pass the address `ray status` shows there with --ray-address; "
            "without --ray-address the campaign runs on a private local Ray") from None


def ensure_ray(address: str | None) -> Any:
    """Ray, initialised once: a private local Ray for None, else the cluster at ``address``.

    Token authentication is Ray's own choice: a private local Ray runs without it unless
    ``RAY_AUTH_MODE`` says otherwise (no one else can reach it), and a cluster is joined
    with token auth only where the user set ``RAY_AUTH_MODE=token`` (with the cluster's
    token), as ``ray.init`` does for an explicit address."""
    import ray

    if not ray.is_initialized():
        if address is None:
            os.environ.setdefault("RAY_AUTH_MODE", "disabled")
        probe_ray_address(address)
        # "local" always starts a private Ray: with None, Ray would join whatever cluster a
        # `ray start` on this machine last announced in /tmp/ray, someone else's included.
        # ray.init (in the main thread) replaces the process's SIGTERM handler with one that
        # exits at once; the process's owner (the infrarsi command) keeps its own.
        owner = signal.getsignal(signal.SIGTERM) if threading.current_thread() is threading.main_thread() else None
        try:
            ray.init(address=address or "local", include_dashboard=False, logging_level=logging.WARNING,
                     log_to_driver=False, configure_logging=False)
        except (ConnectionError, ray.exceptions.AuthenticationError) as exc:
            raise UnreachableError(f"could not join the Ray cluster at {address}: {exc}; check --ray-address "
                                   "(and RAY_AUTH_MODE / RAY_AUTH_TOKEN if the cluster uses token auth)") from None
        finally:
            if owner is not None:
                signal.signal(signal.SIGTERM, owner)
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
    """Trial slots as Ray actors, each running ``run_trial`` (a multi-node trial is always a
    process trial: ``ray_placement`` launches it on every node)."""

    def __init__(self, settings: PoolSettings,
                 run_trial: Callable[[TrialRequest], TrialResult] = run_process_trial) -> None:
        self.ray = ensure_ray(settings.address)
        self.settings = settings
        self.num_slots = settings.concurrency or device_slots(settings)
        if settings.nodes_per_trial > 1:
            self._cls, self._args = _placement_actor(self.ray, settings)
        else:
            self._cls, self._args = self.ray.remote(_TrialActor).options(
                num_gpus=settings.gpus_per_trial, num_cpus=min(settings.cpus_per_trial, self._max_cpus()),
                max_restarts=0), (run_trial,)
        self._idle = [self._cls.remote(*self._args) for _ in range(self.num_slots)]
        self._inflight: dict[Any, tuple[Any, TrialRequest]] = {}
        self._actors_lost: dict[str, int] = {}  # trial id -> actors lost running it

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
        """Results of trials that finished (at least one unless the timeout passed).
        Raises ``TrialInfrastructureError`` when a trial's retry lost its actor too, or
        Ray itself stopped answering."""
        if not self._inflight:
            return []
        lost_ray = (self.ray.exceptions.RaySystemError, self.ray.exceptions.RpcError)
        try:
            done, _ = self.ray.wait(list(self._inflight), num_returns=1, timeout=timeout_s)
        except lost_ray as exc:
            raise TrialInfrastructureError(f"lost the connection to Ray while trials ran: {exc}") from exc
        out = []
        for ref in done:
            actor, req = self._inflight.pop(ref)
            try:
                result = self.ray.get(ref)
            except self.ray.exceptions.RayActorError as exc:
                self._actors_lost[req.trial_id] = self._actors_lost.get(req.trial_id, 0) + 1
                if self._actors_lost[req.trial_id] >= MAX_ATTEMPTS:
                    raise TrialInfrastructureError(
                        f"trial {req.trial_id} lost its Ray actor {MAX_ATTEMPTS} times ({type(exc).__name__}): "
                        "the trial slots are not trustworthy") from exc
                out.append(self._actor_died(req, exc))
                continue
            except lost_ray as exc:
                raise TrialInfrastructureError(f"lost the connection to Ray while trial {req.trial_id} "
                                               f"ran: {exc}") from exc
            out.append(result)
            if result.extra.get("actor_died") and result.extra.get("retried"):
                # A node of a multi-node trial was lost; its slot's actor is alive.
                again = dataclasses.replace(req, attempt=req.attempt + 1)
                self._inflight[actor.run.remote(again)] = (actor, again)
            else:
                self._idle.append(actor)
        return out

    def _actor_died(self, req: TrialRequest, exc: Exception) -> TrialResult:
        """The lost attempt's record (superseded); the trial runs again on a fresh actor."""
        fresh = self._cls.remote(*self._args)
        record = TrialResult(trial_id=req.trial_id, config=dict(req.config), role=req.role, attempt=req.attempt,
                             outcome=Outcome.CRASH, reason=f"the Ray actor died mid-trial: {type(exc).__name__}",
                             extra={"actor_died": True, "retried": True})
        again = dataclasses.replace(req, attempt=req.attempt + 1)
        self._inflight[fresh.run.remote(again)] = (fresh, again)
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
