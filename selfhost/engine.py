"""The engine core: requests in, one step at a time, outputs out.

Owns the step (``schedule -> run model -> sample -> emit outputs``), request validation and the
wiring of scheduler, KV cache manager, model runner, sampler, output processor and metrics. Does
not own threads or asyncio (``async_engine``), HTTP (``server``) or fetching models (``fetch``).
Single-threaded: every method must be called from one thread.
"""

from __future__ import annotations

import struct
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from selfhost import loader
from selfhost.block_hash import pack_token_ids
from selfhost.config import EngineConfig, ModelConfig
from selfhost.kv_cache import KVCacheManager
from selfhost.metrics import EngineMetrics, MetricsSnapshot
from selfhost.output import OutputProcessor, RequestOutput
from selfhost.request import Request, RequestStatus
from selfhost.runner import ModelRunner, kv_bytes_per_block
from selfhost.sampling import PendingSample, SamplingParams
from selfhost.scheduler import ScheduledBatch, Scheduler

if TYPE_CHECKING:
    from collections.abc import Sequence

    from selfhost.models.llama import LlamaForCausalLM
    from selfhost.tokenizer import Tokenizer

_DEFAULT_MAX_MODEL_LEN = 8192


@dataclass(slots=True)
class _Launched:
    """A step on the device: its plan, its sampling requests and their picks on the way back."""

    batch: ScheduledBatch
    sampling: list[Request]
    picks: PendingSample
    started: float
    finished_before: int
    """``Scheduler.num_finished`` at launch: while it holds, none of the step's requests has finished."""


