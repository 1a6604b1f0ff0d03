"""structlog configuration, done once per process.

Owns the processor chain (context variables, level, UTC ISO timestamps, JSON by msgspec) and the
binding of per-request context. Does not decide what is logged: each stage logs its own facts as
snake_case events with fields. Prompt and completion text is never logged unless
``Settings.log_content`` is on.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import msgspec
import structlog

_json = msgspec.json.Encoder(enc_hook=str)


def _serialize(obj: Any, **_: Any) -> bytes:
    return _json.encode(obj)


def configure(level: str = "info", json: bool = True) -> None:
    """Configure structlog for the process: JSON lines on stderr (or readable console lines)."""
    renderer: Any = (
        structlog.processors.JSONRenderer(serializer=_serialize) if json else structlog.dev.ConsoleRenderer()
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelNamesMapping()[level.upper()]),
        logger_factory=structlog.BytesLoggerFactory(sys.stderr.buffer)
        if json
        else structlog.PrintLoggerFactory(sys.stderr),
        cache_logger_on_first_use=True,
    )
    # httpx logs an INFO "HTTP Request" line per upstream call, which repeats our request_done (3% of CPU).
    for name in ("httpx", "httpcore"):
        logging.getLogger(name).setLevel(logging.WARNING)
