"""Run the real gateway for end-to-end tests: the app in a background thread, or `crossway serve` as a process."""

from __future__ import annotations

import asyncio
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import TYPE_CHECKING

import httpx
import uvicorn

from gateway.api.app import create_app

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from pathlib import Path

    from gateway.settings import Settings


class GatewayServer:
    """The gateway built from ``settings``, served by uvicorn on 127.0.0.1 and a free port."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.app = create_app(settings)
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self.port = self._sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(self.app, log_level="warning", access_log=False, lifespan="on", loop="asyncio")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._run, name="gateway-under-test", daemon=True)

    def _run(self) -> None:
        asyncio.run(self._server.serve(sockets=[self._sock]))

    def start(self) -> GatewayServer:
        self._thread.start()
        deadline = time.monotonic() + 20
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("gateway did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)
        self._sock.close()


def wait_ready(url: str, proc: subprocess.Popen[bytes], seconds: float = 30) -> None:
    """Wait for ``/readyz`` of a `crossway serve` process; fail if it exits or stays unready."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert proc.poll() is None, "crossway serve exited early"
        try:
            if httpx.get(f"{url}/readyz", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise AssertionError("crossway serve did not become ready")


_STDERR: dict[int, Path] = {}
"""Each `crossway serve` process's stderr file, by pid (read by ``stop_processes`` when one hangs)."""


def serve_process(cwd: Path, env: Mapping[str, str]) -> tuple[subprocess.Popen[bytes], str]:
    """Start `crossway serve` in ``cwd`` with ``env`` on a free port; return it, ready, and its URL.

    Its stderr goes to a file in ``cwd``, and Python's faulthandler is on, so that a process which
    hangs can be made to print every thread's stack (``stop_processes``).
    """
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    stderr = cwd / f"crossway-serve-{port}.stderr"
    with stderr.open("wb") as err:
        proc = subprocess.Popen(  # noqa: S603 - our own console script, fixed arguments
            [
                sys.executable,
                "-X",
                "faulthandler",
                "-c",
                "from gateway.cli import main; raise SystemExit(main())",
                "serve",
                "--port",
                str(port),
            ],
            cwd=cwd,
            env=dict(env),
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
    _STDERR[proc.pid] = stderr
    url = f"http://127.0.0.1:{port}"
    wait_ready(url, proc)
    return proc, url


def stop_processes(procs: Sequence[subprocess.Popen[bytes]], seconds: float = 20) -> dict[int, str]:
    """SIGINT `crossway serve` processes together and reap them; empty once all stopped within ``seconds``.

    One that does not stop gets SIGABRT, on which faulthandler prints every thread's stack, then
    SIGKILL if it still lives; the result maps its pid to the end of its stderr, stacks included.
    """
    for proc in procs:
        proc.send_signal(signal.SIGINT)
    deadline = time.monotonic() + seconds
    hung: dict[int, str] = {}
    for proc in procs:
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            continue
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGABRT)
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        path = _STDERR.get(proc.pid)
        hung[proc.pid] = path.read_text(errors="replace")[-6000:] if path is not None else "(no stderr file)"
    return hung
