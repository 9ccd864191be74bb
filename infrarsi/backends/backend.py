"""Where a campaign's trials run: ``process`` launches the real job, ``sim`` asks the cluster
simulator. The one place that knows the two apart; everything else asks the campaign's
backend (``backend_of(spec)``) what it needs:

- ``spec_data``: the spec's fields as written, with what the backend supplies itself (a
  simulated workload's knobs, baseline, contract numbers and capacity);
- ``runs_code``: whether there is a job to lock, patch and check numbers of (a workload
  folder, a command, locked and editable files, code patches, numerics classes);
- ``trials_on_cpu``: whether its trials are real processes without an accelerator;
- ``known_features``: the hardware and workload the bank compares, where the spec alone
  says them (the simulated cluster's);
- ``run_trial``: its trial function, which every trial slot runs;
- ``pool``: the trial slots its trials need (Ray actors pinned to the spec's resources, or
  one slot in this process).
"""

from __future__ import annotations

from abc import ABC
from typing import Any, Callable, ClassVar, Mapping, Protocol

from infrarsi.adapters.ray_pool import PoolSettings, TrialPool
from infrarsi.core.errors import SpecError
from infrarsi.core.spec import CampaignSpec
from infrarsi.core.trial import TrialResult
from infrarsi.harness.launcher import TrialRequest, run_process_trial

__all__ = ["Backend", "Pool", "ProcessBackend", "SimBackend", "backend_of", "sim_features"]

TrialFunction = Callable[[TrialRequest], TrialResult]


class Pool(Protocol):
    """Trial slots: the Ray pool (``adapters.ray_pool.TrialPool``) and the in-process one
    (``harness.inprocess_pool.InProcessPool``) both."""

    num_slots: int

    @property
    def free_slots(self) -> int: ...

    @property
    def busy(self) -> bool: ...

    def submit(self, req: TrialRequest) -> None: ...

    def wait(self, timeout_s: float | None = None) -> list[TrialResult]: ...

    def run_one(self, req: TrialRequest) -> list[TrialResult]: ...

    def close(self) -> None: ...


class Backend(ABC):
    name: ClassVar[str]
    runs_code: ClassVar[bool]
    # A module-level function, so Ray sends it to the actors by name.
    run_trial: ClassVar[TrialFunction]

    def spec_data(self, data: Mapping[str, Any], source: str) -> dict[str, Any]:
        """The spec's fields before validation: ``data``, over what this backend supplies."""
        return dict(data)

    def trials_on_cpu(self, spec: CampaignSpec) -> bool:
        """Trials run real processes without an accelerator."""
        return False

    def known_features(self, spec: CampaignSpec) -> tuple[dict, dict] | None:
        """(hardware, workload) features from the spec alone; None: the machine and the
        trials say them (``infrarsi.bank.campaign.campaign_features``)."""
        return None

    def pool(self, spec: CampaignSpec, *, address: str | None, concurrency: int | None, in_process: bool) -> Pool:
        """Trial slots for this backend's trials: one in this process (``in_process``), else
        Ray actors holding the spec's resources per trial, at the Ray cluster ``address``
        (None: a private local Ray), ``concurrency`` of them (None: the spec's, else the
        device slots)."""
        if in_process:
            from infrarsi.harness.inprocess_pool import InProcessPool

            return InProcessPool(type(self).run_trial)
        res = spec.resources
        return TrialPool(PoolSettings(address=address, gpus_per_trial=res.gpus_per_trial,
                                      cpus_per_trial=res.cpus_per_trial, concurrency=concurrency or res.concurrency,
                                      nodes_per_trial=res.nodes_per_trial, processes_per_node=res.processes_per_node,
                                      placement_strategy=res.placement_strategy,
                                      placement_timeout_s=res.placement_timeout_s,
                                      node_resources=dict(res.node_resources)), type(self).run_trial)


class ProcessBackend(Backend):
    """The real job, launched and watched by the harness (``harness.launcher``)."""

    name = "process"
    runs_code = True
    run_trial = staticmethod(run_process_trial)

    def trials_on_cpu(self, spec: CampaignSpec) -> bool:
        return spec.resources.gpus_per_trial == 0


def run_sim_trial(req: TrialRequest) -> TrialResult:
    """``infrarsi.sim.trial.run_sim_trial``, imported when a trial runs: a process campaign
    never loads the simulator."""
    from infrarsi.sim.trial import run_sim_trial as run

    return run(req)


class SimBackend(Backend):
    """A simulated cluster job (``infrarsi.sim``): no code, simulated times and memory."""

    name = "sim"
    runs_code = False
    run_trial = staticmethod(run_sim_trial)

    def spec_data(self, data: Mapping[str, Any], source: str) -> dict[str, Any]:
        """The simulator workload's knobs, constraints, baseline, contract numbers and
        capacity, under the fields the spec gives itself (tables merged key by key)."""
        name = data.get("sim_workload")
        if not isinstance(name, str):
            return dict(data)  # validation names the missing field
        from infrarsi.sim.spec_defaults import sim_spec_defaults
        from infrarsi.sim.workloads import workload_names

        if name not in workload_names():
            raise SpecError(f"{source}: sim_workload {name!r} is unknown; choose one of {workload_names()}")
        merged = sim_spec_defaults(name)
        for key, value in data.items():
            if isinstance(value, dict) and isinstance(merged.get(key), dict):
                merged[key] = {**merged[key], **value}
            else:
                merged[key] = value
        return merged

    def known_features(self, spec: CampaignSpec) -> tuple[dict, dict] | None:
        assert spec.sim_workload, "a sim spec names its workload"
        return sim_features(spec.sim_workload)


def sim_features(workload_name: str) -> tuple[dict, dict]:
    """(hardware, workload) features of a simulator workload, in the bank's terms."""
    from infrarsi.sim import sim_workload

    job = sim_workload(workload_name).job
    hw = {"gpu": job.hw.name, "num_devices": job.num_gpus, "memory_bytes": job.hw.memory_bytes, "cpu": None}
    wl = {"num_params": job.model.num_params, "num_layers": job.model.num_layers, "seq_len": job.seq_len,
          "moe": job.model.is_moe, "tokens_per_step": job.tokens_per_step}
    return hw, wl


_BACKENDS: dict[str, Backend] = {b.name: b for b in (ProcessBackend(), SimBackend())}


def backend_named(name: Any) -> Backend | None:
    """The backend called ``name`` (a spec's ``backend`` field as written); None for none."""
    return _BACKENDS.get(name) if isinstance(name, str) else None


def backend_of(spec: CampaignSpec) -> Backend:
    """The backend a validated spec names."""
    return _BACKENDS[spec.backend]
