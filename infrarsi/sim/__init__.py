"""The cluster simulator: a calibrated cost model of transformer training on GPU
clusters (time, memory, crashes, noise), an exact oracle, and the trial function
(``trial.run_sim_trial``) that ``infrarsi.backends.SimBackend`` runs.
Formulas and their sources: docs/simulator.md."""

from infrarsi.sim.backend import SimOutcome, sim_workload, simulate_trial
from infrarsi.sim.cost import Estimate, estimate
from infrarsi.sim.hardware import Hardware, hardware, hardware_names
from infrarsi.sim.job import Job
from infrarsi.sim.models import ModelShape, model_shape, model_shape_names
from infrarsi.sim.oracle import OracleResult, oracle
from infrarsi.sim.workload import Workload
from infrarsi.sim.workloads import BENCHMARK_WORKLOADS, HELD_OUT_WORKLOADS, workload, workload_names

__all__ = [
    "BENCHMARK_WORKLOADS", "HELD_OUT_WORKLOADS", "Estimate", "Hardware", "Job", "ModelShape", "OracleResult", "SimOutcome",
    "Workload", "estimate", "hardware", "hardware_names", "model_shape", "model_shape_names", "oracle",
    "sim_workload", "simulate_trial", "workload", "workload_names",
]
