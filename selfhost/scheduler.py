"""Iteration-level scheduling: which requests run how many tokens in the next step.

Owns the waiting queue and the running list, the per-step token budget, chunked prefill, prefix
hits at admission, preemption by recompute, and token-based stopping (EOS, stop token ids,
max_tokens, max_model_len) after each step. Does not own the model, sampling, text or stop strings.

One rule covers everything: a request has ``num_tokens`` token ids and ``num_computed_tokens`` of
them in the KV cache; each step gives it ``min(num_tokens - num_computed_tokens, budget left)``
tokens. A prefill is that rule with a large gap, a chunked prefill the same rule with a small
budget, a prefix hit a head start on ``num_computed_tokens``, a decode a gap of one. In a step that
also decodes, the chunks (gaps above one) share a smaller budget, ``mixed_prefill_tokens``: a
long prompt then slows the running requests' steps by a bounded amount however long it is.

``schedule`` advances ``num_computed_tokens`` when it plans a step, and counts the token the step
will sample as pending until ``update`` brings it back. So the next step can be planned while this
one still runs on the device (async scheduling): a pending token counts in the gap, and the step
that runs it reads its id on the device.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from selfhost.request import Request, RequestStatus

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

    from selfhost.config import EngineConfig
    from selfhost.kv_cache import KVCacheManager


@dataclass(slots=True)
class ScheduledBatch:
    """The plan of one step. ``requests[i]`` runs ``num_new_tokens[i]`` tokens from its ``num_computed_tokens``."""

    requests: list[Request] = field(default_factory=list)
    num_new_tokens: list[int] = field(default_factory=list)
    starts: list[int] = field(default_factory=list)
    """Each request's first position this step (its computed tokens before the step)."""
    samples: list[bool] = field(default_factory=list)
    """Whether the step runs the request's last token (known or pending), so it samples the next."""
    preempted: list[Request] = field(default_factory=list)
    total_tokens: int = 0
    """Tokens that run through the model this step."""
    num_prompt_tokens: int = 0
    """Of those, prompt tokens (the rest are sampled tokens running for their KV and the next logits)."""
    num_sampling: int = 0
    """Requests whose last token runs this step (``sampling_requests``)."""

    def add(self, request: Request, num_new: int) -> None:
        """Plan ``num_new`` tokens of ``request``; advances its computed tokens and, if it samples, its pending ones."""
        start = request.num_computed_tokens
        samples = start + num_new == len(request.all_token_ids) + request.num_pending_tokens
        self.requests.append(request)
        self.num_new_tokens.append(num_new)
        self.starts.append(start)
        self.samples.append(samples)
        self.total_tokens += num_new
        self.num_sampling += samples
        if start < request.num_prompt_tokens:
            self.num_prompt_tokens += min(start + num_new, request.num_prompt_tokens) - start
        request.num_computed_tokens = start + num_new
        request.num_pending_tokens += samples

    @property
    def sampling_requests(self) -> list[Request]:
        """Requests whose last token runs this step, so the step samples their next token."""
        if self.num_sampling == len(self.requests):  # every decode step
            return self.requests
        return [r for r, s in zip(self.requests, self.samples, strict=True) if s]


