"""The compose topology: the gateway reaches the engine's own server over HTTP, as an OpenAI-compatible upstream."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import TYPE_CHECKING

import openai
import pytest
import uvicorn

from gateway.settings import DEFAULT_POLICY, Settings
from gateway.store.db import Database
from gateway.store.keys import KeyStore
from gateway.store.migrate import migrate
from tests.gateway.e2e.conftest import _free_port
from tests.gateway.e2e.server import GatewayServer

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

pytestmark = pytest.mark.slow

QUESTION = [{"role": "user", "content": "Name three colours."}]


@pytest.fixture(scope="module")
def engine_url() -> Iterator[str]:
    from selfhost.async_engine import AsyncEngine
    from selfhost.config import EngineConfig
    from selfhost.server import create_app

    engine = AsyncEngine.from_model("smollm2", EngineConfig(max_num_seqs=4))
    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(engine), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}/v1"
    server.should_exit = True
    thread.join(timeout=10)
    engine.close()


async def _key(url: str) -> str:
    await migrate(url)
    async with Database.connect(url) as db:
        return (await KeyStore(db).create_key("compose"))[1]


def test_default_policy_sends_smollm2_to_the_engine_server_with_the_same_greedy_text(engine_url, tmp_path: Path):
    url = f"sqlite+aiosqlite:///{tmp_path / 'gw.db'}"
    key = asyncio.run(_key(url))
    settings = Settings(
        database_url=url, policy_path=DEFAULT_POLICY, bootstrap=False, env={"CROSSWAY_ENGINE_URL": engine_url}
    )
    gateway = GatewayServer(settings).start()
    try:
        with openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=key, max_retries=0, timeout=120) as client:
            remote = client.chat.completions.with_raw_response.create(
                model="smollm2", messages=QUESTION, temperature=0, max_tokens=16
            )
            local = client.chat.completions.create(
                model="local/smollm2", messages=QUESTION, temperature=0, max_tokens=16
            )
            streamed = client.chat.completions.create(
                model="smollm2", messages=QUESTION, temperature=0, max_tokens=16, stream=True
            )
            streamed_text = "".join(c.choices[0].delta.content or "" for c in streamed if c.choices)
    finally:
        gateway.stop()
    assert remote.headers["x-crossway-provider"] == "engine"
    text = remote.parse().choices[0].message.content
    assert text and text == local.choices[0].message.content == streamed_text
    assert remote.parse().usage.completion_tokens == local.usage.completion_tokens
