"""The `process` trial backend: launch the real job, watch it, and say how it ended.

The harness owns the clock and the memory gauge. It launches the job without a shell
(knob values are argv entries or environment variables, never spliced into a string).
Reader threads read the job's stdout and stderr (teed to the trial's log.txt) and the
metrics FIFO named by ``$INFRARSI_METRICS_FILE`` as they are written, and stamp each
metrics line with the harness's monotonic clock when it arrives (``stamped_reader``);
with ``[metrics] source = "log"`` the log adapter turns the job's own output lines into
the events. A periodic sampler watches memory: on a trial with GPUs the device memory of
every process in the job's tree (``device_memory``), on CPU their resident sets against
the emulated capacity; it kills the whole tree (its own session) when the capacity or
the timeout is crossed.
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping

import psutil

from infrarsi.core.files import sha256_file
from infrarsi.core.knobs import Config
from infrarsi.core.spec_metrics import MetricsSpec
from infrarsi.core.trial import Outcome, Role, TrialResult, is_out_of_memory
from infrarsi.harness.device_memory import DeviceMemoryGauge, DeviceMemoryUnavailable, open_nvml_gauge
from infrarsi.harness.job_output import JobOutput
from infrarsi.harness.log_adapter import printed_unit
from infrarsi.harness.metrics_events import RecordedEvents
from infrarsi.harness.process_guard import parent_death_signal
from infrarsi.job.reporter import METRICS_FILE_ENV

# Memory, CPU and timeout sampling. Not the clock: lines are stamped by reader threads.
SAMPLE_INTERVAL_S = 0.02
TREE_REFRESH_S = 0.1
# How late a reader thread's stamp may be behind the job's write (its wake-up), per line.
STAMP_LATENCY_S = 0.002
GIL_SWITCH_INTERVAL_S = 1e-4
METRICS_ENV = METRICS_FILE_ENV
# Thread counts the job would inherit from the process that launches it: Ray sets
# OMP_NUM_THREADS in its workers (to the actor's CPUs). The job's own settings (the spec's
# env, a threads knob) must decide, not the pool.
_INHERITED_THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")


@dataclass(frozen=True, kw_only=True)
class TrialRequest:
    trial_id: str
    config: Config
    role: Role
    argv: tuple[str, ...]
    env: Mapping[str, str]
    cwd: str
    trial_dir: str
    memory_capacity_bytes: int
    emulate_capacity: bool
    timeout_s: float
    warmup_steps: int
    num_steps: int
    locked_hashes: Mapping[str, str] = field(default_factory=dict)
    devices_per_trial: float = 1.0
    attempt: int = 1
    sim_workload: str | None = None  # a simulated trial's workload (infrarsi.sim)
    seed: int = 0
    metrics: MetricsSpec = field(default_factory=MetricsSpec)
    gpus_per_trial: int = 0  # > 0: memory is measured on the trial's devices
    # Opens the device memory gauge for the trial's environment; None: NVML.
    device_gauge: Callable[[Mapping[str, str]], DeviceMemoryGauge] | None = None


def _tree(proc: psutil.Process) -> list[psutil.Process]:
    try:
        return [proc, *proc.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def _max_rss(procs: list[psutil.Process]) -> int:
    """Largest resident set among the tree's processes: each rank is one emulated device."""
    peak = 0
    for p in procs:
        try:
            peak = max(peak, p.memory_info().rss)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return peak


def _busy_cpu_seconds() -> float:
    t = psutil.cpu_times()
    return sum(t) - t.idle - getattr(t, "iowait", 0.0)


def foreign_load_cores(samples: list[tuple[float, float, float]], start: float, end: float) -> float:
    """Average CPU cores used by processes outside the trial's tree between two instants:
    another job on the machine contaminates a timing, so it is measured, not assumed."""
    inside = [s for s in samples if start <= s[0] <= end]
    if len(inside) < 2 or inside[-1][0] <= inside[0][0]:
        return 0.0
    (t0, busy0, own0), (t1, busy1, own1) = inside[0], inside[-1]
    return max(0.0, ((busy1 - busy0) - (own1 - own0)) / (t1 - t0))


def _kill_tree(proc: subprocess.Popen) -> None:
    """Kill the job's session and every descendant: torchrun starts each worker in a
    session of its own, which a signal to the job's process group would miss."""
    try:
        descendants = psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        descendants = []
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    for p in descendants:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass


def _tail(path: Path, num_chars: int = 4000) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(max(0, path.stat().st_size - num_chars))
            return f.read().decode(errors="replace")
    except OSError:
        return ""


