"""Sampling parameters of a request and the sampler turning logits into next tokens.

Owns validation of the parameters (``SamplingParams``) and greedy, temperature, top-k and top-p
sampling with a per-request ``torch.Generator`` when seeded, plus logprobs. Does not own stop
strings (``output``) or token-based stopping (``scheduler``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

import torch

from kernels.argmax import argmax
from selfhost.models.ops import upload

if TYPE_CHECKING:
    from collections.abc import Sequence

    from selfhost.request import Request

MAX_TOP_LOGPROBS = 20


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """How one request picks its tokens and when it stops."""

    max_tokens: int = 16
    """Most tokens to generate (at least 1)."""
    temperature: float = 1.0
    """0 means greedy; otherwise logits are divided by it."""
    top_p: float = 1.0
    """Nucleus: keep the smallest set of tokens whose probability reaches ``top_p`` (0 < top_p <= 1)."""
    top_k: int = 0
    """Keep the ``top_k`` most likely tokens (0 or -1: all)."""
    seed: int | None = None
    """Seeds this request's own generator, so its samples repeat whatever else runs beside it."""
    stop: tuple[str, ...] = ()
    """Generation ends before the first of these strings; the string is not part of the output."""
    stop_token_ids: tuple[int, ...] = ()
    """Generation ends after one of these tokens (the token is kept in the ids, not in the text)."""
    ignore_eos: bool = False
    """Keep going past the model's end-of-sequence tokens."""
    logprobs: int | None = None
    """Return the chosen token's logprob and this many top alternatives (0..20); None: none."""
    greedy: bool = field(init=False, repr=False, compare=False)
    """Whether the pick is the argmax (temperature 0 or top_k 1). A field, set once: the sampler
    asks it of every running request every step."""

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {self.max_tokens}")
        if not self.temperature >= 0.0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < -1:
            raise ValueError(f"top_k must be -1, 0 or positive, got {self.top_k}")
        if self.logprobs is not None and not 0 <= self.logprobs <= MAX_TOP_LOGPROBS:
            raise ValueError(f"logprobs must be in [0, {MAX_TOP_LOGPROBS}], got {self.logprobs}")
        if any(not s for s in self.stop):
            raise ValueError("stop strings must be non-empty")
        object.__setattr__(self, "greedy", self.temperature == 0.0 or self.top_k == 1)


class TokenLogprobs(NamedTuple):
    """Log-softmax of the raw logits (before temperature) at one position."""

    token_id: int
    logprob: float
    top: list[tuple[int, float]]
    """``(token id, logprob)`` of the most likely tokens, best first."""


class SamplerOutput(NamedTuple):
    """One sampled token (and its logprobs when asked) per sampled request, in batch order."""

    token_ids: list[int]
    logprobs: list[TokenLogprobs | None]


def sample(logits: torch.Tensor, requests: Sequence[Request]) -> SamplerOutput:
    """Pick the next token of each request from its ``(B, V)`` fp32 logits row."""
    return PendingSample(logits, requests).resolve()


