"""The finance and admin web dashboard: its static files, and who a dashboard key is.

Owns serving ``gateway/dashboard/`` (one HTML page, its scripts and style sheet; no build step and
nothing fetched from elsewhere, which the Content-Security-Policy header also enforces) and
``GET /admin/whoami``, which the page calls to check a key before showing anything. Does not own the
figures: the page reads them with the key the user typed from the finance and policy APIs
(``gateway.api.finance``, ``gateway.api.policies``), so the page itself needs no key and carries no data.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from litestar import Request, Response, get
from litestar.datastructures import State
from litestar.params import FromPath

from gateway.api.admin import json_response, require_reader
from gateway.errors import NotFound

ASSETS = Path(__file__).resolve().parent.parent / "dashboard"
"""Where the page and its scripts live (shipped as package data)."""

_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
}

_HEADERS = {
    # NOTE: 'self' only: the page may load its own files and call this gateway, nothing else; no inline code.
    "content-security-policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
        "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "cache-control": "no-cache",
}


def _load() -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in ASSETS.iterdir() if p.suffix in _TYPES}


_FILES = _load()


def _asset(name: str) -> Response[bytes]:
    body = _FILES.get(name)
    if body is None:
        raise NotFound(f"No dashboard file named {name!r}.")
    return Response(body, media_type=_TYPES[Path(name).suffix], headers=_HEADERS)


@get(["/dashboard", "/dashboard/"], include_in_schema=False)
async def dashboard_page() -> Response[bytes]:
    """The dashboard page; it asks for a key and reads the finance API with it."""
    return _asset("index.html")


@get("/dashboard/{name:str}", include_in_schema=False)
async def dashboard_file(name: FromPath[str]) -> Response[bytes]:
    """One of the page's scripts or its style sheet."""
    return _asset(name)


@get("/admin/whoami", summary="Which admin role a key has")
async def whoami(request: Request[Any, Any, Any], state: State) -> Response[bytes]:
    """``{"role": "admin"}`` or ``{"role": "finance"}`` (read-only); 401 for any other key."""
    return json_response({"role": require_reader(request, state)})


ROUTES = [dashboard_page, dashboard_file, whoami]
