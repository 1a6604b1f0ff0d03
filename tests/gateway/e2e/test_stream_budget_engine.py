"""The real SmolLM2 on the in-process engine: a budgeted stream stopped by the gateway aborts its generation.

The engine keeps to ``max_tokens``, so to see the stop this test makes it ignore them (as a faulty
upstream would): ``_sampling`` is wrapped to ask for up to 2000 tokens. The gateway stops the stream
once the output passes what the reservation covers; the engine request must then be aborted (nothing
left running) and its KV blocks freed, long before 2000 tokens could have been generated.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import httpx
import openai
import pytest

from gateway.providers import selfhost
from tests.gateway.e2e.conftest import ADMIN_KEY, start_gateway

if TYPE_CHECKING:
    from pathlib import Path

    from tests.fakes.upstream import FakeUpstream

pytestmark = pytest.mark.slow

POLICY = """
providers:
  local: {kind: selfhost, timeout_s: 120, engine: {max_num_seqs: 4}}
models:
  smollm2: {targets: [{provider: local, model: smollm2, price: {input: 1, output: 2}}]}
"""
QUESTION = [{"role": "user", "content": "Write a long story about a dragon who learns to cook."}]
CAP = 8


def _read(stream, into: list[str]) -> None:
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            into.append(chunk.choices[0].delta.content)


def test_stopped_stream_aborts_the_engine_request_and_frees_its_blocks(
    upstream: FakeUpstream, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    server, key = start_gateway(upstream, tmp_path, POLICY)
    try:
        client = openai.OpenAI(api_key=key, base_url=f"{server.url}/v1", max_retries=0, timeout=120)
        client.chat.completions.create(model="smollm2", messages=QUESTION, max_tokens=2)  # loads the engine
        provider = server.app.state.pipeline.runtime.live.providers["local"]
        idle = provider.load("smollm2")
        assert idle is not None
        assert idle.running == 0
        with httpx.Client(base_url=server.url, headers={"authorization": f"Bearer {ADMIN_KEY}"}, timeout=10) as admin:
            admin.put("/admin/finance/limits", json={"tenant": "acme", "budget_hard_usd": 5.0}).raise_for_status()

        original = selfhost._sampling

        def runaway(request, room):  # an engine that ignores max_tokens
            asked, request.max_tokens = request.max_tokens, None
            try:
                return original(request, min(room, 2000))
            finally:
                request.max_tokens = asked

        monkeypatch.setattr(selfhost, "_sampling", runaway)
        received: list[str] = []
        started = time.monotonic()
        stream = client.chat.completions.create(
            model="smollm2", messages=QUESTION, max_tokens=CAP, stream=True, temperature=0
        )
        with pytest.raises(openai.APIError, match="Stream stopped"):
            _read(stream, received)
        assert received
        deadline = time.monotonic() + 5
        while (load := provider.load("smollm2")) is not None and load.running and time.monotonic() < deadline:
            time.sleep(0.02)
        assert load is not None
        assert (load.running, load.waiting) == (0, 0)  # aborted, not left generating 2000 tokens
        assert load.kv_free == pytest.approx(idle.kv_free)  # its blocks are free again
        assert time.monotonic() - started < 60
        client.close()
    finally:
        server.stop()
