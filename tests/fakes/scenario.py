"""What the fake vendors answer, decided by the requested model name; vendor-neutral.

Owns the model-name behaviours of ``tests.fakes.upstream`` (echo, tool calls, errors, delays, cut
and long streams, JSON), the deterministic token counts and embedding vectors. Does not own any
vendor's wire format: ``fake_openai``, ``fake_anthropic`` and ``fake_gemini`` render an ``Answer``.

Model names (a ``provider/`` prefix is ignored):

* anything else: ``"echo: <text of the last user or tool turn>"``, one stream delta per word
* ``tool-*``: a call to the forced tool or else the first offered tool with ``{"city":"Paris"}``
  (streamed in three argument pieces); also any model when the request forces a tool
* ``json``: the text ``{"answer":"echo: ..."}``; a forced tool gets those arguments instead
* ``error-<status>``: that status in the vendor's error format (429 carries ``retry-after: 1``)
* ``slow-<ms>``: waits that long before answering (gives up early if the client goes away)
* ``cut-stream``: two text deltas, then the body ends with no terminator; not streamed, the JSON
  body is cut in half
* ``stream-error``: one text delta, then the vendor's in-stream error event (503 when not streamed)
* ``bad-json``: a body (or one SSE event) that is not JSON
* ``long-stream`` / ``long-stream-<n>``: 100 (or n) small deltas ``" tok0"``, ``" tok1"``...
* a name ending in ``-ignore-max-tokens``: the rest of the name decides the answer, and
  ``max_tokens`` is ignored (an upstream that streams past it)
* a name containing ``cached``: half the prompt tokens are reported cache hits (and, where the
  vendor has them, a quarter cache writes); containing ``think``: 7 reasoning tokens (Gemini)

``max_tokens`` below the number of deltas truncates the answer with finish reason ``length``.
"""

from __future__ import annotations

import hashlib
import itertools
import re
from dataclasses import dataclass, field
from typing import Literal

import msgspec

Finish = Literal["stop", "length", "tool"]
Mode = Literal["normal", "cut", "stream_error", "bad_json"]

_ERROR = re.compile(r"error-(\d{3})")
_SLOW = re.compile(r"slow-(\d+)")
_LONG = re.compile(r"long-stream(?:-(\d+))?")
_WORDS = re.compile(r"\s*\S+")
_IDS = itertools.count(1)
CUT_PIECES = ("partial", " answer", " that", " never", " ends")
IGNORE_MAX_TOKENS = "-ignore-max-tokens"
CREATED = 1_763_000_000
"""The fixed ``created`` timestamp of every fake answer."""


@dataclass(slots=True)
class Prompt:
    """What a vendor request asked, reduced to what the scenarios need."""

    last_text: str = ""
    """Text of the last user (or tool result) turn."""
    prompt_chars: int = 0
    messages: int = 0
    tools: list[str] = field(default_factory=list)
    forced_tool: str | None = None
    max_tokens: int | None = None


@dataclass(frozen=True, slots=True)
class ToolAnswer:
    """A tool call the fake model makes."""

    id: str
    name: str
    arguments: str
    pieces: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Answer:
    """A vendor-neutral fake answer."""

    pieces: tuple[str, ...]
    tool: ToolAnswer | None
    finish: Finish
    input_tokens: int
    output_tokens: int
    cached_tokens: int = 0
    cache_write_tokens: int = 0
    thoughts_tokens: int = 0
    delay_s: float = 0.0
    mode: Mode = "normal"

    @property
    def text(self) -> str:
        """The whole answer text."""
        return "".join(self.pieces)


def next_id() -> str:
    """A fresh id suffix, unique within the process."""
    return f"fake{next(_IDS):08d}"


def error_status(model: str) -> int | None:
    """The HTTP status an ``error-<status>`` model asks for, else ``None``."""
    match = _ERROR.fullmatch(_bare(model))
    return int(match.group(1)) if match else None


def plan(model: str, prompt: Prompt) -> Answer:
    """Decide the answer to ``prompt`` for ``model`` (see the module docstring)."""
    name = _bare(model)
    ignores_max = name.endswith(IGNORE_MAX_TOKENS)
    name = name.removesuffix(IGNORE_MAX_TOKENS)
    echo = f"echo: {prompt.last_text}" if prompt.last_text else "echo:"
    mode: Mode = "normal"
    long = _LONG.fullmatch(name)
    if long:
        pieces: tuple[str, ...] = tuple(f" tok{i}" for i in range(int(long.group(1) or 100)))
    elif name == "cut-stream":
        pieces, mode = CUT_PIECES, "cut"
    elif name == "stream-error":
        pieces, mode = CUT_PIECES, "stream_error"
    elif name == "json":
        pieces = split_words(msgspec.json.encode({"answer": echo}).decode())
    else:
        pieces = split_words(echo)
    if name == "bad-json":
        mode = "bad_json"

    tool = None
    finish: Finish = "stop"
    if prompt.tools and (name.startswith("tool-") or prompt.forced_tool):
        args = {"answer": echo} if name == "json" else {"city": "Paris"}
        arguments = msgspec.json.encode(args).decode()
        tool = ToolAnswer(f"{next_id()}", prompt.forced_tool or prompt.tools[0], arguments, split_in(arguments, 3))
        pieces, finish = (), "tool"
    elif prompt.max_tokens is not None and len(pieces) > prompt.max_tokens and not ignores_max:
        pieces, finish = pieces[: prompt.max_tokens], "length"

    input_tokens = 4 * prompt.messages + (prompt.prompt_chars + 3) // 4 + 8 * len(prompt.tools)
    output_tokens = len(pieces) + (5 + len(tool.arguments) // 4 if tool else 0)
    cached = "cached" in name
    slow = _SLOW.fullmatch(name)
    return Answer(
        pieces=pieces,
        tool=tool,
        finish=finish,
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        cached_tokens=input_tokens // 2 if cached else 0,
        cache_write_tokens=input_tokens // 4 if cached else 0,
        thoughts_tokens=7 if "think" in name else 0,
        delay_s=int(slow.group(1)) / 1000 if slow else 0.0,
        mode=mode,
    )


def split_words(text: str) -> tuple[str, ...]:
    """``"echo: a b"`` -> ``("echo:", " a", " b")``; joined they give ``text`` back."""
    return tuple(_WORDS.findall(text)) or (text,)


def split_in(text: str, n: int) -> tuple[str, ...]:
    """``text`` in ``n`` nearly equal consecutive pieces (fewer when it is shorter)."""
    size = max(1, -(-len(text) // n))
    return tuple(text[i : i + size] for i in range(0, len(text), size))


def vector(seed: str, dims: int) -> list[float]:
    """A deterministic embedding of ``dims`` floats in [-1, 1] derived from ``seed``."""
    values: list[float] = []
    for counter in itertools.count():
        digest = hashlib.sha256(f"{seed}:{counter}".encode()).digest()
        values.extend(round((b - 127.5) / 127.5, 6) for b in digest)
        if len(values) >= dims:
            return values[:dims]
    raise AssertionError("unreachable")  # pragma: no cover


def _bare(model: str) -> str:
    return model.rsplit("/", 1)[-1]
