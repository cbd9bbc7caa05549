"""What every request passes before the app reads a byte of its body (pure ASGI, in front of FastAPI):

1. a write (POST, PUT, PATCH: the API's only requests with a body are writes, each behind api.deps.require_token)
   checks the bearer token from the headers first: a caller without the token is answered 401/403 without the server
   reading or parsing what it sent;
2. a body declared larger than MAX_BODY_BYTES (Content-Length) is answered 413 at once; a chunked body is read up to
   the limit and answered 413 as soon as it passes it, never buffered whole.

FastAPI reads and parses a body before it runs a route's dependencies, so neither can be a dependency."""

from __future__ import annotations

import json

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.deps import token_problem

MAX_BODY_BYTES = 256 * 1024  # a definition with both baseline files inline is a few KiB
BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})


async def _answer(send: Send, status: int, detail: str, headers: dict[str, str] | None = None) -> None:
    body = json.dumps({"detail": detail}).encode()
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    raw += [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})


def _too_large(limit: int) -> str:
    return f"request body too large: at most {limit // 1024} KiB; a study definition is a few KiB of JSON"


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
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        if scope["method"] in BODY_METHODS:
            problem = token_problem(scope["app"].state.services.settings, headers.get("authorization"))
            if problem is not None:
                status, detail, extra = problem
                await _answer(send, status, detail, extra)
                return
        length = headers.get("content-length")
        if length is not None:
            if not length.isdigit():
                await _answer(send, 400, "Content-Length is not a byte count")
                return
            if int(length) > self.max_body:
                await _answer(send, 413, _too_large(self.max_body))
                return
        elif scope["method"] in BODY_METHODS and "chunked" in headers.get("transfer-encoding", "").lower():
            replay = await self._read_limited(receive)
            if replay is None:
                await _answer(send, 413, _too_large(self.max_body))
                return
            receive = replay
        await self.app(scope, receive, send)

    async def _read_limited(self, receive: Receive) -> Receive | None:
        """The whole body (at most max_body bytes) as a replaying receive; None once it passes the limit."""
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
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
