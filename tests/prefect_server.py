"""A real Prefect server on loopback for the tests that need one (deployments, and CLI
campaigns in subprocesses, which then skip starting a temporary server each)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

REPO = Path(__file__).resolve().parents[1]


@dataclass
class PrefectServer:
    api_url: str
    env: dict[str, str]
    home: Path

    def cli(self, *args: str, timeout: float = 120, cwd: Path = REPO) -> subprocess.CompletedProcess:
        out = subprocess.run([sys.executable, "-m", "prefect", *args], env=self.env, cwd=cwd,
                             capture_output=True, text=True, timeout=timeout)
        assert out.returncode == 0, f"prefect {' '.join(args)} failed:\n{out.stdout}\n{out.stderr}"
        return out

    def start(self, *args: str, log: Path) -> subprocess.Popen:
        """A long-running prefect command (a worker), stopped by ``stop``."""
        return subprocess.Popen([sys.executable, "-m", "prefect", *args], env=self.env, cwd=REPO,
                                stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True)

    def api(self, method: str, path: str, **kw) -> httpx.Response:
        return httpx.request(method, self.api_url + path, timeout=30, **kw)


def stop(proc: subprocess.Popen) -> None:
    """SIGTERM the process group, SIGKILL what is left after 20 s."""
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def prefect_server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("prefect-server")
    port = free_port()
    api_url = f"http://127.0.0.1:{port}/api"
    bin_dir = str(Path(sys.executable).parent)
    env = {**os.environ, "PREFECT_HOME": str(tmp / "home"), "PREFECT_API_URL": api_url,
           "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "PREFECT_UI_ENABLED": "false",
           "PREFECT_WORKER_QUERY_SECONDS": "1", "PREFECT_WORKER_PREFETCH_SECONDS": "1",
           "PATH": bin_dir + os.pathsep + os.environ.get("PATH", ""),
           "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)}
    log = tmp / "server.log"
    server = subprocess.Popen([sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1",
                               "--port", str(port), "--analytics-off"], env=env, cwd=tmp,
                              stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.time() + 90
        while True:
            assert server.poll() is None, log.read_text()
            try:
                if httpx.get(api_url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.time() < deadline, "the Prefect server did not come up in 90 s:\n" + log.read_text()
            time.sleep(0.5)
        yield PrefectServer(api_url=api_url, env=env, home=tmp / "home")
    finally:
        stop(server)
