"""Addresses for fault tests: a port nothing listens on (connections refused at once), and
a server that accepts every connection and hangs up without a byte, counting them (so a
test can tell how many requests a client made against a broken server, not how long)."""

from __future__ import annotations

import contextlib
import socket
import threading
from typing import Iterator


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class HangUp:
    """Accepts connections on loopback and closes each at once; ``connections`` counts them."""

    def __init__(self) -> None:
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(64)
        self.port = self._sock.getsockname()[1]
        self.connections = 0
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:  # closed by close()
                return
            self.connections += 1
            conn.close()

    def close(self) -> None:
        try:
            self._sock.shutdown(socket.SHUT_RDWR)  # wakes the accept() blocked in the thread
        except OSError:
            pass
        self._sock.close()
        self._thread.join(timeout=5)


@contextlib.contextmanager
def hang_up_server() -> Iterator[HangUp]:
    server = HangUp()
    try:
        yield server
    finally:
        server.close()
