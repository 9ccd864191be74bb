"""The harness clock: reader threads that stamp each line the job writes when it arrives.

Each reader blocks in ``poll`` on its pipe (the job's stdout or stderr) or on the
metrics FIFO, so it wakes as soon as the job writes, not at the next tick of a poll. The
instant its read returns is the stamp of every line that read completes: never before
the job wrote the line, even when the reader was kept off the CPU between waking and
reading and the job wrote more meanwhile. The metrics FIFO is opened read-write by the
harness: a job may open, write and close it any number of times without the reader ever
seeing an end of file. All readers of a trial share one wake-up pipe; ``stop`` drains
what is left and ends them.
"""

from __future__ import annotations

import os
import re
import select
import threading
import time
from pathlib import Path
from typing import Callable

_LINE_END = re.compile(rb"\r\n|\r|\n")  # \r too: progress bars redraw a line without a newline
_CHUNK_BYTES = 1 << 16
_DATA, _EMPTY, _EOF = object(), object(), object()

OnLine = Callable[[str, float], None]


class _Reader(threading.Thread):
    def __init__(self, fd: int, on_line: OnLine, wake_fd: int, tee: Callable[[bytes], None] | None, name: str):
        super().__init__(name=name, daemon=True)
        self.fd, self.on_line, self.wake_fd, self.tee = fd, on_line, wake_fd, tee
        self._partial = b""
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self._loop()
        except BaseException as exc:  # noqa: BLE001 - kept and re-raised by the owner after join
            self.error = exc

    def _loop(self) -> None:
        os.set_blocking(self.fd, False)
        poller = select.poll()
        for fd in (self.fd, self.wake_fd):
            poller.register(fd, select.POLLIN)
        while True:
            ready = {fd for fd, _ in poller.poll()}
            if self.fd in ready:
                if self._read() is _EOF:
                    break  # every writer closed its end
            elif self.wake_fd in ready:
                while self._read() is _DATA:
                    pass
                break
        if self._partial.strip():
            self.on_line(self._partial.decode(errors="replace"), time.monotonic())

    def _read(self) -> object:
        """Read what is there and hand out the lines it completes, stamped when the read
        returned: _DATA, or _EMPTY when nothing was there, or _EOF."""
        try:
            chunk = os.read(self.fd, _CHUNK_BYTES)
        except BlockingIOError:
            return _EMPTY
        stamp = time.monotonic()
        if not chunk:
            return _EOF
        if self.tee is not None:
            self.tee(chunk)
        *lines, self._partial = _LINE_END.split(self._partial + chunk)
        for raw in lines:
            if raw.strip():
                self.on_line(raw.decode(errors="replace"), stamp)
        return _DATA


class StampedReaders:
    """The reader threads of one trial."""

    def __init__(self) -> None:
        self._wake_r, self._wake_w = os.pipe()
        self._readers: list[_Reader] = []
        self._fds_to_close: list[int] = []

    def add(self, fd: int, on_line: OnLine, *, tee: Callable[[bytes], None] | None = None, name: str) -> None:
        """Read ``fd`` (a pipe's read end, owned by the caller) from now on."""
        reader = _Reader(fd, on_line, self._wake_r, tee, name)
        self._readers.append(reader)
        reader.start()

    def add_fifo(self, path: Path, on_line: OnLine, *, name: str) -> None:
        """Make a FIFO at ``path`` and read it; a job opens it like a file, in append mode."""
        os.mkfifo(path)
        # Read-write: opening never blocks, and the harness's own write end means the reader
        # sees no end of file when the job closes the FIFO between lines.
        fd = os.open(path, os.O_RDWR | os.O_NONBLOCK)
        self._fds_to_close.append(fd)
        self.add(fd, on_line, name=name)

    def stop(self, timeout_s: float = 5.0) -> None:
        """Drain what the job wrote and end every reader (after the job's process tree ended)."""
        os.write(self._wake_w, b"x")
        for reader in self._readers:
            reader.join(timeout_s)
        for fd in (*self._fds_to_close, self._wake_r, self._wake_w):
            os.close(fd)
        errors = [r.error for r in self._readers if r.error is not None]
        if errors:
            raise errors[0]

    @property
    def alive(self) -> bool:
        return any(r.is_alive() for r in self._readers)