@dataclass
class _Watch:
    peak_rss_bytes: int = 0
    device_peak_bytes: int = 0
    launched_at: float = 0.0  # monotonic
    killed_for: str | None = None
    returncode: int | None = None
    wall_time_s: float = 0.0
    cpu_seconds: float = 0.0
    # (monotonic time, machine-wide busy CPU seconds, the trial tree's CPU seconds) per sample
    cpu_samples: list[tuple[float, float, float]] = field(default_factory=list)


@dataclass
class _Memory:
    """Where a trial's memory is measured and against which capacity."""

    capacity_bytes: int
    gauge: DeviceMemoryGauge | None = None  # None: host RSS stands in for the device
    note: str = ""


def _memory(req: TrialRequest, env: Mapping[str, str]) -> _Memory:
    """A trial with GPUs is measured on its devices against their capacity, lowered to the
    spec's where the spec emulates a smaller device; on CPU the emulated capacity stands."""
    if req.gpus_per_trial <= 0:
        return _Memory(capacity_bytes=req.memory_capacity_bytes)
    try:
        gauge = (req.device_gauge or open_nvml_gauge)(env)
    except DeviceMemoryUnavailable as exc:
        return _Memory(capacity_bytes=req.memory_capacity_bytes,
                       note=f"device memory not measured ({exc}); host RSS and the job's own report stand in")
    device = gauge.capacity_bytes()
    capacity = min(device, req.memory_capacity_bytes) if req.emulate_capacity else device
    return _Memory(capacity_bytes=capacity, gauge=gauge)


def _watch(proc: subprocess.Popen, req: TrialRequest, memory: _Memory) -> _Watch:
    """Sample memory and CPU until the job ends; kill its tree above capacity or past the
    timeout. Sampling is periodic; it is not the clock (the stamped readers are)."""
    w = _Watch(launched_at=time.monotonic())
    t0 = w.launched_at
    root = psutil.Process(proc.pid)
    cpu_by_pid: dict[int, float] = {}
    procs: list[psutil.Process] = []
    listed_at = -TREE_REFRESH_S
    while True:
        now = time.monotonic()
        if now - listed_at >= TREE_REFRESH_S:  # finding the tree walks all of /proc: not every sample
            procs, listed_at = _tree(root), now
        w.peak_rss_bytes = max(w.peak_rss_bytes, _max_rss(procs))
        if memory.gauge is not None:
            w.device_peak_bytes = max(w.device_peak_bytes, memory.gauge.used_bytes([p.pid for p in procs]))
        for p in procs:
            try:
                t = p.cpu_times()
                cpu_by_pid[p.pid] = t.user + t.system
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                pass
        w.cpu_samples.append((now, _busy_cpu_seconds(), sum(cpu_by_pid.values())))
        if proc.poll() is not None:
            break
        held = w.device_peak_bytes if memory.gauge is not None else w.peak_rss_bytes
        if req.emulate_capacity and held > memory.capacity_bytes:
            w.killed_for = "oom"
        elif now - t0 > req.timeout_s:
            w.killed_for = "timeout"
        if w.killed_for:
            _kill_tree(proc)
            break
        time.sleep(SAMPLE_INTERVAL_S)
    w.returncode = proc.wait()
    w.wall_time_s = time.monotonic() - t0
    w.cpu_seconds = sum(cpu_by_pid.values())
    return w


_switching = {"lock": threading.Lock(), "trials": 0, "saved_s": 0.005}


def _fast_switching(on: bool) -> None:
    """While any trial of this process runs, a thread waiting for the GIL gets it within
    0.1 ms: the sampler holds it for milliseconds at a time (psutil walks /proc), and a
    reader woken by a line must not wait the default 5 ms switch interval to stamp it."""
    with _switching["lock"]:
        if on and _switching["trials"] == 0:
            _switching["saved_s"] = sys.getswitchinterval()
            sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
        _switching["trials"] += 1 if on else -1
        if not on and _switching["trials"] == 0:
            sys.setswitchinterval(_switching["saved_s"])


def _job_env(req: TrialRequest, fifo_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _INHERITED_THREAD_VARS}
    env.update(req.env)
    if req.metrics.source == "jsonl":
        env[METRICS_ENV] = str(fifo_path)
    else:
        env.pop(METRICS_ENV, None)
        env.setdefault("PYTHONUNBUFFERED", "1")  # a Python job's log lines leave it as they are printed
    return env


