"""Runs an ``LLMEngine`` on a background thread and streams each request's outputs to asyncio.

Owns the engine thread, the command queue into it (add, abort, snapshot: the only way other
threads touch the engine) and one ``asyncio.Queue`` per request that the thread feeds. When a
consumer stops iterating (client gone, task cancelled), the request is aborted and its KV blocks
are freed before the engine's next step. Does not own HTTP (``server``) or the step (``engine``).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import queue
import threading
from typing import TYPE_CHECKING, Any

from selfhost.engine import LLMEngine

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable, Sequence
    from pathlib import Path

    from selfhost.config import EngineConfig
    from selfhost.metrics import MetricsSnapshot
    from selfhost.output import RequestOutput
    from selfhost.sampling import SamplingParams

_Stream = tuple[asyncio.AbstractEventLoop, "asyncio.Queue[RequestOutput | BaseException]"]


class AsyncEngine:
    """Thread-backed async front of one engine. Create it, then ``start()``; ``close()`` when done."""

    def __init__(self, engine: LLMEngine) -> None:
        self.engine = engine
        self._commands: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._wake = threading.Event()
        self._stop = False
        self._streams: dict[str, _Stream] = {}
        self._ids = itertools.count()
        self._thread: threading.Thread | None = None
        self._snapshot = engine.metrics_snapshot()

    @classmethod
    def from_model(cls, model: str | Path, config: EngineConfig | None = None) -> AsyncEngine:
        """Load a model (see ``LLMEngine.from_model``) and start its engine thread."""
        engine = cls(LLMEngine.from_model(model, config))
        engine.start()
        return engine

    @property
    def tokenizer(self) -> Any:
        """The model's tokenizer (thread-safe to read)."""
        return self.engine.tokenizer

    @property
    def model_name(self) -> str:
        """The served model name."""
        return self.engine.model_name

    def start(self) -> None:
        """Start the engine thread (idempotent)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="crossway-engine", daemon=True)
            self._thread.start()

    def close(self) -> None:
        """Stop the engine thread; live streams end with an error."""
        self._stop = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    async def generate(
        self,
        prompt: str | Sequence[int],
        params: SamplingParams,
        *,
        request_id: str | None = None,
        tenant: str | None = None,
        cache_salt: str | None = None,
        stream: bool = True,
    ) -> AsyncIterator[RequestOutput]:
        """Stream a request's outputs, one per step that produced a token; the last has ``finished`` set.

        ``stream=False``: one output when it finishes, unless it has stop strings (``LLMEngine.add_request``).

        Raises:
            ValueError: the request is invalid (raised on the first ``__anext__``).
            RuntimeError: the engine failed or was closed while the request ran.
        """
        loop = asyncio.get_running_loop()
        rid = request_id or f"req-{next(self._ids)}"
        tokenizer = self.engine.tokenizer
        if isinstance(prompt, str) and tokenizer is not None:
            # NOTE(crossway): encoded here, on a worker thread, not on the engine thread between
            # steps, where a long prompt would hold up every running stream's next token.
            prompt = await asyncio.to_thread(tokenizer.encode, prompt)
        outputs: asyncio.Queue[RequestOutput | BaseException] = asyncio.Queue()
        added: asyncio.Future[None] = loop.create_future()

        def add() -> None:
            try:
                self.engine.add_request(rid, prompt, params, tenant=tenant, cache_salt=cache_salt, stream=stream)
            except ValueError as exc:
                _post(loop, _settle, added, exc)
                return
            self._streams[rid] = (loop, outputs)
            _post(loop, _settle, added, None)

        self._submit(add)
        await added
        finished = False
        try:
            while not finished:
                item = await outputs.get()
                if isinstance(item, BaseException):
                    raise item
                finished = item.finished
                yield item
        finally:
            if not finished:  # the consumer went away: free the request's blocks now
                self._submit(lambda: self._abort_now(rid))

    async def abort(self, request_id: str) -> None:
        """Abort a request and return once its KV blocks are free."""
        await self.call(lambda: self._abort_now(request_id))

    async def call(self, fn: Callable[[], Any]) -> Any:
        """Run ``fn`` on the engine thread between steps and return its result (for inspection and tests)."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[Any] = loop.create_future()

        def run() -> None:
            try:
                result = fn()
            except Exception as exc:  # noqa: BLE001 (handed to the caller)
                _post(loop, _settle_error, done, exc)
            else:
                _post(loop, _settle, done, result)

        self._submit(run)
        return await done

    def metrics_snapshot(self) -> MetricsSnapshot:
        """The metrics as of the end of the latest step (any thread)."""
        return self._snapshot

    # engine thread

    def _submit(self, command: Callable[[], None]) -> None:
        self._commands.put(command)
        self._wake.set()

    def _abort_now(self, request_id: str) -> None:
        self.engine.abort([request_id])
        stream = self._streams.pop(request_id, None)
        if stream is not None:
            _post(stream[0], stream[1].put_nowait, RuntimeError(f"request {request_id} was aborted"))

    def _run(self) -> None:
        while not self._stop:
            while not self._commands.empty():
                self._commands.get_nowait()()
            if not self.engine.has_unfinished_requests():
                self._snapshot = self.engine.metrics_snapshot()
                self._wake.wait()
                self._wake.clear()
                continue
            try:
                outputs = self.engine.step()
            except Exception as exc:  # noqa: BLE001 (reported to every live stream, then the engine goes on)
                self._fail_all(RuntimeError(f"engine step failed: {exc!r}"))
                continue
            self._snapshot = self.engine.metrics_snapshot()  # before delivery: a finished stream sees its own step
            self._deliver(outputs)
        self._fail_all(RuntimeError("the engine was closed"))

    def _deliver(self, outputs: list[RequestOutput]) -> None:
        """Hand a step's outputs to their streams: one callback per event loop, not one per output.

        NOTE(crossway): each ``call_soon_threadsafe`` wakes its loop through a socket write, ~7 us
        of the engine thread on the CPU VM while the loop consumes (bench/host_step.py
        --through-async), so 256 streams cost ~1.8 ms a step handed over one by one.
        """
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Queue[Any], RequestOutput]]] = {}
        for out in outputs:
            stream = self._streams.get(out.request_id)
            if stream is None:
                continue
            if out.finished:
                del self._streams[out.request_id]
            by_loop.setdefault(stream[0], []).append((stream[1], out))
        for loop, items in by_loop.items():
            _post(loop, _put_all, items)

    def _fail_all(self, error: RuntimeError) -> None:
        self.engine.abort(list(self.engine.scheduler.requests))
        for loop, outputs in self._streams.values():
            _post(loop, outputs.put_nowait, error)
        self._streams.clear()


def _post(loop: asyncio.AbstractEventLoop, fn: Callable[..., Any], *args: Any) -> None:
    """Schedule ``fn(*args)`` on ``loop`` from the engine thread; a closed loop (its client gone) is skipped."""
    with contextlib.suppress(RuntimeError):
        loop.call_soon_threadsafe(fn, *args)


def _put_all(items: list[tuple[asyncio.Queue[Any], RequestOutput]]) -> None:
    for outputs, out in items:
        outputs.put_nowait(out)


def _settle(future: asyncio.Future[Any], result: Any) -> None:
    if future.done():
        return
    if isinstance(result, BaseException):
        future.set_exception(result)
    else:
        future.set_result(result)


def _settle_error(future: asyncio.Future[Any], error: BaseException) -> None:
    if not future.done():
        future.set_exception(error)
