"""What every request passes before the app reads a byte of its body (pure ASGI, in front of FastAPI):

1. a write (POST, PUT, PATCH: the API's only requests with a body are writes, each behind api.deps.require_token)
   checks the bearer token from the headers first: a caller without the token is answered 401/403 without the server
   reading or parsing what it sent;
2. a body declared larger than MAX_BODY_BYTES (Content-Length) is answered 413 at once; any body is read up to the
   limit and answered 413 as soon as it passes it, never buffered whole, and 408 when it does not arrive within
   ``Settings.api_body_timeout_s``; Content-Length with Transfer-Encoding is 400 (h11 follows the chunks and ignores
   the length: a body declared 5 bytes could be 100 MB);
3. a query string over MAX_QUERY_BYTES is 414, headers over MAX_HEADER_BYTES in all 431;
4. a Host header off the allow-list (tuner.hosts: DNS rebinding) is 400, before anything else is answered.

FastAPI reads and parses a body before it runs a route's dependencies, so neither can be a dependency."""

from __future__ import annotations

import asyncio
import json

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.deps import token_problem
from tuner.hosts import host_allowed

MAX_BODY_BYTES = 256 * 1024  # a definition with both baseline files inline is a few KiB
MAX_QUERY_BYTES = 8 * 1024  # the longest query this API takes (a trials page's filters) is under 200 bytes
MAX_HEADER_BYTES = 16 * 1024  # names and values of every header together
BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})


async def _answer(send: Send, status: int, detail: str, headers: dict[str, str] | None = None) -> None:
    body = json.dumps({"detail": detail}).encode()
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    raw += [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})


def _too_large(limit: int) -> str:
    return f"request body too large: at most {limit // 1024} KiB; a study definition is a few KiB of JSON"


Problem = tuple[int, str, dict[str, str] | None]  # status, detail, extra headers


class _TooSlow(Exception):
    """The body did not arrive within the server's body timeout."""


class RequestGuard:
    """Installed with ``app.add_middleware(RequestGuard)``: Starlette sets ``scope["app"]`` (the FastAPI app, with
    its services) before any middleware runs."""

    def __init__(self, app: ASGIApp, *, max_body: int = MAX_BODY_BYTES) -> None:
        self.app = app
        self.max_body = max_body

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        problem: Problem | None = _head_problem(scope)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        settings = scope["app"].state.services.settings
        if problem is None and not host_allowed(headers.get("host"), scope["app"].state.answered_hosts):
            problem = (400, _host_refused(headers.get("host")), None)
        if problem is None and scope["method"] in BODY_METHODS:
            problem = token_problem(settings, headers.get("authorization"))
        if problem is None:
            problem = self._framing_problem(headers)
        if problem is None and scope["method"] in BODY_METHODS:
            try:
                replay = await self._read_limited(receive, settings.api_body_timeout_s)
            except _TooSlow:
                problem = (408, f"request body not received within {settings.api_body_timeout_s:g} s", None)
            else:
                if replay is None:
                    problem = (413, _too_large(self.max_body), None)
                else:
                    receive = replay
        if problem is not None:
            status, detail, extra = problem
            await _answer(send, status, detail, extra)
            return
        await self.app(scope, receive, send)

    def _framing_problem(self, headers: dict[str, str]) -> Problem | None:
        """Content-Length and Transfer-Encoding together (h11 follows the chunks and ignores the length, so the length
        must not decide), a length that is not a byte count, or one over the limit."""
        length = headers.get("content-length")
        if length is None:
            return None
        if "transfer-encoding" in headers:
            return 400, "Content-Length and Transfer-Encoding together: send one of them", None
        if not length.isdigit():
            return 400, "Content-Length is not a byte count", None
        if int(length) > self.max_body:
            return 413, _too_large(self.max_body), None
        return None

    async def _read_limited(self, receive: Receive, timeout_s: float) -> Receive | None:
        """The whole body (at most max_body bytes, all of it within ``timeout_s``) as a replaying receive; None once
        it passes the limit; _TooSlow past the timeout."""
        chunks: list[bytes] = []
        size = 0
        deadline = asyncio.get_running_loop().time() + timeout_s
        while True:
            left = deadline - asyncio.get_running_loop().time()
            try:
                message = await asyncio.wait_for(receive(), timeout=max(left, 0.0))
            except asyncio.TimeoutError:
                raise _TooSlow from None
            if message["type"] != "http.request":
                break
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body:
                return None
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        pending: list[Message] = [{"type": "http.request", "body": b"".join(chunks), "more_body": False}]

        async def replay() -> Message:
            return pending.pop() if pending else await receive()

        return replay


def _host_refused(host: str | None) -> str:
    shown = "".join(c for c in (host or "")[:100] if c.isprintable())
    return (
        f"Host {shown!r} is not one this server answers (DNS-rebinding guard): use the server's own name, or add "
        "it to `tuner serve --allowed-hosts` / TUNER_ALLOWED_HOSTS"
    )


def _head_problem(scope: Scope) -> Problem | None:
    """A query string or header block past its bound (414 / 431), before anything else is looked at."""
    if len(scope.get("query_string", b"")) > MAX_QUERY_BYTES:
        return 414, f"query string too long: at most {MAX_QUERY_BYTES // 1024} KiB", None
    if sum(len(k) + len(v) for k, v in scope["headers"]) > MAX_HEADER_BYTES:
        return 431, f"request headers too large: at most {MAX_HEADER_BYTES // 1024} KiB in all", None
    return None
