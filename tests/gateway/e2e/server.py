"""Run the real gateway for end-to-end tests: the app in a background thread, or `crossway serve` as a process."""

from __future__ import annotations

import asyncio
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
    from collections.abc import Mapping
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


def serve_process(cwd: Path, env: Mapping[str, str]) -> tuple[subprocess.Popen[bytes], str]:
    """Start `crossway serve` in ``cwd`` with ``env`` on a free port; return it, ready, and its URL."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    proc = subprocess.Popen(  # noqa: S603 - our own console script, fixed arguments
        [sys.executable, "-c", "from gateway.cli import main; raise SystemExit(main())", "serve", "--port", str(port)],
        cwd=cwd,
        env=dict(env),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    wait_ready(url, proc)
    return proc, url