class LLMEngine:
    """A model, its paged KV cache and a scheduler; ``step`` runs one iteration over all live requests."""

    def __init__(
        self,
        model: LlamaForCausalLM,
        model_config: ModelConfig,
        tokenizer: Tokenizer | None,
        config: EngineConfig | None = None,
        model_name: str = "model",
    ) -> None:
        cfg = config or EngineConfig()
        if model.quantization != cfg.quantization:
            raise ValueError(
                f"the model is quantized as {model.quantization!r} but the config asks for {cfg.quantization!r}; "
                "call model.quantize(...) first (from_model does it)"
            )
        self.config = cfg
        self.model_config = model_config
        self.tokenizer = tokenizer
        self.model_name = cfg.served_model_name or model_name
        dtype = loader.torch_dtype(cfg.dtype)
        block_bytes = kv_bytes_per_block(model_config, cfg.block_size, dtype)
        num_blocks = cfg.num_kv_blocks or max(1, cfg.kv_cache_memory_bytes // block_bytes)
        self.max_model_len = min(_max_model_len(cfg, model_config, num_blocks), model.max_positions)
        self.kv = KVCacheManager(num_blocks, cfg.block_size, cfg.enable_prefix_caching)
        eos = set(model_config.eos_token_ids) | set(tokenizer.eos_token_ids if tokenizer else ())
        self.scheduler = Scheduler(cfg, self.kv, self.max_model_len, eos)
        self.runner = ModelRunner(
            model,
            model_config,
            num_blocks,
            cfg.block_size,
            dtype,
            cfg.device,
            use_kernels=cfg.kernels_enabled,
            graph_batch_sizes=cfg.graph_batch_sizes(),
            graph_token_sizes=cfg.graph_token_sizes(),
            max_model_len=self.max_model_len,
            max_num_seqs=cfg.max_num_seqs,
            mixed_prefill_tokens=cfg.mixed_prefill_tokens,
        )
        self.outputs = OutputProcessor(tokenizer)
        self.metrics = EngineMetrics(model_config, cfg, model.weight_bytes(), block_bytes // cfg.block_size)
        self._in_flight: _Launched | None = None
        self._finished_at = 0.0

    @classmethod
    def from_model(cls, model: str | Path, config: EngineConfig | None = None) -> LLMEngine:
        """Load a model by name (``smollm2``), GGUF file or Hugging Face folder, fetching the default one if needed."""
        from selfhost.fetch import resolve_model
        from selfhost.tokenizer import load_tokenizer

        cfg = config or EngineConfig()
        if cfg.num_threads:
            torch.set_num_threads(cfg.num_threads)
        path = resolve_model(str(model))
        model_cfg = loader.load_model_config(path)
        max_positions = min(cfg.max_model_len or _DEFAULT_MAX_MODEL_LEN, model_cfg.max_position_embeddings)
        net = loader.load_model(path, model_cfg, loader.torch_dtype(cfg.dtype), max_positions)
        tokenizer = load_tokenizer(path, model_cfg.eos_token_ids, model_cfg.bos_token_id)
        name = str(model) if not Path(str(model)).exists() else path.stem
        net = net.to(cfg.device)
        if cfg.quantization == "gguf":
            from selfhost.models.gguf_native import load_native

            load_native(net, path)
        else:
            net.quantize(cfg.quantization, cfg.quant_group_size, kernels=cfg.kernels_enabled)
        return cls(net, model_cfg, tokenizer, cfg, model_name=name)

    # requests in

    def add_request(
        self,
        request_id: str,
        prompt: str | Sequence[int],
        params: SamplingParams,
        *,
        tenant: str | None = None,
        cache_salt: str | None = None,
        stream: bool = True,
    ) -> Request:
        """Validate and queue a request.

        Args:
            request_id: unique among live requests.
            prompt: text (encoded with the model's tokenizer, BOS added if the model wants it) or token ids.
            params: sampling parameters.
            tenant: whose request this is; salts its block hashes when ``salt_by_tenant`` is on.
            cache_salt: explicit salt that overrides the tenant's (a policy letting tenants share KV).
            stream: an output every step; False: one output when the request finishes, unless it
                has stop strings (``OutputProcessor.add``).

        Raises:
            ValueError: empty prompt, prompt or prompt + max_tokens beyond the context, unknown
                token ids, or a duplicate request id.
        """
        if request_id in self.scheduler.requests:
            raise ValueError(f"request id {request_id!r} is already live")
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError("this engine has no tokenizer; pass token ids")
            token_ids = self.tokenizer.encode(prompt)
        else:
            token_ids = list(prompt)
        packed = self._validate(token_ids, params)
        salt = cache_salt if cache_salt is not None else (tenant if self.config.salt_by_tenant else None)
        request = Request(request_id, token_ids, params, cache_salt=salt, packed_prompt=packed)
        self.scheduler.add_request(request)
        self.outputs.add(request, stream=stream)
        return request

    def _validate(self, token_ids: list[int], params: SamplingParams) -> bytes:
        """Check the prompt and its budget; return its ids packed as the block hashes read them."""
        if not token_ids:
            raise ValueError("the prompt is empty")
        bad_ids = f"prompt token ids must be integers in [0, {self.model_config.vocab_size})"
        # NOTE(crossway): packed once, for the range check and for the block hashes, which then
        # skip packing (a 4k hit's lookup 0.18 against 0.26 ms on the H100's host; the check 0.07
        # against 0.075 ms for min() and max() there, 0.08 against 0.25 on the CPU VM;
        # bench/prefix_lookup_cost.py)
        try:
            packed = pack_token_ids(token_ids)
        except struct.error as exc:
            raise ValueError(bad_ids) from exc
        ids = np.frombuffer(packed, dtype="<i4")
        if ids.min() < 0 or ids.max() >= self.model_config.vocab_size:
            raise ValueError(bad_ids)
        if len(token_ids) >= self.max_model_len:
            raise ValueError(
                f"the prompt has {len(token_ids)} tokens; this model's context is {self.max_model_len} "
                "(shorten the prompt or raise max_model_len)"
            )
        if len(token_ids) + params.max_tokens > self.max_model_len:
            raise ValueError(
                f"prompt ({len(token_ids)} tokens) + max_tokens ({params.max_tokens}) exceeds the context "
                f"of {self.max_model_len} tokens; lower max_tokens to at most {self.max_model_len - len(token_ids)}"
            )
        return packed

    def abort(self, request_ids: Sequence[str]) -> None:
        """End requests now and free their KV blocks at once (unknown ids are ignored)."""
        for request_id in request_ids:
            request = self.scheduler.requests.get(request_id)
            if request is not None:
                self.scheduler.finish(request, RequestStatus.FINISHED_ABORTED)
                self.outputs.remove(request_id)

    def has_unfinished_requests(self) -> bool:
        """Whether any request is waiting or running, or a step's tokens are still on their way back."""
        return self.scheduler.has_unfinished() or self._in_flight is not None

    # the loop

    def step(self) -> list[RequestOutput]:
        """Run one iteration: schedule -> run model -> sample -> emit outputs.

        With async scheduling the step launched here runs on the device while the previous one's
        tokens come back and become outputs, so each call returns the outputs of the step before
        (and the last call of a run, with nothing left to plan, those of the last step). A step
        with seeded random rows (sampled on the host) is finished at once, since the next step
        needs its tokens.
        """
        batch = self.scheduler.schedule()
        launched = self._launch(batch) if batch.requests else None
        previous, self._in_flight = self._in_flight, None
        outputs = self._finish(previous) if previous is not None else []
        if launched is not None:
            if self.config.async_enabled and not launched.picks.seeded:
                self._in_flight = launched
            else:
                outputs.extend(self._finish(launched))
        return outputs

    def _launch(self, batch: ScheduledBatch) -> _Launched:
        """Run the model over the batch and start sampling; nothing here waits for the device."""
        started = time.perf_counter()
        logits = self.runner.execute(batch, self.kv)  # (S, V) for the requests whose last token ran
        sampling = batch.sampling_requests
        picks = PendingSample(logits, sampling)  # launched; resolved in _finish
        if self.config.async_enabled:
            self.runner.record_sampled(sampling, picks.picked)
        return _Launched(batch, sampling, picks, started, self.scheduler.num_finished)

    def _finish(self, launched: _Launched) -> list[RequestOutput]:
        """Wait for a launched step's tokens; update the requests; emit the outputs of those still live."""
        sampled = launched.picks.resolve()
        sampling = launched.sampling
        requests, token_ids, logprobs = sampling, sampled.token_ids, sampled.logprobs
        if self.scheduler.num_finished != launched.finished_before:
            # NOTE(crossway): a request can finish while its step runs (aborted, or stopped by the
            # step before under async scheduling); its token is dropped and it gets no output.
            live = [i for i, r in enumerate(sampling) if not r.status.finished]
            requests = [sampling[i] for i in live]
            token_ids = [token_ids[i] for i in live]
            logprobs = [logprobs[i] for i in live]
        self.scheduler.update(sampling, sampled.token_ids)
        now = time.perf_counter()
        self.metrics.on_step(launched.batch, len(requests), now - max(launched.started, self._finished_at))
        self._finished_at = now
        outputs = self.outputs.process_step(requests, token_ids, logprobs)
        emitted = []
        for request, out in zip(requests, outputs, strict=True):
            if request.num_output_tokens == 1:
                self.metrics.on_first_token(request)
            if out is None:  # a final-only request that goes on
                continue
            if out.finished:
                if not request.status.finished:  # a stop string ended it
                    self.scheduler.finish(request, RequestStatus.FINISHED_STOPPED)
                self.metrics.on_finish(request)
            emitted.append(out)
        return emitted

    def metrics_snapshot(self) -> MetricsSnapshot:
        """Current metrics (queue, KV blocks, prefix hits, latencies, utilisation)."""
        return self.metrics.snapshot(self.scheduler, self.kv)

    def generate(
        self, prompts: Sequence[str | Sequence[int]], params: SamplingParams | Sequence[SamplingParams]
    ) -> list[list[int]]:
        """Run prompts to completion together and return each one's generated token ids (for scripts and tests)."""
        per_prompt = [params] * len(prompts) if isinstance(params, SamplingParams) else list(params)
        ids = [f"generate-{time.monotonic_ns()}-{i}" for i in range(len(prompts))]
        for request_id, prompt, p in zip(ids, prompts, per_prompt, strict=True):
            self.add_request(request_id, prompt, p, stream=False)
        tokens: dict[str, list[int]] = {i: [] for i in ids}
        while self.has_unfinished_requests():
            for out in self.step():
                if out.request_id in tokens:  # other callers' requests may share the steps
                    tokens[out.request_id].extend(out.token_ids)
        return [tokens[i] for i in ids]


def _max_model_len(cfg: EngineConfig, model_cfg: ModelConfig, num_blocks: int) -> int:
    pool_tokens = num_blocks * cfg.block_size
    if cfg.max_model_len is not None:
        if cfg.max_model_len > model_cfg.max_position_embeddings:
            raise ValueError(
                f"max_model_len {cfg.max_model_len} exceeds the model's {model_cfg.max_position_embeddings} positions"
            )
        if cfg.max_model_len > pool_tokens:
            raise ValueError(
                f"max_model_len {cfg.max_model_len} does not fit the KV pool of {pool_tokens} tokens; "
                "raise num_kv_blocks or kv_cache_memory_bytes, or lower max_model_len"
            )
        return cfg.max_model_len
    return min(model_cfg.max_position_embeddings, _DEFAULT_MAX_MODEL_LEN, pool_tokens)
