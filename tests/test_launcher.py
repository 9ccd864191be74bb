"""The process backend on real processes: every way a trial can end is classified."""

import contextlib
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from infrarsi.contract.checks import enforce
from infrarsi.core.files import sha256_file
from infrarsi.core.spec import ContractSpec
from infrarsi.core.trial import Outcome, Role
from infrarsi.harness.launcher import TrialRequest, run_process_trial

FAKE = str(Path(__file__).parent / "fake_workload.py")


def _request(tmp_path, *args, steps=4, capacity=2**31, timeout=60.0, locked=None):
    return TrialRequest(
        trial_id="t0001", config={"mode": "x"}, role=Role.SEARCH,
        argv=(sys.executable, FAKE, "--steps", str(steps), *args), env={}, cwd=str(tmp_path),
        trial_dir=str(tmp_path / "trial"), memory_capacity_bytes=capacity, emulate_capacity=True,
        timeout_s=timeout, warmup_steps=1, num_steps=steps, locked_hashes=locked or {})


def test_ok_trial_is_timed_by_the_harness(tmp_path):
    r = run_process_trial(_request(tmp_path, "--sleep", "0.1"))
    assert r.outcome is Outcome.OK, r.reason
    assert len(r.step_times_s) == 3  # steps 1..3: the measured window after one warm-up step
    assert 0.08 < r.step_time_s < 0.5
    assert r.losses == pytest.approx((5.0, 4.9, 4.8, 4.7))
    assert r.tokens_per_step == 2048
    assert r.wall_time_s >= 0.3 and r.device_seconds == pytest.approx(r.wall_time_s)


def test_crossing_the_emulated_capacity_is_an_oom_with_a_censored_peak(tmp_path):
    capacity = 150 * 2**20
    r = run_process_trial(_request(tmp_path, "--alloc-mb", "400", "--sleep", "0.2", capacity=capacity))
    assert r.outcome is Outcome.OOM
    assert r.peak_memory_bytes >= capacity
    assert r.censored


def test_allocator_oom_message_is_an_oom(tmp_path):
    r = run_process_trial(_request(tmp_path, "--mode", "oomtext", capacity=10**9))
    assert r.outcome is Outcome.OOM and r.peak_memory_bytes >= 10**9


@pytest.mark.parametrize("mode", ["hang", "hang-own-session"])
def test_timeout_kills_the_whole_process_tree(tmp_path, mode):
    r = run_process_trial(_request(tmp_path, "--mode", mode, timeout=3.0))
    assert r.outcome is Outcome.TIMEOUT
    child = int(next(ln.split()[1] for ln in Path(r.log_path).read_text().splitlines() if ln.startswith("CHILD")))
    deadline = time.time() + 5
    while psutil.pid_exists(child) and psutil.Process(child).status() != psutil.STATUS_ZOMBIE:
        assert time.time() < deadline, "the trial's child process survived the timeout"
        time.sleep(0.1)


@pytest.mark.parametrize("mode, outcome, reason", [
    ("crash", Outcome.CRASH, "RuntimeError: injected failure in step 1"),
    ("invalid", Outcome.INVALID, "invalid config: micro-batch 3"),
    ("garbage", Outcome.CRASH, "malformed metrics line"),
    ("silent", Outcome.CRASH, "reported 0 of 4 steps"),
])
def test_failures_are_classified_with_their_reason(tmp_path, mode, outcome, reason):
    r = run_process_trial(_request(tmp_path, "--mode", mode))
    assert r.outcome is outcome
    assert reason in r.reason


def test_a_missing_program_is_a_crash_not_an_exception(tmp_path):
    req = _request(tmp_path)
    r = run_process_trial(TrialRequest(**{**req.__dict__, "argv": ("/no/such/python", FAKE)}))
    assert r.outcome is Outcome.CRASH and "could not launch" in r.reason


def test_locked_file_modified_at_run_time_is_a_violation(tmp_path):
    locked = tmp_path / "locked.txt"
    locked.write_text("original\n")
    r = run_process_trial(_request(tmp_path, "--mode", "tamper", locked={"locked.txt": sha256_file(locked)}))
    assert r.outcome is Outcome.CONTRACT_VIOLATION
    assert "locked.txt" in r.reason


def test_workload_lying_about_its_step_time_is_caught_by_the_harness_clock(tmp_path):
    r = run_process_trial(_request(tmp_path, "--mode", "liar", "--sleep", "0.1"))
    assert r.outcome is Outcome.OK
    contract = ContractSpec(seq_len=128, global_batch_tokens=2048, num_steps=4, warmup_steps=1,
                            editable=["*"], locked=["*"])
    checked = enforce(r, contract, None)
    assert checked.outcome is Outcome.CONTRACT_VIOLATION
    assert "disagrees with the harness clock" in checked.reason


def test_knob_values_reach_the_job_as_argv_never_through_a_shell(tmp_path):
    evil = "x; touch pwned && echo $HOME"
    r = run_process_trial(_request(tmp_path, "--echo", evil))
    assert r.outcome is Outcome.OK
    echoed = next(ln for ln in Path(r.log_path).read_text().splitlines() if ln.startswith("ECHO"))
    assert evil in echoed
    assert not (tmp_path / "pwned").exists() and not Path("pwned").exists()


def test_foreign_load_during_the_window_is_measured(tmp_path):
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.3)
        r = run_process_trial(_request(tmp_path, "--sleep", "0.3", steps=5))
    finally:
        hog.kill()
        hog.wait()
    assert r.outcome is Outcome.OK
    # the job sleeps: nearly all CPU in the window was the hog's, about one core
    assert r.extra["foreign_load_cores"] > 0.6


TRIAL_IN_A_PROCESS = """
import sys
from infrarsi.core.trial import Role
from infrarsi.harness.launcher import TrialRequest, run_process_trial
run_process_trial(TrialRequest(
    trial_id="t0001", config={}, role=Role.SEARCH, argv=(sys.executable, sys.argv[1], "--mode", "hang"), env={},
    cwd=sys.argv[2], trial_dir=sys.argv[2] + "/trial", memory_capacity_bytes=2**31, emulate_capacity=True,
    timeout_s=600, warmup_steps=1, num_steps=4))
"""


def test_the_job_ends_with_the_process_that_runs_its_trial(tmp_path):
    """A Ray actor killed mid-trial, or a campaign gone: the job gets SIGTERM from the kernel."""
    runner = subprocess.Popen([sys.executable, "-c", TRIAL_IN_A_PROCESS, FAKE, str(tmp_path)])
    log = tmp_path / "trial" / "log.txt"
    deadline = time.time() + 60
    while not (log.exists() and "CHILD" in log.read_text()):
        assert runner.poll() is None and time.time() < deadline, "the trial never started"
        time.sleep(0.1)
    job = next(p for p in psutil.Process(runner.pid).children() if FAKE in p.cmdline())
    child = psutil.Process(int(log.read_text().split("CHILD")[1].split()[0]))
    runner.kill()
    runner.wait()
    try:
        job.wait(timeout=10)  # not this process's child: psutil polls until it is gone
    finally:
        # The job's own child is the campaign's watchdog's to end (test_campaign_processes).
        for p in (job, child):
            with contextlib.suppress(psutil.NoSuchProcess):
                p.kill()

