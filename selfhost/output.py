"""From sampled tokens to what a client sees: incremental text, stop strings, per-step outputs.

Owns incremental detokenization (text deltas that never split a UTF-8 character), stop strings
(the output is cut right before the first match, and text that might still become a stop string
is held back while streaming) and the ``RequestOutput`` record. Does not own token-based stops
(``scheduler``) or finishing requests (the engine does, when this module reports a stop string).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from selfhost.request import RequestStatus

if TYPE_CHECKING:
    from collections.abc import Sequence

    from selfhost.request import FinishReason, Request
    from selfhost.sampling import TokenLogprobs
    from selfhost.tokenizer import TextStream, Tokenizer

_PROMPT_TAIL = 6  # prompt tokens that seed the detokenizer, so the first output token decodes in context


@dataclass(slots=True)
class RequestOutput:
    """What one step produced for one request: deltas, plus the totals so far."""

    request_id: str
    token_ids: list[int]
    """Tokens generated this step."""
    text: str
    """Text released this step (may lag ``token_ids`` while a stop string could still match)."""
    finished: bool = False
    finish_reason: FinishReason | None = None
    stop_reason: int | str | None = None
    """The stop string or stop token id that ended the request, if any."""
    logprobs: list[TokenLogprobs] = field(default_factory=list)
    num_prompt_tokens: int = 0
    num_output_tokens: int = 0
    num_cached_tokens: int = 0
    """Prompt tokens served from the prefix cache."""


@dataclass(slots=True)
class _TextState:
    stream: TextStream | None
    """None without a tokenizer (token ids only)."""
    text: str = ""
    """The text so far, kept only for a request with stop strings (searched and held back)."""
    emitted: int = 0
    final_only: bool = False
    """Not streamed and no stop strings: no output until it finishes, its text decoded once then."""
    logprobs: list[TokenLogprobs] = field(default_factory=list)
    """A final-only request's logprobs so far."""


