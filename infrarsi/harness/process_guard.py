"""Every process a campaign starts ends when the campaign process ends, however it ends.

The first ``guard_campaign`` in a process starts a watchdog: a small process in a session
of its own (a signal to the campaign's process group does not reach it) holding the read
end of a pipe whose write end only the campaign process holds. While the campaign process
lives, the watchdog notes every process below it (the temporary Prefect server, Ray's
processes, trials, torchrun and its workers) by pid and start time, once every
``POLL_INTERVAL_S``, in a record in each campaign folder it runs (``processes.json``) and in
the machine's data folder. Every process started after the guard also inherits
``INFRARSI_PROCESS_GUARD``, a token of this campaign process, in its environment, so a
process born since the last look, or orphaned before it (a torchrun worker whose torchrun
died), is still known.

When the campaign process ends (its last line, an exception, SIGINT, SIGTERM, SIGKILL), the
kernel closes its end of the pipe; the watchdog then ends what it noted and what carries the
token: SIGTERM, ``GRACE_S``, then SIGKILL (Ray's agents ignore SIGTERM). A noted pid is
signalled only while its start time is the one noted: a pid the kernel gave to another
process since is never touched. Nothing is ended by name. The watchdog ignores SIGTERM,
SIGINT and SIGHUP (``pkill -f infrarsi`` reaches it too) and its command line does not
repeat the campaign's.

Where the watchdog could not finish (it was SIGKILLed too), its record stays: the next campaign
on the machine, and ``--resume`` of that campaign, end what it lists and say so.
"""

from __future__ import annotations

import ctypes
import json
import os
import select
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import psutil
from pydantic import BaseModel, ConfigDict

from infrarsi.core.workspace import CampaignDir, data_dir

GUARD_ENV = "INFRARSI_PROCESS_GUARD"
POLL_INTERVAL_S = 1.0
GRACE_S = 3.0
# A process that starts another while it is being ended (a torchrun restarting a worker) is
# ended in the next round.
MAX_ROUNDS = 4
WATCHDOG_WAIT_S = MAX_ROUNDS * 2 * GRACE_S + POLL_INTERVAL_S  # the longest a watchdog takes to finish
_PR_SET_PDEATHSIG = 1


class NotedProcess(BaseModel):
    """A process by pid and start time: the pid alone may since name another process."""

    model_config = ConfigDict(frozen=True)
    pid: int
    create_time: float
    name: str = ""  # the start of its command line, for people

    @classmethod
    def of(cls, proc: psutil.Process) -> NotedProcess | None:
        try:
            with proc.oneshot():
                argv = proc.cmdline() or [proc.name()]
                return cls(pid=proc.pid, create_time=proc.create_time(),
                           name=" ".join([Path(argv[0]).name, *argv[1:]]).strip()[:60])
        except psutil.Error:
            return None

    def running(self) -> psutil.Process | None:
        """The process, while it runs and is the one noted."""
        try:
            proc = psutil.Process(self.pid)
            if abs(proc.create_time() - self.create_time) < 0.01 and _running(proc):
                return proc
        except psutil.Error:
            pass
        return None

    def __str__(self) -> str:
        return f"{self.name} (pid {self.pid})"


class GuardRecord(BaseModel):
    """What a campaign process's watchdog knows, as it writes it down."""

    token: str
    campaign: NotedProcess
    watchdog: NotedProcess | None = None
    folders: list[str] = []  # the campaign folders this process runs
    noted: list[NotedProcess] = []  # below the campaign process and running, at the last look
    ended: list[NotedProcess] = []  # what the watchdog found running once the campaign process was gone
    finished: bool = False  # everything noted or carrying the token was ended (by the watchdog or later)


