"""Every process a campaign starts ends with the campaign's process, however that ends: a
real ``infrarsi campaign`` (the temporary Prefect server, a local Ray, trials of a real job
whose child runs in a session of its own, as torchrun's workers do) that exits, fails, or is
sent SIGINT, SIGTERM or SIGKILL; and a campaign whose watchdog was killed with it, whose
leftovers the next campaign or ``--resume`` ends."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest

from infrarsi.core.workspace import CampaignDir
from infrarsi.harness.process_guard import GUARD_ENV, GuardRecord, NotedProcess, end_leftovers

REPO = Path(__file__).resolve().parents[1]
FAKE = REPO / "tests" / "fake_workload.py"
WITHIN_S = 10.0


def _process_spec(mode: str) -> str:
    """A job on the process backend whose baseline runs in ``mode`` (tests/fake_workload.py)."""
    return f"""name = "guarded"
workload_dir = "job"
repository = "copy"
command = ["{{python}}", "fake_workload.py", "--steps", "{{num_steps}}", "--sleep", "0.05", "--mode", "{{mode}}"]
baseline = {{ mode = "{mode}" }}
[knobs.mode]
values = ["{mode}", "ok"]
placeholder = true
[contract]
seq_len = 128
global_batch_tokens = 2048
num_steps = 4
warmup_steps = 1
editable = ["fake_workload.py"]
locked = ["locked.txt"]
[device]
memory_capacity = "4GiB"
[resources]
cpus_per_trial = 1
[budget]
num_trials = 2
"""


SIM_SPEC = """name = "guarded-sim"
backend = "sim"
sim_workload = "dense-9b-h100"
[budget]
num_trials = 4
num_finalists = 1
verify_pairs = 2
"""


def _running(noted: NotedProcess) -> bool:
    return noted.running() is not None


def _descendants(pid: int) -> set[NotedProcess]:
    try:
        below = psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return set()
    return {n for n in map(NotedProcess.of, below) if n is not None}


def _ends_within(noted: set[NotedProcess], since: float) -> list[NotedProcess]:
    """Those of ``noted`` still running ``WITHIN_S`` after ``since`` (earlier if none is)."""
    while (alive := [n for n in noted if _running(n)]) and time.monotonic() < since + WITHIN_S:
        time.sleep(0.2)
    return alive


# How the campaign ends: its spec, and what must run below it before it is ended that way.
ENDINGS = {
    "exit": (SIM_SPEC, None),
    "exception": (_process_spec("crash"), None),  # the baseline crashes: doctor raises ContractError
    "SIGINT": (_process_spec("hang-own-session"), "time.sleep(600)"),  # the trial job's child, own session
    "SIGTERM": (_process_spec("hang-own-session"), "time.sleep(600)"),
    "SIGKILL": (_process_spec("hang-own-session"), "time.sleep(600)"),
}


@dataclass
class _Run:
    """One campaign through the CLI, ended one way; what it started, as the test saw it."""

    ending: str
    folder: Path
    proc: subprocess.Popen
    started: set[NotedProcess] = field(default_factory=set)
    ended_at: float | None = None
    still_running: list[NotedProcess] | None = None  # WITHIN_S after it ended
    error: str = ""

    @classmethod
    def start(cls, tmp: Path, ending: str, env: dict[str, str]) -> _Run:
        (tmp / "job").mkdir(parents=True)
        shutil.copy(FAKE, tmp / "job" / "fake_workload.py")
        (tmp / "job" / "locked.txt").write_text("locked\n")
        (tmp / "spec.toml").write_text(ENDINGS[ending][0])
        with (tmp / "output.txt").open("w") as output:
            proc = subprocess.Popen(
                [sys.executable, "-m", "infrarsi.cli", "campaign", "spec.toml", "--out", "out", "--campaign-id", "c",
                 "--tracking-uri", "none", "--no-progress"],
                env=env, cwd=tmp, stdout=output, stderr=subprocess.STDOUT, start_new_session=True)
        return cls(ending=ending, folder=tmp / "out" / "c", proc=proc)

    @property
    def output(self) -> str:
        return (self.folder.parents[1] / "output.txt").read_text()

    def step(self, deadline: float) -> None:
        """Note what runs below the campaign, end it when ready; WITHIN_S after it ended, note
        what still runs."""
        now = time.monotonic()
        if self.ended_at is not None:
            alive = [n for n in self.started if _running(n)]
            if not alive or now > self.ended_at + WITHIN_S:
                self.still_running = alive
        elif self.proc.poll() is not None:
            self.ended_at = now
        elif now > deadline:
            self.error = f"the campaign did not reach {ENDINGS[self.ending][1]!r} in time"
            self.proc.kill()
        else:
            self.started |= _descendants(self.proc.pid)
            wait_for = ENDINGS[self.ending][1]
            if wait_for and any(wait_for in n.name for n in self.started if _running(n)):
                self.proc.send_signal(getattr(signal, self.ending))  # the campaign's process, not its group


@pytest.fixture(scope="module")
def ended_campaigns(tmp_path_factory) -> dict[str, _Run]:
    """Every way of ending, each on its own campaign, the five running at once (each pays
    Python's, Prefect's and Ray's start-up; together they share the waiting). No
    PREFECT_API_URL: each starts Prefect's temporary server, in one Prefect home whose
    database is made once beforehand."""
    tmp = tmp_path_factory.mktemp("endings")
    env = {k: v for k, v in os.environ.items() if k not in ("PREFECT_API_URL", GUARD_ENV)}
    # Five temporary servers starting at once on a busy machine take longer than Prefect's 20 s.
    env.update(PREFECT_HOME=str(tmp / "prefect-home"), PREFECT_SERVER_ANALYTICS_ENABLED="false",
               PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS="300", RAY_AUTH_MODE="disabled",
               PYTHONPATH=str(REPO))
    subprocess.run([sys.executable, "-m", "prefect", "server", "database", "upgrade", "-y"], env=env, check=True,
                   capture_output=True, timeout=300)
    runs = {ending: _Run.start(tmp / ending, ending, env) for ending in ENDINGS}
    deadline = time.monotonic() + 300
    try:
        while any(r.still_running is None for r in runs.values()):
            for r in runs.values():
                r.step(deadline)
            time.sleep(0.1)
        yield runs
    finally:
        for r in runs.values():
            r.proc.kill()
            r.proc.wait()
            for n in r.started:
                if (p := n.running()) is not None:
                    p.kill()


@pytest.mark.slow
@pytest.mark.parametrize("ending", list(ENDINGS))
def test_no_process_a_campaign_started_outlives_it(ended_campaigns, ending):
    run = ended_campaigns[ending]
    assert not run.error, run.error + "\n" + run.output
    names = " ".join(n.name for n in run.started)
    assert "uvicorn" in names and "raylet" in names, names  # Prefect's temporary server and a local Ray ran
    if ending == "exit":
        assert run.proc.returncode == 0, run.output
    elif ending == "exception":
        assert run.proc.returncode == 2 and "baseline" in run.output, run.output
    else:
        assert "fake_workload.py" in names, names  # a trial was running when the signal came
        assert run.proc.returncode != 0, run.output
    if ending == "SIGTERM":  # one line that says how to go on, and no native stack dump on the console
        assert run.proc.returncode == 128 + signal.SIGTERM, run.output
        assert "infrarsi: stopped by SIGTERM." in run.output and "--resume" in run.output, run.output
        assert "SIGTERM received" not in run.output, run.output
    assert run.still_running == [], f"still running {WITHIN_S:.0f} s after the campaign ended"
    record = GuardRecord.model_validate_json(CampaignDir(run.folder).processes.read_text())
    assert record.finished and record.campaign.pid == run.proc.pid


CAMPAIGN = """
import subprocess, sys, time
from pathlib import Path
from infrarsi.harness.process_guard import guard_campaign
guard_campaign(Path(sys.argv[1]))
# a child that ignores SIGTERM, and its child in a session of its own
code = ("import signal, subprocess, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)'], start_new_session=True); "
        "time.sleep(300)")
subprocess.Popen([sys.executable, "-c", code])
time.sleep(300)
"""


def _guarded_script(tmp_path: Path, monkeypatch) -> tuple[subprocess.Popen, Path, Path]:
    """CAMPAIGN run in its own session, with a data folder of its own: (process, its
    campaign folder, the script)."""
    monkeypatch.setenv("INFRARSI_DATA_DIR", str(tmp_path / "data"))  # no other campaign's record
    folder = tmp_path / "campaign"
    folder.mkdir()
    script = tmp_path / "campaign.py"
    script.write_text(CAMPAIGN)
    proc = subprocess.Popen([sys.executable, str(script), str(folder)], env={**os.environ, "PYTHONPATH": str(REPO)},
                            start_new_session=True)
    return proc, folder, script


def _noted(proc: subprocess.Popen, folder: Path) -> GuardRecord:
    """The watchdog's record once it has noted the script's two processes."""
    record_path = CampaignDir(folder).processes
    deadline = time.monotonic() + 60
    while not (record_path.exists() and len(GuardRecord.model_validate_json(record_path.read_text()).noted) == 2):
        assert proc.poll() is None and time.monotonic() < deadline, "the campaign's watchdog never noted its processes"
        time.sleep(0.1)
    return GuardRecord.model_validate_json(record_path.read_text())


@pytest.mark.parametrize("who", ["resume", "next campaign"])
def test_what_a_campaign_and_its_watchdog_left_is_ended_by_the_next_one(tmp_path, monkeypatch, who):
    proc, folder, _ = _guarded_script(tmp_path, monkeypatch)
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        _check_leftovers_ended(proc, bystander, folder, who)
    finally:
        for p in (proc, bystander):
            p.kill()
            p.wait()


def _check_leftovers_ended(proc: subprocess.Popen, bystander: subprocess.Popen, folder: Path, who: str) -> None:
    record_path = CampaignDir(folder).processes
    record = _noted(proc, folder)
    assert end_leftovers(folder) == [] and all(_running(n) for n in record.noted)  # a live campaign's are its own
    os.kill(record.watchdog.pid, signal.SIGKILL)  # nothing can be done at the moment of death
    assert _ends_within({record.watchdog}, time.monotonic()) == []
    left = set(record.noted)
    # A pid the kernel gave to another process since: listed, but with another start time.
    recycled = NotedProcess(pid=bystander.pid, create_time=psutil.Process(bystander.pid).create_time() - 5, name="x")
    index = Path(os.environ["INFRARSI_DATA_DIR"]) / "processes" / f"{record.token}.json"
    for path in (record_path, index):
        path.write_text(record.model_copy(update={"noted": [*record.noted, recycled]}).model_dump_json())
    proc.kill()
    proc.wait()
    time.sleep(1)
    assert all(_running(n) for n in left)
    if who == "resume":  # only the campaign folder knows
        index.unlink()
        index.with_suffix(".log").unlink()
        lines = end_leftovers(folder)
    else:  # the campaign folder is not named: the machine's data folder knows
        record_path.unlink()
        lines = end_leftovers(None)
    assert len(lines) == 1 and f"campaign process {proc.pid}" in lines[0], lines
    assert all(str(n.pid) in lines[0] for n in left), lines
    assert _ends_within(left, time.monotonic()) == []
    assert bystander.poll() is None, "a recycled pid was signalled"
    assert [w["message"] for w in CampaignDir(folder).read_warnings()] == lines
    assert not index.exists()
    assert end_leftovers(folder) == []  # said once


def test_a_pkill_that_reaches_the_watchdog_too_leaves_nothing(tmp_path, monkeypatch):
    """``pkill -f`` on the campaign's command line (or on ``infrarsi``) sends SIGTERM to every
    match: the watchdog's command line must not repeat the campaign's, and a SIGTERM that
    reaches it anyway must not stop it ending what the campaign started."""
    proc, folder, script = _guarded_script(tmp_path, monkeypatch)
    record = None
    try:
        record = _noted(proc, folder)
        record_path = CampaignDir(folder).processes
        watchdog = psutil.Process(record.watchdog.pid)
        assert str(script) not in " ".join(watchdog.cmdline())
        for pid in (record.watchdog.pid, proc.pid):
            os.kill(pid, signal.SIGTERM)
        proc.wait()
        assert _ends_within(set(record.noted), time.monotonic()) == []
        assert GuardRecord.model_validate_json(record_path.read_text()).finished
    finally:
        proc.kill()
        proc.wait()
        for n in record.noted if record is not None else ():
            if (p := n.running()) is not None:
                p.kill()