def run_process_trial(req: TrialRequest) -> TrialResult:
    # Every attempt keeps its own folder: a retry never overwrites the evidence of the first.
    trial_dir = Path(req.trial_dir if req.attempt == 1 else f"{req.trial_dir}-a{req.attempt}")
    trial_dir.mkdir(parents=True, exist_ok=True)
    log_path, fifo_path = trial_dir / "log.txt", trial_dir / "metrics.fifo"
    for stale in (fifo_path, trial_dir / "metrics.jsonl"):
        stale.unlink(missing_ok=True)
    base = dict(trial_id=req.trial_id, config=dict(req.config), role=req.role, attempt=req.attempt,
                memory_capacity_bytes=req.memory_capacity_bytes, log_path=str(log_path))
    changed = _changed(req)
    if changed:
        return TrialResult(**base, outcome=Outcome.CONTRACT_VIOLATION,
                           reason=f"locked files changed before the trial started: {changed}")
    env = _job_env(req, fifo_path)
    memory = _memory(req, env)
    base["memory_capacity_bytes"] = memory.capacity_bytes
    _fast_switching(True)
    try:
        with open(log_path, "wb") as log:
            log.write(f"$ {' '.join(req.argv)}\n".encode())
            log.flush()
            out = JobOutput(req.metrics, log, fifo_path, name=req.trial_id)
            try:
                # The job ends with the process that runs this trial (a Ray actor killed, a
                # campaign gone): SIGTERM, so that torchrun ends its workers too. The hook only
                # makes system calls (prctl, getppid): no lock another thread held at fork.
                proc = subprocess.Popen(list(req.argv), cwd=req.cwd, env=env, stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, start_new_session=True,
                                        preexec_fn=parent_death_signal(signal.SIGTERM))  # noqa: PLW1509
            except OSError as exc:
                out.readers.stop()
                return TrialResult(**base, outcome=Outcome.CRASH, reason=f"could not launch {req.argv[0]!r}: {exc}")
            try:
                out.attach(proc, time.monotonic())
                w = _watch(proc, req, memory)
            finally:
                _kill_tree(proc)  # nothing of the job outlives its trial, whatever happened here
                proc.wait()
                out.readers.stop()
                proc.stdout.close()
                proc.stderr.close()
    finally:
        _fast_switching(False)
        fifo_path.unlink(missing_ok=True)
        if memory.gauge is not None:
            memory.gauge.close()
    _write_events(trial_dir / "metrics.jsonl", out.recorded, w.launched_at)
    base.update(wall_time_s=w.wall_time_s, device_seconds=w.wall_time_s * req.devices_per_trial)
    return _classify(req, base, w, memory, out, _tail(log_path), _changed(req))


def _write_events(path: Path, recorded: RecordedEvents, launched_at: float) -> None:
    """The events as recorded (the trial's evidence), each with its arrival stamp: seconds since
    launch and the raw ``time.monotonic()`` (CLOCK_MONOTONIC, comparable across processes)."""
    with open(path, "w") as f:
        for event, stamp in zip(recorded.events, recorded.arrivals):
            f.write(json.dumps({**event, "harness_t_s": round(stamp - launched_at, 6),
                                "harness_monotonic_s": stamp}) + "\n")


def _changed(req: TrialRequest) -> list[str]:
    out = []
    for rel, digest in req.locked_hashes.items():
        path = Path(req.cwd) / rel
        if not path.is_file() or sha256_file(path) != digest:
            out.append(rel)
    return out


