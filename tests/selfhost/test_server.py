"""The engine's own OpenAI-compatible server, driven by the official openai SDK over loopback."""

from __future__ import annotations

import socket
import threading
import time
from dataclasses import replace
from typing import TYPE_CHECKING

import httpx
import openai
import pytest
import uvicorn

from selfhost.async_engine import AsyncEngine
from selfhost.config import EngineConfig
from selfhost.server import build_parser, create_app, engine_config
from tests.selfhost.conftest import make_engine

if TYPE_CHECKING:
    from collections.abc import Iterator

    from tests.selfhost.conftest import Loaded

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def base_url(smollm2: Loaded) -> Iterator[str]:
    engine = AsyncEngine(make_engine(smollm2))
    engine.start()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(
        uvicorn.Config(create_app(engine), host="127.0.0.1", port=port, log_level="warning", lifespan="on")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(timeout=10)
    engine.close()


@pytest.fixture
def client(base_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0)


MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]


def test_chat_completion_not_streamed(client: openai.OpenAI) -> None:
    resp = client.chat.completions.create(model="smollm2", messages=MESSAGES, max_tokens=12, temperature=0)
    assert "Paris" in (resp.choices[0].message.content or "")
    assert resp.choices[0].finish_reason in ("stop", "length")
    assert resp.usage is not None
    assert resp.usage.total_tokens == resp.usage.prompt_tokens + resp.usage.completion_tokens


def test_chat_completion_streamed_equals_not_streamed(client: openai.OpenAI) -> None:
    whole = client.chat.completions.create(model="smollm2", messages=MESSAGES, max_tokens=12, temperature=0)
    chunks = list(
        client.chat.completions.create(
            model="smollm2",
            messages=MESSAGES,
            max_tokens=12,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


def test_chat_logprobs(client: openai.OpenAI) -> None:
    resp = client.chat.completions.create(
        model="smollm2", messages=MESSAGES, max_tokens=3, temperature=0, logprobs=True, top_logprobs=2
    )
    content = resp.choices[0].logprobs.content
    assert len(content) == 3
    assert all(len(c.top_logprobs) == 2 and c.logprob <= 0 for c in content)


def test_completions_streamed_and_not(client: openai.OpenAI) -> None:
    whole = client.completions.create(model="smollm2", prompt="The capital of France is", max_tokens=6, temperature=0)
    streamed = client.completions.create(
        model="smollm2", prompt="The capital of France is", max_tokens=6, temperature=0, stream=True
    )
    assert "".join(c.choices[0].text for c in streamed) == whole.choices[0].text
    assert whole.usage.completion_tokens == 6


def test_models_health_and_metrics(client: openai.OpenAI, base_url: str) -> None:
    assert [m.id for m in client.models.list()] == ["smollm2"]
    assert httpx.get(f"{base_url}/health").json() == {"status": "ok"}
    client.chat.completions.create(model="smollm2", messages=MESSAGES, max_tokens=2, temperature=0)
    text = httpx.get(f"{base_url}/metrics").text
    assert 'crossway_engine_kv_blocks_free{model="smollm2"}' in text
    assert "crossway_engine_time_to_first_token_seconds_count" in text


def test_errors_are_openai_shaped(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError, match="not served here"):
        client.chat.completions.create(model="gpt-9", messages=MESSAGES)
    with pytest.raises(openai.BadRequestError, match="top_p must be in"):
        client.chat.completions.create(model="smollm2", messages=MESSAGES, top_p=2.0)
    with pytest.raises(openai.BadRequestError, match="the prompt is empty"):
        client.completions.create(model="smollm2", prompt="", max_tokens=2)
    with pytest.raises(openai.BadRequestError, match="exceeds the context"):
        client.completions.create(model="smollm2", prompt="hi", max_tokens=100000)


def test_cli_parser_defaults() -> None:
    args = build_parser().parse_args(["--model", "smollm2", "--port", "9000"])
    assert (args.model, args.host, args.port) == ("smollm2", "127.0.0.1", 9000)


def test_cli_without_flags_gives_the_engine_config_defaults() -> None:
    config = engine_config(build_parser().parse_args([]))
    assert config == replace(EngineConfig(), served_model_name="smollm2")


def test_cli_flags_reach_the_engine_config() -> None:
    argv = ["--model", "m.gguf", "--dtype", "bfloat16", "--device", "cuda", "--quantization", "int4"]
    argv += ["--max-num-seqs", "7", "--max-num-batched-tokens", "300", "--mixed-prefill-tokens", "0"]
    argv += ["--max-model-len", "1024", "--num-kv-blocks", "99", "--no-prefix-caching", "--served-model-name", "x"]
    config = engine_config(build_parser().parse_args(argv))
    assert config == replace(
        EngineConfig(),
        served_model_name="x",
        dtype="bfloat16",
        device="cuda",
        quantization="int4",
        max_num_seqs=7,
        max_num_batched_tokens=300,
        mixed_prefill_tokens=0,
        max_model_len=1024,
        num_kv_blocks=99,
        enable_prefix_caching=False,
    )