def _running(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _carrying(token: str) -> list[psutil.Process]:
    """Processes whose environment carries ``token`` (a process that rewrote its environment,
    as Ray's agents do with their title, is found only by its noted pid)."""
    out = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get(GUARD_ENV) == token:
                out.append(proc)
        except psutil.Error:
            pass
    return out


def _wait_gone(procs: list[psutil.Process], timeout_s: float) -> list[psutil.Process]:
    """Those of ``procs`` still running after ``timeout_s`` (a zombie has ended)."""
    deadline = time.monotonic() + timeout_s
    while (alive := [p for p in procs if _running(p)]) and time.monotonic() < deadline:
        time.sleep(0.05)
    return alive


def end_processes(noted: Iterable[NotedProcess], token: str) -> list[NotedProcess]:
    """End what is running of ``noted`` and every process carrying ``token``: SIGTERM, then
    SIGKILL after ``GRACE_S``. Returns what was running."""
    ended: list[NotedProcess] = []
    for _ in range(MAX_ROUNDS):
        targets = {p.pid: p for p in (n.running() for n in noted) if p is not None}
        targets.update((p.pid, p) for p in _carrying(token))
        targets.pop(os.getpid(), None)
        if not targets:
            break
        procs = list(targets.values())
        ended += [n for n in map(NotedProcess.of, procs) if n is not None]
        for sig, wait_s in ((signal.SIGTERM, GRACE_S), (signal.SIGKILL, GRACE_S)):
            for p in procs:
                try:
                    p.send_signal(sig)  # psutil refuses a pid whose start time changed
                except psutil.Error:
                    pass
            procs = _wait_gone(procs, wait_s)
    return ended


def parent_death_signal(sig: int) -> Callable[[], None] | None:
    """A ``preexec_fn`` after which the kernel sends ``sig`` to the child when the thread that
    started it ends (Linux; elsewhere None). That thread must wait for the child."""
    if not sys.platform.startswith("linux"):
        return None
    prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up here: the child only calls it
    parent = os.getpid()

    def set_signal() -> None:
        prctl(_PR_SET_PDEATHSIG, sig)
        if os.getppid() != parent:  # the parent died before the signal was armed
            os.kill(os.getpid(), sig)

    return set_signal


def _write(record: GuardRecord, paths: Iterable[Path]) -> None:
    data = record.model_dump_json(indent=2)
    for path in paths:
        try:
            tmp = path.with_name(path.name + ".tmp")
            tmp.write_text(data)
            os.replace(tmp, path)
        except OSError:  # a campaign folder removed meanwhile
            pass


def _read(path: Path) -> GuardRecord | None:
    try:
        return GuardRecord.model_validate_json(path.read_text())
    except (OSError, ValueError):
        return None


def _index_dir() -> Path:
    return data_dir() / "processes"


def _record_paths(record: GuardRecord) -> list[Path]:
    return [CampaignDir(Path(f)).processes for f in record.folders]


@dataclass
class _Watchdog:
    record: GuardRecord
    index: Path
    noted: dict[int, NotedProcess] = field(default_factory=dict)

    def look(self, campaign: psutil.Process | None) -> bool:
        """Note what runs below the campaign process; True when that changed what is noted."""
        try:
            below = campaign.children(recursive=True) if campaign is not None else []
        except psutil.Error:  # gone since the last look
            below = []
        seen = [n for n in map(NotedProcess.of, below) if n is not None and n.pid != os.getpid()]
        before = set(self.noted.values())
        self.noted = {n.pid: n for n in self.noted.values() if n.running() is not None}
        self.noted.update((n.pid, n) for n in seen)
        return set(self.noted.values()) != before

    def write(self) -> None:
        self.record = self.record.model_copy(update={"noted": list(self.noted.values())})
        _write(self.record, [self.index, *_record_paths(self.record)])

    def run(self, read_fd: int) -> None:
        campaign = self.record.campaign.running()
        pending = b""
        self.write()
        while True:
            readable, _, _ = select.select([read_fd], [], [], POLL_INTERVAL_S)
            chunk = os.read(read_fd, 4096) if readable else None
            if chunk == b"":  # the campaign process is gone, however it ended
                break
            changed = self.look(campaign)
            if chunk:
                *lines, pending = (pending + chunk).split(b"\n")
                self.record.folders.extend(json.loads(line) for line in lines)
                changed = True
            if changed:
                self.write()
        ended = end_processes(self.noted.values(), self.record.token)
        self.record = self.record.model_copy(update={"noted": [], "ended": ended, "finished": True})
        _write(self.record, _record_paths(self.record))
        self.index.unlink(missing_ok=True)
        self.index.with_suffix(".log").unlink(missing_ok=True)


@dataclass
class _Guard:
    token: str
    pid: int
    write_fd: int
    watchdog: subprocess.Popen
    folders: set[Path] = field(default_factory=set)


_guard: _Guard | None = None


def _close_quietly(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass


def _install() -> _Guard:
    global _guard
    if _guard is not None and _guard.pid == os.getpid():
        return _guard
    token = uuid.uuid4().hex
    me = NotedProcess.of(psutil.Process())
    assert me is not None
    index = _index_dir() / f"{token}.json"
    index.parent.mkdir(parents=True, exist_ok=True)
    read_fd, write_fd = os.pipe()  # not inheritable: only the watchdog gets the read end, nobody else the write end
    env = {k: v for k, v in os.environ.items() if k != GUARD_ENV}
    # The record goes through the index, not the watchdog's argv: a ``pkill -f`` aimed at the
    # campaign's command line must not match the watchdog's.
    _write(GuardRecord(token=token, campaign=me), [index])
    with open(index.with_suffix(".log"), "ab") as log:
        watchdog = subprocess.Popen(
            [sys.executable, "-m", __name__, str(read_fd), str(index)],
            pass_fds=(read_fd,), start_new_session=True, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log)
    os.close(read_fd)
    # A child forked without exec does not keep the pipe open past this process's end.
    os.register_at_fork(after_in_child=lambda: _close_quietly(write_fd))
    os.environ[GUARD_ENV] = token
    _guard = _Guard(token=token, pid=os.getpid(), write_fd=write_fd, watchdog=watchdog)
    return _guard


def guard_campaign(folder: Path | None) -> list[str]:
    """Guard this process (the first call) and note ``folder`` as a campaign folder it runs.
    First ends what dead campaigns on this machine left running, ``folder``'s last run
    included; returns a line for the console about each."""
    lines = end_leftovers(folder)
    guard = _install()
    if folder is not None and folder.resolve() not in guard.folders:
        folder = folder.resolve()
        guard.folders.add(folder)
        try:
            os.write(guard.write_fd, (json.dumps(str(folder)) + "\n").encode())
        except BrokenPipeError:
            message = ("the watchdog that ends this campaign's processes with it is gone (see "
                       f"{_index_dir() / guard.token}.log); if the campaign is killed, run --resume to end what it left")
            CampaignDir(folder).add_warning("processes", message)
            lines.append(message)
    return lines


def end_leftovers(folder: Path | None) -> list[str]:
    """End what dead campaigns left running: those on this machine whose watchdog could not
    finish, and ``folder``'s last run. Returns a line for the console about each."""
    records = {r.token: r for r in map(_read, sorted(_index_dir().glob("*.json"))) if r is not None}
    own = _read(CampaignDir(folder).processes) if folder is not None else None
    if own is not None:
        records.setdefault(own.token, own)
    lines = []
    for record in records.values():
        lines += _end_leftovers_of(record, own is not None and record.token == own.token)
    return lines


def _end_leftovers_of(record: GuardRecord, own: bool) -> list[str]:
    if record.campaign.running() is not None:
        return []  # a campaign still running: its processes are its own
    watchdog = record.watchdog.running() if record.watchdog else None
    index = _index_dir() / f"{record.token}.json"
    if watchdog is not None:  # still ending them: let it finish, then read what it wrote
        _wait_gone([watchdog], WATCHDOG_WAIT_S)
        record = next((r for r in map(_read, [*_record_paths(record), index]) if r and r.token == record.token),
                      record)
    if record.finished:
        if own and record.ended:
            return [(f"when the last run of this campaign (process {record.campaign.pid}) ended, "
                     f"{len(record.ended)} processes it started were still running; its watchdog ended them: "
                     f"{', '.join(map(str, record.ended))}")]
        return []
    ended = end_processes(record.noted, record.token)
    _write(record.model_copy(update={"noted": [], "finished": True}), _record_paths(record))
    index.unlink(missing_ok=True)
    if not ended:
        return []
    where = ", ".join(record.folders) or "an unknown folder"
    message = (f"the campaign process {record.campaign.pid} ({where}) was gone and so was its watchdog; "
               f"{len(ended)} processes it started were still running and have been ended: "
               f"{', '.join(map(str, ended))}")
    for f in record.folders:
        CampaignDir(Path(f)).add_warning("processes", message)
    return [message]


if __name__ == "__main__":  # the watchdog: READ_FD INDEX_PATH (the record, written by _install)
    # It ends itself once the campaign process is gone; a signal meant to end the campaign
    # (``pkill -f infrarsi`` sends SIGTERM to both) must not end it first.
    for _sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(_sig, signal.SIG_IGN)
    _index = Path(sys.argv[2])
    _Watchdog(GuardRecord.model_validate_json(_index.read_text()).model_copy(
        update={"watchdog": NotedProcess.of(psutil.Process())}), _index).run(int(sys.argv[1]))