class Scheduler:
    """Continuous batching over a ``KVCacheManager``. Single-threaded: the engine thread owns it."""

    def __init__(self, cfg: EngineConfig, kv: KVCacheManager, max_model_len: int, eos_token_ids: Iterable[int]) -> None:
        self.cfg = cfg
        self.kv = kv
        self.max_model_len = max_model_len
        self.eos_token_ids = frozenset(eos_token_ids)
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.requests: dict[str, Request] = {}
        self.num_preemptions = 0
        self.num_finished = 0
        """Requests ended so far (by any means)."""

    def add_request(self, request: Request) -> None:
        """Queue a validated request at the back of the waiting queue."""
        self.requests[request.request_id] = request
        self.waiting.append(request)

    def has_unfinished(self) -> bool:
        """Whether any request waits or runs."""
        return bool(self.waiting or self.running)

    def schedule(self) -> ScheduledBatch:
        """Plan the next step: running requests first (oldest first), then admissions from the waiting queue."""
        batch = ScheduledBatch()
        budget = self.cfg.max_num_batched_tokens
        running, max_len = self.running, self.max_model_len
        allocate, add = self.kv.allocate_slots, batch.add
        chunks = self._chunk_budget(budget)
        i = 0
        while i < len(running) and budget > 0:
            request = running[i]
            known, pending = len(request.all_token_ids), request.num_pending_tokens
            if pending and (
                known + pending - request.num_prompt_tokens >= request.params.max_tokens or known + pending >= max_len
            ):
                i += 1  # its pending token finishes it: running it again would be wasted
                continue
            gap = known + pending - request.num_computed_tokens
            if gap == 1:  # a decode: every running request, every step
                num_new = 1
            else:
                num_new = self._chunk(gap, budget, chunks)
                if num_new == 0:
                    i += 1  # no chunk tokens left this step: the decodes after it still run
                    continue
                chunks -= num_new
            # NOTE(crossway): when blocks run out, preempt the newest running request (the end of
            # the list) and retry; a request can end up preempting itself. Victims always sit after
            # index i, so nothing already in this step's batch is preempted.
            while allocate(request, num_new) is None:
                victim = running.pop()
                self._preempt(victim)
                batch.preempted.append(victim)
                if victim is request:
                    break
            if request.status is not RequestStatus.RUNNING:
                break
            add(request, num_new)
            budget -= num_new
            i += 1
        if batch.preempted:
            return batch  # no admissions in a step that had to preempt
        while self.waiting and budget > 0 and len(self.running) < self.cfg.max_num_seqs:
            request = self.waiting[0]
            if request.num_pending_tokens:
                break  # preempted while its last step ran: admit it once that token is known
            hit = self.kv.find_prefix(request)
            gap = request.num_tokens - hit.num_tokens
            num_new = 1 if gap == 1 else self._chunk(gap, budget, chunks)  # one token: a full hit, or a 1-token prompt
            if num_new == 0 or self.kv.allocate_slots(request, num_new, hit) is None:
                break
            self.waiting.popleft()
            request.num_computed_tokens = hit.num_tokens
            request.num_kv_tokens = len(hit.blocks) * self.kv.block_size
            if request.num_cached_tokens < 0:
                request.num_cached_tokens = hit.num_tokens
            request.status = RequestStatus.RUNNING
            self.running.append(request)
            batch.add(request, num_new)
            budget -= num_new
            if gap > 1:
                chunks -= num_new
        return batch

    def _chunk_budget(self, budget: int) -> int:
        """Tokens this step's chunks may take: ``mixed_prefill_tokens`` if a running request decodes, else ``budget``."""
        cap = self.cfg.mixed_prefill_tokens
        if not cap or cap >= budget:
            return budget
        # NOTE(crossway): stops at the first decode, which in a busy step is the first request
        for request in self.running:
            if len(request.all_token_ids) + request.num_pending_tokens - request.num_computed_tokens == 1:
                return cap
        return budget

    def _chunk(self, remaining: int, budget: int, chunks: int) -> int:
        """Tokens of a request that has ``remaining`` (more than one) to run: 0 when the step has none left for it."""
        return min(remaining, budget, chunks, self.cfg.long_prefill_token_threshold or remaining)

    def _preempt(self, request: Request) -> None:
        self.kv.free(request)
        request.status = RequestStatus.PREEMPTED
        request.num_computed_tokens = 0
        request.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(request)

    def update(self, requests: Sequence[Request], tokens: Sequence[int]) -> None:
        """Bring back a step's sampled tokens: append each to its request and apply token-based stops.

        Args:
            requests: the step's sampling requests (``ScheduledBatch.sampling_requests``), in order.
            tokens: their sampled tokens. A request that finished meanwhile (aborted, or stopped
                by the step before while this one ran) drops its token.
        """
        eos, max_len, running = self.eos_token_ids, self.max_model_len, RequestStatus.RUNNING
        for request, token in zip(requests, tokens, strict=True):
            request.num_pending_tokens -= 1
            if request.status is not running and request.status.finished:
                continue
            request.append_output_token(token)
            params = request.params
            # NOTE(crossway): the stop rules spelled out for the request that goes on (every
            # running request, every step), so it pays no call; _stop_status says why one stops
            num_tokens = len(request.all_token_ids)
            if (
                token in eos
                or token in params.stop_token_ids
                or num_tokens - request.num_prompt_tokens >= params.max_tokens
                or num_tokens >= max_len
            ):
                status = self._stop_status(request, token)
                if status is not None:
                    self.finish(request, status)

    def _stop_status(self, request: Request, token: int) -> RequestStatus | None:
        params = request.params
        if not params.ignore_eos and token in self.eos_token_ids:
            request.stop_reason = None
            return RequestStatus.FINISHED_STOPPED
        if token in params.stop_token_ids:
            request.stop_reason = token
            return RequestStatus.FINISHED_STOPPED
        if request.num_output_tokens >= params.max_tokens or request.num_tokens >= self.max_model_len:
            return RequestStatus.FINISHED_LENGTH
        return None

    def finish(self, request: Request, status: RequestStatus) -> None:
        """End a request (any state): free its blocks at once and forget it."""
        if request.status.finished:
            return
        if request.status is RequestStatus.RUNNING:
            self.running.remove(request)
        elif request in self.waiting:
            self.waiting.remove(request)
        request.status = status
        self.kv.free(request)
        self.requests.pop(request.request_id, None)
        self.num_finished += 1
