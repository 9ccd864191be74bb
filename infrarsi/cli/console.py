"""What the ``infrarsi`` command shows people, and where.

``stdout_to_stderr``: with ``--json``, stdout carries exactly one JSON document; everything
else written to it while the command works (its own lines, a library's, a child process's)
goes to stderr.

``stop_on_signal`` and ``native_stderr_to``: a campaign stopped by SIGTERM or SIGHUP ends
with one line, never a native library's dump (Ray's signal handler prints its stack to the
process's stderr before it passes the signal on): the dump goes to the campaign's log.

``CampaignConsole``: what a running campaign shows on stderr: each warning as it is raised,
and its progress: tqdm's bar on a terminal; elsewhere (a file, a pipe, CI, a Prefect
worker's log) one plain line per trial, which logs read better than a bar's redraws.
It writes to the stream itself, never through ``print``: inside the flow Prefect turns a
print into a run-log record (``log_prints``), which goes to ``prefect.log``, not the console.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from typing import Any, Iterator, TextIO

from infrarsi.core import progress
from infrarsi.core.trial import TrialResult

JSON_HELP = "print {} as one JSON document on stdout; every other line goes to stderr"


@contextlib.contextmanager
def stdout_to_stderr() -> Iterator[None]:
    """Inside the block, what is written to stdout goes to stderr: ``print``, a library, and a
    child process (which inherits the descriptor, not ``sys.stdout``). With ``--json`` the
    command runs inside it and prints its JSON document after."""
    sys.stdout.flush()
    saved_fd = os.dup(1)
    os.dup2(2, 1)
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        sys.stderr.flush()
        os.dup2(saved_fd, 1)
        os.close(saved_fd)


class Stopped(BaseException):
    """The campaign was stopped by a signal (a BaseException, like KeyboardInterrupt: nothing
    on the way out mistakes it for a stage's failure)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@contextlib.contextmanager
def stop_on_signal() -> Iterator[None]:
    """Inside the block, SIGTERM and SIGHUP raise ``Stopped`` in the main thread, so the
    campaign unwinds (its process guard ends what it started) and says one line."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, frame: Any) -> None:
        signal.alarm(0)  # Ray's native handler armed a 3 s abort before passing the signal here
        raise Stopped(signum)
    previous = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


@contextlib.contextmanager
def native_stderr_to(path: os.PathLike | str) -> Iterator[TextIO]:
    """Inside the block, the process's stderr descriptor writes to ``path`` (what native code
    prints there: Ray's stack dump on a signal, a library's noise); yields a stream on the
    console's stderr for what people must see."""
    sys.stderr.flush()
    console_fd = os.dup(2)
    try:
        on_descriptor = sys.stderr.fileno() == 2
    except (AttributeError, OSError, ValueError):  # stderr replaced by an object of its own (a test's capture)
        on_descriptor = False
    console = os.fdopen(console_fd, "w", buffering=1, closefd=False) if on_descriptor else sys.stderr
    with open(path, "a") as log:
        os.dup2(log.fileno(), 2)
    try:
        yield console
    finally:
        sys.stderr.flush()
        if on_descriptor:
            console.flush()
        os.dup2(console_fd, 2)
        os.close(console_fd)


def trial_line(result: TrialResult, num_done: int, num_total: int) -> str:
    """One trial as a plain progress line: ``trial 12/45 search ok 0.41 s/step``."""
    count = f"{num_done}/{num_total}" if num_total else str(num_done)
    line = f"trial {count} {result.role.value} {result.outcome.value}"
    return line + (f" {result.step_time_s:.3g} s/step" if result.step_time_s is not None else "")


class CampaignConsole:
    """Warnings and progress of one campaign on ``stream`` (stderr): ``warnings`` from before
    any outside system is touched, ``progress`` while the flow runs its trials."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stderr
        self._bar: Any = None

    def line(self, text: str) -> None:
        """Write one line; above the bar, where one is drawn."""
        if self._bar is not None:
            self._bar.write(text, file=self.stream)
        else:
            self.stream.write(text + "\n")
            self.stream.flush()

    @contextlib.contextmanager
    def warnings(self) -> Iterator[None]:
        """Print every warning raised inside the block as an ``infrarsi: warning:`` line."""
        stop = progress.subscribe_warnings(lambda source, message: self.line(f"infrarsi: warning: {message}"))
        try:
            yield
        finally:
            stop()

    @contextlib.contextmanager
    def progress(self, num_total: int, num_done: int) -> Iterator[None]:
        """Show each trial recorded inside the block (a re-measured attempt is not a new trial):
        a bar of ``num_total`` (0: not known yet) on a terminal, a line per trial elsewhere."""
        counted = [num_done]
        if self.stream.isatty():
            from tqdm import tqdm

            self._bar = tqdm(total=num_total or None, initial=num_done, unit="trial", desc="trials",
                             file=self.stream, dynamic_ncols=True)

        def on_result(result: TrialResult) -> None:  # called by the runtime for every recorded attempt
            if result.extra.get("retried"):
                return
            counted[0] += 1
            if self._bar is None:
                self.line(trial_line(result, counted[0], num_total))
            else:
                self._bar.set_postfix_str(f"{result.role.value} {result.outcome.value}", refresh=False)
                self._bar.update(1)

        unsubscribe = progress.subscribe(on_result)
        try:
            yield
        finally:
            unsubscribe()
            if self._bar is not None:
                self._bar.total = self._bar.n  # what ran: at most the cap, fewer when verification decided early
                self._bar.refresh()
                self._bar.close()
                self._bar = None
