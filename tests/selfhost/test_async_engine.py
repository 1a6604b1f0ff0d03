"""The async engine: concurrent streams, immediate abort, errors on the stream."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import pytest

from selfhost.async_engine import AsyncEngine
from selfhost.sampling import SamplingParams
from tests.selfhost.conftest import CHAT_PROMPTS, chat_ids, make_engine

if TYPE_CHECKING:
    from collections.abc import Iterator

    from tests.selfhost.conftest import Loaded

pytestmark = pytest.mark.slow
GREEDY = SamplingParams(max_tokens=8, temperature=0)


@pytest.fixture
def engine(smollm2: Loaded) -> Iterator[AsyncEngine]:
    async_engine = AsyncEngine(make_engine(smollm2))
    async_engine.start()
    yield async_engine
    async_engine.close()


async def collect(engine: AsyncEngine, prompt: list[int], params: SamplingParams = GREEDY) -> list[int]:
    return [t async for out in engine.generate(prompt, params) for t in out.token_ids]


async def test_concurrent_streams_equal_sync_generation(engine: AsyncEngine, smollm2: Loaded) -> None:
    prompts = [chat_ids(smollm2, p) for p in CHAT_PROMPTS[:4]]
    expected = make_engine(smollm2).generate(prompts, GREEDY)
    got = await asyncio.gather(*(collect(engine, p) for p in prompts))
    assert got == expected
    snap = engine.metrics_snapshot()
    assert snap.generation_tokens_total == sum(map(len, expected))
    assert snap.ttft.count == 4


async def test_abort_frees_blocks_immediately(engine: AsyncEngine, smollm2: Loaded) -> None:
    pool = engine.engine.kv.pool
    long = SamplingParams(max_tokens=200, temperature=0, ignore_eos=True)
    stream = engine.generate(chat_ids(smollm2, "Write a long story."), long, request_id="victim")
    await anext(stream)
    assert await engine.call(pool.num_free_blocks) < pool.num_blocks
    await engine.abort("victim")
    assert await engine.call(pool.num_free_blocks) == pool.num_blocks
    with pytest.raises(RuntimeError, match="aborted"):
        async for _ in stream:
            pass


async def test_consumer_leaving_aborts_the_request(engine: AsyncEngine, smollm2: Loaded) -> None:
    """A client that stops reading (closed stream, cancelled task) frees its blocks before the next step."""
    pool = engine.engine.kv.pool
    long = SamplingParams(max_tokens=200, temperature=0, ignore_eos=True)
    stream = engine.generate(chat_ids(smollm2, "Write a long story."), long)
    await anext(stream)
    await stream.aclose()
    assert await engine.call(pool.num_free_blocks) == pool.num_blocks
    assert await engine.call(engine.engine.has_unfinished_requests) is False

    async def consume() -> None:
        async for _ in engine.generate(chat_ids(smollm2, "Another long story."), long):
            pass

    task = asyncio.create_task(consume())
    await asyncio.sleep(0.3)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await engine.call(pool.num_free_blocks) == pool.num_blocks


async def test_invalid_request_raises_on_the_stream_and_others_continue(engine: AsyncEngine, smollm2: Loaded) -> None:
    with pytest.raises(ValueError, match="the prompt is empty"):
        await anext(engine.generate([], GREEDY))
    assert len(await collect(engine, chat_ids(smollm2, "Hi"))) == 8


async def test_a_steps_outputs_reach_every_stream_in_one_loop_callback(
    engine: AsyncEngine, smollm2: Loaded, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each ``call_soon_threadsafe`` wakes the loop through a socket write: a step hands all its outputs over in one."""
    loop = asyncio.get_running_loop()
    calls: list[object] = []
    handover = loop.call_soon_threadsafe

    def counted(callback: object, *args: object) -> object:
        calls.append(callback)
        return handover(callback, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(loop, "call_soon_threadsafe", counted)
    prompts = [chat_ids(smollm2, p) for p in CHAT_PROMPTS[:4]]
    long = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    got = await asyncio.gather(*(collect(engine, p, long) for p in prompts))
    assert [len(g) for g in got] == [12] * 4
    # 4 admissions, then at most one hand-over per step: 4 streams x 12 tokens in 13 steps or so
    handovers = len(calls) - 4
    assert 12 <= handovers <= 16, handovers