class PendingSample:
    """A step's picks, launched on the device; ``resolve`` waits for them and finishes on the host.

    NOTE(crossway): everything that reads the logits runs at launch, because the next CUDA graph
    replay overwrites them; ``resolve`` then reads only tensors of its own. Greedy rows take the
    argmax, unseeded random rows are sampled together in one batched pass, and only seeded rows
    (their generator is a CPU one) wait for ``resolve``, on a copy of their logits.
    """

    def __init__(self, logits: torch.Tensor, requests: Sequence[Request]) -> None:
        """Start picking each request's next token from its ``(B, V)`` fp32 logits row."""
        self.requests = requests
        # (B,) greedy for all, then overwrite the random ones; the kernel on the GPU only (on the CPU
        # it would run under Triton's interpreter wherever a test session turned that on)
        self.picked = argmax(logits, pdl=False) if logits.is_cuda else logits.argmax(dim=-1)
        """(B,) the picks on the device; seeded rows hold the argmax until ``resolve``."""
        batched: list[int] = []
        self.seeded: list[int] = []
        """Rows sampled on the host by ``resolve``: their device picks are not the tokens."""
        self._wanted: list[int] = []
        # one pass over the requests: it runs for every running request each step, on the engine thread
        for i, req in enumerate(requests):
            params = req.params
            if not params.greedy:
                (batched if req.generator is None else self.seeded).append(i)
            if params.logprobs is not None:
                self._wanted.append(i)
        if batched:
            rows = upload(batched, torch.long, logits.device)
            self.picked[rows] = _sample_rows(logits[rows], [requests[i].params for i in batched])
        self._seeded_logits = logits[self.seeded] if self.seeded else None  # (R, V), a copy
        self._logp = torch.log_softmax(logits[self._wanted], dim=-1) if self._wanted else None  # (W, V)
        self._host = self.picked.to("cpu", non_blocking=True)  # pinned: the copy runs behind the step
        self._done: torch.cuda.Event | None = None
        if logits.is_cuda:
            self._done = torch.cuda.Event()  # type: ignore[no-untyped-call]
            self._done.record()

    def resolve(self) -> SamplerOutput:
        """Wait for the picks; sample the seeded rows; gather logprobs."""
        if self._done is not None:
            self._done.synchronize()
        token_ids: list[int] = self._host.tolist()
        for row, i in enumerate(self.seeded):
            assert self._seeded_logits is not None  # noqa: S101 (narrowing)
            req = self.requests[i]
            token_ids[i] = _sample_row(self._seeded_logits[row], req.params, req.generator)
        out_logprobs: list[TokenLogprobs | None] = [None] * len(self.requests)
        for row, i in enumerate(self._wanted):
            assert self._logp is not None  # noqa: S101 (narrowing)
            k = self.requests[i].params.logprobs or 0
            top = self._logp[row].topk(k) if k else None
            out_logprobs[i] = TokenLogprobs(
                token_id=token_ids[i],
                logprob=float(self._logp[row, token_ids[i]]),
                top=list(zip(top.indices.tolist(), top.values.tolist(), strict=True)) if top is not None else [],
            )
        return SamplerOutput(token_ids, out_logprobs)


def _sample_rows(logits: torch.Tensor, params: Sequence[SamplingParams]) -> torch.Tensor:
    """``(R, V)`` logits -> ``(R,)`` sampled ids, each row with its own temperature, top-k and top-p (as ``_sample_row``)."""
    device = logits.device
    temps = upload([p.temperature for p in params], logits.dtype, device)
    scaled = logits / temps.unsqueeze(1)  # (R, V)
    sorted_logits, order = scaled.sort(dim=-1, descending=True)  # (R, V)
    vocab = logits.shape[1]
    ks = upload([min(p.top_k, vocab) if p.top_k > 0 else vocab for p in params], torch.long, device)
    # top-k keeps every token tied with the k-th, as ``_sample_row``'s ``scaled < kth`` test does
    kth = sorted_logits.gather(1, (ks - 1).unsqueeze(1))  # (R, 1)
    drop = sorted_logits < kth
    top_ps = upload([p.top_p for p in params], logits.dtype, device).unsqueeze(1)
    probs = sorted_logits.masked_fill(drop, float("-inf")).softmax(-1)
    drop |= (probs.cumsum(-1) - probs) >= top_ps  # the most likely token always survives
    probs = sorted_logits.masked_fill(drop, float("-inf")).softmax(-1)  # (R, V) renormalised
    choice = torch.multinomial(probs, 1)  # (R, 1) index into the sorted order
    return order.gather(1, choice).squeeze(1)


def _sample_row(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None) -> int:
    if generator is not None and generator.device != logits.device:
        logits = logits.to(generator.device)  # a seeded request's generator lives on the CPU
    scaled = logits / params.temperature  # (V,)
    if params.top_k > 0:
        kth = scaled.topk(min(params.top_k, scaled.shape[0])).values[-1]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_logits, order = scaled.sort(descending=True)
        probs = sorted_logits.softmax(-1)
        # NOTE(crossway): drop a token when the tokens strictly before it already reach top_p,
        # so the most likely token always survives.
        drop = (probs.cumsum(-1) - probs) >= params.top_p
        scaled = scaled.scatter(0, order, sorted_logits.masked_fill(drop, float("-inf")))
    probs = scaled.softmax(-1)
    return int(torch.multinomial(probs, 1, generator=generator).item())