def _classify(req: TrialRequest, base: dict, w: _Watch, memory: _Memory, out: JobOutput, log_tail: str,
              changed: list[str]) -> TrialResult:
    recorded = out.recorded
    steps = recorded.steps()
    reported_peak = max((int(e.get("peak_memory_bytes") or 0) for e, _ in steps), default=0)
    held = w.device_peak_bytes if memory.gauge is not None else w.peak_rss_bytes
    peak = max(held, reported_peak)
    capacity = memory.capacity_bytes
    reported_times = [e.get("step_time_s") for e, _ in steps]
    extra = {"returncode": w.returncode, "harness_peak_rss_bytes": w.peak_rss_bytes,
             "reported_peak_memory_bytes": reported_peak, "start": recorded.start(), "cpu_seconds": w.cpu_seconds,
             "reported_step_times_s": ([float(t) for t in reported_times]
                                       if all(isinstance(t, (int, float)) for t in reported_times) else []),
             "metrics_source": req.metrics.source, "num_metric_events": len(recorded.events),
             "num_steps_reported": len(steps),
             "memory_gauge": "device" if memory.gauge is not None else "host_rss"}
    if memory.gauge is not None:
        extra["device_peak_bytes"] = w.device_peak_bytes
    if memory.note:
        extra["memory_note"] = memory.note
    base.update(peak_memory_bytes=peak or None, extra=extra, host_peak_rss_bytes=w.peak_rss_bytes or None,
                losses=tuple(float(e["loss"]) for e, _ in steps if "loss" in e),
                loss_quantum=printed_unit([e.get("loss_quantum") for e, _ in steps]),
                eval_loss_quantum=printed_unit([e.get("eval_loss_quantum") for e in recorded.events
                                                if e.get("event") == "eval"]),
                eval_losses=tuple(float(e["eval_loss"]) for e in recorded.events
                                  if e.get("event") == "eval" and "eval_loss" in e))

    def failed(outcome: Outcome, reason: str) -> TrialResult:
        return TrialResult(**base, outcome=outcome, reason=reason)

    if changed:
        return failed(Outcome.CONTRACT_VIOLATION, f"locked files modified during the trial: {changed}")
    if w.killed_for == "oom":
        return failed(Outcome.OOM, f"peak memory {peak} B crossed the capacity {capacity} B")
    if w.killed_for == "timeout":
        return failed(Outcome.TIMEOUT, f"no exit within {req.timeout_s:.0f} s; process tree killed")
    if w.returncode != 0:
        if "invalid config:" in log_tail:
            line = next(ln for ln in log_tail.splitlines() if "invalid config:" in ln)
            return failed(Outcome.INVALID, line.strip()[:300])
        if is_out_of_memory(log_tail):
            base["peak_memory_bytes"] = max(peak, capacity)
            return failed(Outcome.OOM, "the job ran out of memory (allocator error)")
        last = " | ".join(log_tail.strip().splitlines()[-3:])[:500]
        return failed(Outcome.CRASH, f"exit code {w.returncode}: {last}")
    if recorded.malformed:
        return failed(Outcome.CRASH, f"malformed metrics line(s), e.g. {recorded.malformed[0]!r}")
    if recorded.problems:
        return failed(Outcome.CRASH, f"bad metrics: {recorded.problems[0]}")
    if len(steps) < req.num_steps:
        why = out.no_steps_reason() if not steps else "the job ended early"
        return failed(Outcome.CRASH, f"the job exited 0 but reported {len(steps)} of {req.num_steps} steps: {why}")
    if req.emulate_capacity and reported_peak > capacity:
        return failed(Outcome.OOM, f"reported peak {reported_peak} B is above the capacity")
    return _timed(req, base, w, steps)


def _timed(req: TrialRequest, base: dict, w: _Watch, steps: list[tuple[dict, float]]) -> TrialResult:
    """The ok record: step times from the harness's arrival stamps over the measured window."""
    arrivals = [t for _, t in steps]
    window = range(req.warmup_steps, req.num_steps)
    step_times = tuple(arrivals[s] - arrivals[s - 1] for s in window)
    median_s = statistics.median(step_times)
    base["extra"]["foreign_load_cores"] = foreign_load_cores(w.cpu_samples, arrivals[req.warmup_steps - 1],
                                                             arrivals[-1])
    if median_s <= 0:
        together = sum(1 for t in step_times if t <= 0)
        return TrialResult(**base, outcome=Outcome.CRASH, reason=(
            f"{together} of {len(step_times)} measured steps reached the harness at the same instant as the step "
            "before, so the harness cannot time them: the job's output is buffered (flush after every step: "
            "print(..., flush=True), python -u, or infrarsi.job.reporter), or its steps take no measurable time"))
    start = base["extra"]["start"]
    tokens = {int(e.get("tokens", start.get("tokens_per_step", -1))) for e, _ in steps}
    base.update(phases_s=_median_phases([e for e, _ in steps][req.warmup_steps:]))
    startup_s = max(0.0, arrivals[req.warmup_steps - 1] - w.launched_at - req.warmup_steps * median_s)
    return TrialResult(**base, outcome=Outcome.OK, step_time_s=median_s, startup_s=startup_s,
                       step_times_s=step_times, tokens_per_step=tokens.pop() if len(tokens) == 1 else -1)


def _median_phases(events: list[dict]) -> dict[str, float]:
    keys = {k for e in events for k in (e.get("phases") or {})}
    return {k: statistics.median(float((e.get("phases") or {}).get(k, 0.0)) for e in events) for k in sorted(keys)}
