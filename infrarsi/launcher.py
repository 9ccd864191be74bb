"""The `process` trial backend: launch the real job, watch it, and say how it ended.

The harness owns the clock and the memory gauge. It launches the job without a shell
(knob values are argv entries or environment variables, never spliced into a string),
stamps each metrics line with its own monotonic clock as the line arrives, samples the
resident memory of every process in the job's tree, and kills the whole tree (its own
session) when the emulated device capacity or the timeout is crossed.
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import psutil

from infrarsi.contract import sha256_file
from infrarsi.knobs import Config, KnobSpace
from infrarsi.spec import CampaignSpec
from infrarsi.trial import Outcome, Role, TrialResult, is_out_of_memory

POLL_INTERVAL_S = 0.02
METRICS_ENV = "INFRARSI_METRICS_FILE"
# Set by Ray in its workers; the job's own thread knobs must decide, not the pool.
_INHERITED_THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS_RAY")


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
    backend: str = "process"
    sim_workload: str | None = None
    seed: int = 0


class _MetricsTail:
    """Reads complete JSON lines appended to a file, stamping each with arrival time."""

    def __init__(self, path: Path) -> None:
        self.path, self._pos, self._buf = path, 0, ""
        self.events: list[dict[str, Any]] = []
        self.arrivals: list[float] = []
        self.malformed: list[str] = []

    def poll(self, now: float) -> None:
        try:
            with open(self.path) as f:
                f.seek(self._pos)
                chunk = f.read()
                self._pos = f.tell()
        except FileNotFoundError:
            return
        self._buf += chunk
        *lines, self._buf = self._buf.split("\n")
        for line in filter(None, (ln.strip() for ln in lines)):
            try:
                event = json.loads(line)
                if not isinstance(event, dict):
                    raise ValueError("not an object")
            except ValueError:
                self.malformed.append(line[:200])
                continue
            self.events.append(event)
            self.arrivals.append(now)


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
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
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
    launched_at: float = 0.0  # monotonic
    killed_for: str | None = None
    returncode: int | None = None
    wall_time_s: float = 0.0
    cpu_seconds: float = 0.0
    # (monotonic time, machine-wide busy CPU seconds, the trial tree's CPU seconds) per poll
    cpu_samples: list[tuple[float, float, float]] = field(default_factory=list)


def _watch(proc: subprocess.Popen, req: TrialRequest, tail: _MetricsTail) -> _Watch:
    w = _Watch(launched_at=time.monotonic())
    t0 = w.launched_at
    root = psutil.Process(proc.pid)
    cpu_by_pid: dict[int, float] = {}
    while True:
        now = time.monotonic()
        tail.poll(now)
        procs = _tree(root)
        w.peak_rss_bytes = max(w.peak_rss_bytes, _max_rss(procs))
        for p in procs:
            try:
                t = p.cpu_times()
                cpu_by_pid[p.pid] = t.user + t.system
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                pass
        w.cpu_samples.append((now, _busy_cpu_seconds(), sum(cpu_by_pid.values())))
        if proc.poll() is not None:
            break
        if req.emulate_capacity and w.peak_rss_bytes > req.memory_capacity_bytes:
            w.killed_for = "oom"
        elif now - t0 > req.timeout_s:
            w.killed_for = "timeout"
        if w.killed_for:
            _kill_tree(proc)
            break
        time.sleep(POLL_INTERVAL_S)
    w.returncode = proc.wait()
    w.wall_time_s = time.monotonic() - t0
    w.cpu_seconds = sum(cpu_by_pid.values())
    tail.poll(time.monotonic())
    return w


def run_process_trial(req: TrialRequest) -> TrialResult:
    # Every attempt keeps its own folder: a retry never overwrites the evidence of the first.
    trial_dir = Path(req.trial_dir if req.attempt == 1 else f"{req.trial_dir}-a{req.attempt}")
    trial_dir.mkdir(parents=True, exist_ok=True)
    log_path, metrics_path = trial_dir / "log.txt", trial_dir / "metrics.jsonl"
    metrics_path.unlink(missing_ok=True)
    base = dict(trial_id=req.trial_id, config=dict(req.config), role=req.role, attempt=req.attempt,
                memory_capacity_bytes=req.memory_capacity_bytes, log_path=str(log_path))
    changed = _changed(req)
    if changed:
        return TrialResult(**base, outcome=Outcome.CONTRACT_VIOLATION,
                           reason=f"locked files changed before the trial started: {changed}")
    env = {k: v for k, v in os.environ.items() if k not in _INHERITED_THREAD_VARS}
    env.update(req.env)
    env[METRICS_ENV] = str(metrics_path)
    tail = _MetricsTail(metrics_path)
    with open(log_path, "wb") as log:
        log.write(f"$ {' '.join(req.argv)}\n".encode())
        log.flush()
        try:
            proc = subprocess.Popen(list(req.argv), cwd=req.cwd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
        except OSError as exc:
            return TrialResult(**base, outcome=Outcome.CRASH, reason=f"could not launch {req.argv[0]!r}: {exc}")
        w = _watch(proc, req, tail)
    base.update(wall_time_s=w.wall_time_s, device_seconds=w.wall_time_s * req.devices_per_trial)
    return _classify(req, base, w, tail, _tail(log_path), _changed(req))


def _changed(req: TrialRequest) -> list[str]:
    out = []
    for rel, digest in req.locked_hashes.items():
        path = Path(req.cwd) / rel
        if not path.is_file() or sha256_file(path) != digest:
            out.append(rel)
    return out


def _classify(req: TrialRequest, base: dict, w: _Watch, tail: _MetricsTail, log_tail: str,
              changed: list[str]) -> TrialResult:
    steps = [(e, t) for e, t in zip(tail.events, tail.arrivals) if e.get("event") == "step"]
    start = next((e for e in tail.events if e.get("event") == "start"), {})
    reported_peak = max((int(e.get("peak_memory_bytes") or 0) for e, _ in steps), default=0)
    peak = max(w.peak_rss_bytes, reported_peak)
    extra = {"returncode": w.returncode, "harness_peak_rss_bytes": w.peak_rss_bytes,
             "reported_peak_memory_bytes": reported_peak, "start": start, "cpu_seconds": w.cpu_seconds,
             "reported_step_times_s": [float(e.get("step_time_s", 0.0)) for e, _ in steps]}
    base.update(peak_memory_bytes=peak or None, extra=extra, host_peak_rss_bytes=w.peak_rss_bytes or None,
                losses=tuple(float(e["loss"]) for e, _ in steps if "loss" in e),
                eval_losses=tuple(float(e["eval_loss"]) for e in tail.events
                                  if e.get("event") == "eval" and "eval_loss" in e))

    def failed(outcome: Outcome, reason: str) -> TrialResult:
        return TrialResult(**base, outcome=outcome, reason=reason)

    if changed:
        return failed(Outcome.CONTRACT_VIOLATION, f"locked files modified during the trial: {changed}")
    if w.killed_for == "oom":
        return failed(Outcome.OOM, f"peak memory {peak} B crossed the capacity {req.memory_capacity_bytes} B")
    if w.killed_for == "timeout":
        return failed(Outcome.TIMEOUT, f"no exit within {req.timeout_s:.0f} s; process tree killed")
    if w.returncode != 0:
        if "invalid config:" in log_tail:
            line = next(ln for ln in log_tail.splitlines() if "invalid config:" in ln)
            return failed(Outcome.INVALID, line.strip()[:300])
        if is_out_of_memory(log_tail):
            base["peak_memory_bytes"] = max(peak, req.memory_capacity_bytes)
            return failed(Outcome.OOM, "the job ran out of memory (allocator error)")
        last = " | ".join(log_tail.strip().splitlines()[-3:])[:500]
        return failed(Outcome.CRASH, f"exit code {w.returncode}: {last}")
    if tail.malformed:
        return failed(Outcome.CRASH, f"malformed metrics line(s), e.g. {tail.malformed[0]!r}")
    if len(steps) < req.num_steps:
        return failed(Outcome.CRASH, f"the job exited 0 but reported {len(steps)} of {req.num_steps} steps")
    if req.emulate_capacity and reported_peak > req.memory_capacity_bytes:
        return failed(Outcome.OOM, f"reported peak {reported_peak} B is above the capacity")
    arrivals = [t for _, t in steps]
    window = range(req.warmup_steps, req.num_steps)
    step_times = tuple(arrivals[s] - arrivals[s - 1] for s in window)
    tokens = {int(e.get("tokens", -1)) for e, _ in steps}
    base.update(phases_s=_median_phases([e for e, _ in steps][req.warmup_steps:]))
    extra["foreign_load_cores"] = foreign_load_cores(w.cpu_samples, arrivals[req.warmup_steps - 1], arrivals[-1])
    median_s = statistics.median(step_times)
    startup_s = max(0.0, arrivals[req.warmup_steps - 1] - w.launched_at - req.warmup_steps * median_s)
    return TrialResult(**base, outcome=Outcome.OK, step_time_s=median_s, startup_s=startup_s,
                       step_times_s=step_times, tokens_per_step=tokens.pop() if len(tokens) == 1 else -1)


def _median_phases(events: list[dict]) -> dict[str, float]:
    keys = {k for e in events for k in (e.get("phases") or {})}
    return {k: statistics.median(float((e.get("phases") or {}).get(k, 0.0)) for e in events) for k in sorted(keys)}
