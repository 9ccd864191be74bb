"""Trials that span nodes: each node's torchrun line, and one result from every node's.

A multi-node trial runs the job's torchrun command once per node, each through
``infrarsi.harness.launcher.run_process_trial``, with ``--standalone`` replaced by a c10d
rendezvous on the first node. The harness still owns the clock: the job writes its
metrics from global rank 0 only, so the node whose launcher received them supplies the
step times; memory is taken from every node (the trial's peak is the largest). Where the
nodes come from (a Ray placement group) is ``infrarsi.adapters.ray_placement``'s business.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from infrarsi.core.errors import SpecError
from infrarsi.core.trial import Outcome, TrialResult
from infrarsi.harness.launcher import TrialRequest

__all__ = ["NodeLayout", "merge_node_results", "node_argv", "node_request"]

# torchrun options that say where the rendezvous is; the harness sets them per node.
_SINGLE_NODE_OPTIONS = ("--standalone",)
_VALUED_OPTIONS = ("--nnodes", "--rdzv-conf", "--rdzv_conf", "--node-rank", "--node_rank", "--rdzv-backend", "--rdzv_backend",
                   "--rdzv-endpoint", "--rdzv_endpoint", "--rdzv-id", "--rdzv_id", "--master-addr",
                   "--master_addr", "--master-port", "--master_port")
_NPROC_OPTIONS = ("--nproc-per-node", "--nproc_per_node")
_FLAG_OPTIONS = ("--no-python", "--no_python", "--module", "-m", "--run-path", "--run_path")  # take no value
# Failures that say the trial's config did not work, in the order one is chosen to stand
# for the whole trial when several nodes failed.
_FAILURE_ORDER = (Outcome.CONTRACT_VIOLATION, Outcome.OOM, Outcome.INVALID, Outcome.TIMEOUT, Outcome.CRASH)


@dataclass(frozen=True, kw_only=True)
class NodeLayout:
    num_nodes: int
    processes_per_node: int | None  # None: keep the command's --nproc-per-node
    gpus_per_node: int
    cpus_per_node: float


def _torchrun_index(argv: Sequence[str]) -> int:
    """Index of the first torchrun option: after ``torchrun`` or ``-m torch.distributed.run``."""
    for i, token in enumerate(argv):
        if Path(token).name == "torchrun":
            return i + 1
        if token == "torch.distributed.run" and i > 0 and argv[i - 1] == "-m":
            return i + 1
    raise SpecError("a multi-node trial (resources.nodes_per_trial > 1) needs a torchrun command "
                    "(`torchrun ...` or `{python} -m torch.distributed.run ...`); found "
                    f"{' '.join(argv)[:200]!r}")


def node_argv(argv: Sequence[str], *, layout: NodeLayout, rdzv_endpoint: str, rdzv_id: str,
              hosts_store: bool) -> tuple[str, ...]:
    """``argv`` with its single-node rendezvous options replaced by a c10d rendezvous of
    ``layout.num_nodes`` nodes at ``rdzv_endpoint``. The node that ``hosts_store`` (the
    first) serves the rendezvous store: said outright, because torchrun's guess (does the
    endpoint name this machine?) fails on hosts that do not resolve their own address and
    on several nodes sharing one machine."""
    start = _torchrun_index(argv)
    options, rest = [], list(argv[start:])
    while rest and rest[0].startswith("-"):
        token = rest.pop(0)
        name = token.split("=", 1)[0]
        if token in _SINGLE_NODE_OPTIONS:
            continue
        if name in _VALUED_OPTIONS or (name in _NPROC_OPTIONS and layout.processes_per_node):
            if "=" not in token:
                rest.pop(0)
            continue
        options.append(token)
        if "=" not in token and name not in _FLAG_OPTIONS and rest and not rest[0].startswith("-"):
            options.append(rest.pop(0))
    rendezvous = ["--nnodes", str(layout.num_nodes), "--rdzv-backend", "c10d", "--rdzv-endpoint", rdzv_endpoint,
                  "--rdzv-id", rdzv_id, "--rdzv-conf", f"is_host={int(hosts_store)}"]
    if layout.processes_per_node:
        rendezvous += ["--nproc-per-node", str(layout.processes_per_node)]
    return (*argv[:start], *rendezvous, *options, *rest)


def node_request(req: TrialRequest, *, node_index: int, layout: NodeLayout, rdzv_endpoint: str) -> TrialRequest:
    """What node ``node_index`` runs: its torchrun line, its own folder under the trial's."""
    attempt_dir = req.trial_dir if req.attempt == 1 else f"{req.trial_dir}-a{req.attempt}"
    return dataclasses.replace(
        req, argv=node_argv(req.argv, layout=layout, rdzv_endpoint=rdzv_endpoint,
                            rdzv_id=f"{req.trial_id}-a{req.attempt}", hosts_store=node_index == 0),
        trial_dir=str(Path(attempt_dir) / f"node{node_index}"), attempt=1,
        devices_per_trial=layout.gpus_per_node or layout.cpus_per_node)


def _node_summary(index: int, result: TrialResult) -> dict:
    return {"node": index, "outcome": result.outcome.value, "reason": result.reason[:300],
            "peak_memory_bytes": result.peak_memory_bytes, "host_peak_rss_bytes": result.host_peak_rss_bytes,
            "returncode": result.extra.get("returncode"), "log_path": result.log_path,
            "has_rank0_metrics": bool(result.extra.get("start"))}


def _clean_exit(result: TrialResult) -> bool:
    """A node without rank 0 that exited 0: its launcher saw no steps, as it should."""
    return result.outcome in (Outcome.OK, Outcome.CRASH) and result.extra.get("returncode") == 0


def merge_node_results(req: TrialRequest, results: Sequence[TrialResult]) -> TrialResult:
    """One trial result from every node's: rank 0's clock and losses, the largest memory
    peak of any node, the first real failure of any node (by ``_FAILURE_ORDER``)."""
    clock = next((r for r in results if r.extra.get("start")), None)
    nodes = [_node_summary(i, r) for i, r in enumerate(results)]
    peaks = [r.peak_memory_bytes for r in results if r.peak_memory_bytes]
    host_peaks = [r.host_peak_rss_bytes for r in results if r.host_peak_rss_bytes]
    wall_s = max((r.wall_time_s for r in results), default=0.0)
    merged = (clock or results[0]).replace(
        trial_id=req.trial_id, attempt=req.attempt, config=dict(req.config), role=req.role,
        peak_memory_bytes=max(peaks, default=None), host_peak_rss_bytes=max(host_peaks, default=None),
        wall_time_s=wall_s, device_seconds=wall_s * req.devices_per_trial,
        extra={**(clock or results[0]).extra, "nodes": nodes})
    failed = [(i, r) for i, r in enumerate(results) if r is not clock and not _clean_exit(r)]
    if clock is not None and clock.outcome is not Outcome.OK:
        failed.insert(0, (results.index(clock), clock))
    if failed:
        i, worst = min(failed, key=lambda item: _FAILURE_ORDER.index(item[1].outcome))
        peak = merged.peak_memory_bytes
        if worst.outcome is Outcome.OOM:  # censored: at least the capacity
            peak = max(peak or 0, req.memory_capacity_bytes)
        return merged.replace(outcome=worst.outcome, reason=f"node {i}: {worst.reason}", step_time_s=None,
                              step_times_s=(), peak_memory_bytes=peak)
    if clock is None:
        return merged.replace(outcome=Outcome.CRASH, step_time_s=None, step_times_s=(),
                              reason="every node exited 0 but none reported rank 0's metrics")
    return merged
