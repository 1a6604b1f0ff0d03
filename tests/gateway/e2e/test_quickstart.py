"""The README's first command: ``crossway serve`` on a fresh machine, as a real process."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from typing import TYPE_CHECKING

import msgspec
import openai

from tests.gateway.e2e.conftest import _free_port
from tests.gateway.e2e.server import wait_ready

if TYPE_CHECKING:
    from pathlib import Path

    from tests.fakes.upstream import FakeUpstream


def test_serve_on_a_fresh_directory_migrates_prints_one_key_and_serves(tmp_path: Path, upstream: FakeUpstream):
    port = _free_port()
    env = {
        **os.environ,
        "OPENAI_API_KEY": "sk-fake-openai",
        "OPENAI_BASE_URL": f"{upstream.url}/v1",
        "CROSSWAY_LOG_LEVEL": "info",
    }
    env.pop("DATABASE_URL", None)
    proc = subprocess.Popen(  # noqa: S603 - our own console script, fixed arguments
        [sys.executable, "-c", "from gateway.cli import main; raise SystemExit(main())", "serve", "--port", str(port)],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, proc)
        with openai.OpenAI(base_url=f"{url}/v1", api_key="cw-not-yet", max_retries=0) as bad:
            try:
                bad.models.list()
                raise AssertionError("an unknown key was accepted")
            except openai.AuthenticationError:
                pass
    finally:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=20)
    text = err.decode()
    keys = re.findall(r"cw-[A-Za-z0-9_-]{20,}", text)
    assert len(keys) == 1, "the bootstrap key is printed exactly once"
    assert (tmp_path / "crossway.db").exists()
    assert proc.returncode == 0


def test_request_logs_carry_request_id_and_never_the_prompt(tmp_path: Path, upstream: FakeUpstream):
    port = _free_port()
    env = {
        **os.environ,
        "OPENAI_API_KEY": "sk-fake-openai",
        "OPENAI_BASE_URL": f"{upstream.url}/v1",
        "DATABASE_URL": f"sqlite:///{tmp_path / 'db.sqlite'}",
    }
    proc = subprocess.Popen(  # noqa: S603
        [sys.executable, "-c", "from gateway.cli import main; raise SystemExit(main())", "serve", "--port", str(port)],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, proc)
        # the bootstrap key is on stderr; read it from the database instead of racing the pipe
        key = (
            subprocess.run(
                [
                    sys.executable,
                    "-c",
                    "from gateway.cli import main; raise SystemExit(main())",
                    "keys",
                    "create",
                    "--tenant",
                    "logs",
                ],
                cwd=tmp_path,
                env=env,
                capture_output=True,
                check=True,
            )
            .stdout.decode()
            .strip()
        )
        with openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0) as client:
            client.chat.completions.create(
                model="gpt-4o-mini", messages=[{"role": "user", "content": "SECRET-PROMPT-42"}]
            )
            list(
                client.chat.completions.create(
                    model="gpt-4o-mini", stream=True, messages=[{"role": "user", "content": "SECRET-PROMPT-43"}]
                )
            )
    finally:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=20)
    lines = [msgspec.json.decode(ln) for ln in err.splitlines() if ln.startswith(b"{")]
    done = [ln for ln in lines if ln["event"] == "request_done"]
    assert len(done) == 2 and all(ln["request_id"] and ln["tenant"] == "logs" for ln in done)
    assert {ln["status"] for ln in done} == {200}
    assert b"SECRET-PROMPT" not in err and b"echo:" not in err and b"sk-fake-openai" not in err