class OutputProcessor:
    """Per-request text state. Used only by the engine thread."""

    def __init__(self, tokenizer: Tokenizer | None) -> None:
        self.tokenizer = tokenizer
        self._states: dict[str, _TextState] = {}

    def add(self, request: Request, *, stream: bool = True) -> None:
        """Start tracking a request's text.

        ``stream=False``: the caller wants only the whole result, so a request without stop
        strings gets one output, when it finishes (all its token ids, logprobs and text), as vLLM's
        ``FINAL_ONLY``. Its text is decoded once then instead of token by token: ~1.5 us a token
        on the CPU VM through ``TextStream``, the largest single cost of a decode step's host work
        (bench/host_step.py). With stop strings the text must be searched as it grows, so such a
        request is processed as a streamed one.
        """
        final_only = not stream and not request.params.stop
        text_stream = None
        if self.tokenizer is not None and not final_only:
            context, unfinished = self._context(request)
            text_stream = self.tokenizer.text_stream(context)
            for token_id in unfinished:
                text_stream.step(token_id)  # "": the character is not whole until the output completes it
        self._states[request.request_id] = _TextState(text_stream, final_only=final_only)

    def remove(self, request_id: str) -> None:
        """Stop tracking (idempotent)."""
        self._states.pop(request_id, None)

    def process_step(
        self, requests: Sequence[Request], token_ids: Sequence[int], logprobs: Sequence[TokenLogprobs | None]
    ) -> list[RequestOutput | None]:
        """Account each request's new token, in order; detect stop strings (sets ``request.stop_reason``).

        Returns each request's output, or None for a final-only request that goes on. The caller
        finishes a request when its output says ``finished`` and the request's status is not
        finished yet.

        NOTE(crossway): the GPU idles while the host does this work. Each request's text advances by
        one call into the tokenizer library (``TextStream``): with 256 running requests the whole
        step took 0.79-0.82 ms on the CPU VM with two batched decodes over each request's window
        (and 11-13 ms with two decodes per request before that), 0.61-0.62 ms with the streams,
        whose deltas equalled the windowed ones in 24,000 fuzzed steps.
        """
        outputs: list[RequestOutput | None] = []
        states, running = self._states, RequestStatus.RUNNING
        for request, token_id, lp in zip(requests, token_ids, logprobs, strict=True):
            state = states[request.request_id]
            stops = request.params.stop
            status = request.status
            reason = None if status is running else status.finish_reason
            finished = reason is not None
            if state.final_only:
                if lp is not None:
                    state.logprobs.append(lp)
                if reason is None:
                    outputs.append(None)
                else:
                    outputs.append(self._final_output(request, state, reason))
                    del states[request.request_id]
                continue
            # EOS or a stop token id ended it ("stop" already): that token has no text
            if not stops:
                # nothing to search or hold back: the delta is released as it comes, unkept
                text = state.stream.step(token_id) if reason != "stop" and state.stream is not None else ""
            else:
                if reason != "stop" and state.stream is not None:
                    delta = state.stream.step(token_id)
                    searched_from = max(0, len(state.text) - max(len(s) for s in stops) + 1)
                    state.text += delta
                    hit = _find_stop(state.text, stops, searched_from)
                    if hit is not None:
                        state.text = state.text[: hit[0]]
                        request.stop_reason = hit[1]
                        finished, reason = True, "stop"
                hold = 0 if finished else max(len(s) - 1 for s in stops)
                release_to = max(state.emitted, len(state.text) - hold)
                text = state.text[state.emitted : release_to]
                state.emitted = release_to
            if finished:
                del states[request.request_id]
            outputs.append(
                RequestOutput(
                    request.request_id,
                    [token_id],
                    text,
                    finished,
                    reason,
                    request.stop_reason,
                    [lp] if lp is not None else [],
                    request.num_prompt_tokens,
                    len(request.all_token_ids) - request.num_prompt_tokens,
                    max(request.num_cached_tokens, 0),
                )
            )
        return outputs

    def _context(self, request: Request) -> tuple[list[int], list[int]]:
        """The prompt's last tokens that the output's text is decoded after, split where the last whole character ends.

        NOTE(crossway): a tail that ends inside a character (a prompt given as token ids) made the
        stream release the tail's own text with the first token. The tokens of that character are
        fed to the stream before the output instead: the output's first bytes complete it, and the
        character is part of the output's text.
        """
        assert self.tokenizer is not None  # noqa: S101 (narrowing)
        tail = request.all_token_ids[max(0, request.num_prompt_tokens - _PROMPT_TAIL) : request.num_prompt_tokens]
        end = len(tail)
        while end and self.tokenizer.decode(tail[:end]).endswith("\ufffd"):
            end -= 1
        return tail[:end], tail[end:]

    def _final_output(self, request: Request, state: _TextState, reason: FinishReason) -> RequestOutput:
        output_ids = request.output_token_ids
        return RequestOutput(
            request.request_id,
            output_ids,
            self._whole_text(request, output_ids[:-1] if reason == "stop" else output_ids),
            True,
            reason,
            request.stop_reason,
            state.logprobs,
            request.num_prompt_tokens,
            len(output_ids),
            max(request.num_cached_tokens, 0),
        )

    def _whole_text(self, request: Request, ids: list[int]) -> str:
        """The text a ``TextStream`` after the prompt's tail would have released for ``ids``, in one decode.

        EOS or a stop token id that ended the request has no text, so the caller leaves it out.
        """
        if self.tokenizer is None:
            return ""
        context, unfinished = self._context(request)
        ids = [*unfinished, *ids]
        before = self.tokenizer.decode(context)
        whole = self.tokenizer.decode([*context, *ids])
        text = whole[len(before) :]
        if whole.startswith(before) and "\ufffd" not in text:
            return text
        # NOTE(crossway): a character the output leaves unfinished (a stream holds its bytes back
        # for good), or a U+FFFD of its own: the stream's own rule, token by token
        stream = self.tokenizer.text_stream(context)
        return "".join([stream.step(t) for t in ids])


def _find_stop(text: str, stops: tuple[str, ...], start: int) -> tuple[int, str] | None:
    best: tuple[int, str] | None = None
    for stop in stops:
        index = text.find(stop, start)
        if index >= 0 and (best is None or index < best[0]):
            best = (index, stop)
    return best
