"""The ASGI application of ``chunkyard serve``: the JSON API, ``/mcp``, and the guard in front.

``Guard`` (plain ASGI middleware, outermost) is where the safe defaults live:

- a bearer token, when one is set, on every route (compared in constant time);
- at most ``max_concurrent`` requests in flight (then 503 ``busy``);
- request bodies of at most ``max_body_bytes`` (413 ``body_too_large``, from the declared
  length or while the body streams in), and of strict UTF-8 when they are JSON;
- a query string that decodes as strict UTF-8 (400 ``bad_utf8``);
- any exception turned into 500 ``internal`` JSON; the traceback goes to the log only;
- per-route counts and latency for ``/metrics``.

FastAPI's own errors (404, 405, a body that is not JSON or not of the documented shape)
come out in the same JSON form (``not_found``, ``method_not_allowed``, ``bad_request``).
No route serves HTML (the interactive ``/docs`` pages are off), so nothing a client
sends is ever rendered as markup.
"""

from __future__ import annotations

import contextlib
import hmac
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from typing import Any
from urllib.parse import unquote_to_bytes

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from pipeline._version import __version__
from pipeline.errors import PipelineError
from pipeline.serve.handle import IndexHandle
from pipeline.serve.limits import Limits, ServeError, as_serve_error
from pipeline.serve.metrics import Metrics
from pipeline.serve.watching import WriterView

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

log = logging.getLogger("chunkyard.serve")

#: Paths counted under their own name in the metrics (anything else is ``other``).
ROUTES = frozenset(
    {"/v1/search", "/v1/chunk", "/v1/resolve", "/v1/check-citations", "/v1/documents", "/v1/health",
     "/metrics", "/mcp", "/openapi.json"}
)  # fmt: skip


async def _send_json(send: Send, status: int, body: dict[str, Any], extra: list[tuple[bytes, bytes]]) -> None:
    data = orjson.dumps(body)
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode()), *extra]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": data})


class Guard:
    """The safe defaults in front of the application (see the module docstring)."""

    def __init__(self, app: ASGIApp, limits: Limits, metrics: Metrics, token: str | None) -> None:
        self.app = app
        self.limits = limits
        self.metrics = metrics
        self.token = token.encode() if token else None
        self.in_flight = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        path = scope.get("path", "")
        route = path.rstrip("/") if path.rstrip("/") in ROUTES else "other"
        status = {"code": 500, "started": 0}

        async def counted_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                status["code"], status["started"] = int(message["status"]), 1
            await send(message)

        try:
            refusal = self._refusal(scope)
            if refusal is not None:
                await _send_json(counted_send, refusal.status, refusal.body(), self._auth_header(refusal))
                return
            self.in_flight += 1
            try:
                replay = await self._read_body(scope, receive)
                if isinstance(replay, ServeError):
                    await _send_json(counted_send, replay.status, replay.body(), [])
                    return
                await self.app(scope, replay, counted_send)
            finally:
                self.in_flight -= 1
        except Exception:
            log.exception("chunkyard serve: %s %s failed", scope.get("method"), path)
            if not status["started"]:  # a response under way cannot be replaced
                error = as_serve_error(RuntimeError())
                with contextlib.suppress(Exception):
                    await _send_json(counted_send, error.status, error.body(), [])
        finally:
            self.metrics.observe(route, str(status["code"]), time.perf_counter() - started)

    def _refusal(self, scope: Scope) -> ServeError | None:
        if self.token is not None:
            given = b""
            for name, value in scope.get("headers", []):
                if name == b"authorization" and value[:7].lower() == b"bearer ":
                    given = value[7:].strip()
            if not hmac.compare_digest(given, self.token):
                return ServeError(
                    401, "unauthorized", "a bearer token is required (hint: Authorization: Bearer TOKEN)"
                )
        if self.in_flight >= self.limits.max_concurrent:
            return ServeError(503, "busy", f"{self.in_flight} requests in flight; try again shortly")
        try:
            unquote_to_bytes(scope.get("query_string", b"").decode("latin-1")).decode("utf-8")
        except UnicodeDecodeError as exc:
            return ServeError(400, "bad_utf8", f"the query string is not UTF-8 (byte {exc.start})")
        return None

    @staticmethod
    def _auth_header(error: ServeError) -> list[tuple[bytes, bytes]]:
        return [(b"www-authenticate", b'Bearer realm="chunkyard"')] if error.status == 401 else []

    async def _read_body(self, scope: Scope, receive: Receive) -> Receive | ServeError:
        """The whole body (bounded), checked; a ``receive`` that replays it to the application."""
        headers = dict(scope.get("headers", []))
        limit = self.limits.max_body_bytes
        declared = headers.get(b"content-length")
        too_large = ServeError(413, "body_too_large", f"request body over {limit:,} bytes")
        if declared is not None and (not declared.isdigit() or int(declared) > limit):
            return too_large if declared.isdigit() else ServeError(400, "bad_request", "bad Content-Length")
        if scope.get("method") in ("GET", "HEAD", "DELETE", "OPTIONS") and declared is None:
            return receive  # the MCP stream (GET /mcp) must not be read ahead
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return ServeError(400, "bad_request", "the client went away")
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                return too_large
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        if b"json" in headers.get(b"content-type", b""):
            try:
                body.decode("utf-8")
            except UnicodeDecodeError as exc:
                return ServeError(400, "bad_utf8", f"the body is not UTF-8 (byte {exc.start})")
        sent = False

        async def replay() -> Message:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        return replay


def create_app(
    handle: IndexHandle,
    *,
    limits: Limits | None = None,
    token: str | None = None,
    host: str = "127.0.0.1",
    writer: WriterView | None = None,
    mcp: bool = True,
) -> Any:
    """The ASGI application: FastAPI routes, ``/mcp`` (streamable HTTP), wrapped in ``Guard``."""
    from pipeline.serve.routes import build_router

    limits = limits or Limits()
    metrics = Metrics(handle, (lambda: writer.state()) if writer is not None else (lambda: None))
    server: Any = None
    mcp_routes: list[Any] = []
    if mcp:
        from mcp.server.transport_security import TransportSecuritySettings

        from pipeline.serve.mcp_tools import build_mcp

        server = build_mcp(handle, limits)
        # a loopback bind keeps the SDK's DNS-rebinding check; another bind is guarded by the token
        security = (
            None
            if host in ("127.0.0.1", "localhost", "::1")
            else TransportSecuritySettings(enable_dns_rebinding_protection=False)
        )
        mcp_app = server.streamable_http_app(
            streamable_http_path="/mcp",
            stateless_http=True,
            json_response=True,
            max_request_body_size=limits.max_body_bytes,
            transport_security=security,
            host=host,
        )
        mcp_routes = list(mcp_app.routes)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        if server is None:
            yield
            return
        async with server.session_manager.run():
            yield

    api = FastAPI(
        title="chunkyard serve",
        version=__version__,
        description="Search a chunk folder's index with citations; resolve and check them. "
        "MCP (streamable HTTP) at /mcp.",
        docs_url=None,
        redoc_url=None,
        lifespan=lifespan,
    )
    api.include_router(build_router(handle, limits, metrics, writer))
    api.router.routes.extend(mcp_routes)

    @api.exception_handler(ServeError)
    async def on_serve_error(_: Request, exc: ServeError) -> JSONResponse:
        return JSONResponse(exc.body(), status_code=exc.status)

    @api.exception_handler(PipelineError)
    async def on_pipeline_error(_: Request, exc: PipelineError) -> JSONResponse:
        error = as_serve_error(exc)
        return JSONResponse(error.body(), status_code=error.status)

    @api.exception_handler(RequestValidationError)
    async def on_invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        details = [
            {"where": ".".join(str(p) for p in e.get("loc", ())), "message": str(e.get("msg", ""))[:300]}
            for e in exc.errors()[:10]
        ]
        first = details[0] if details else {"where": "(request)", "message": "invalid request"}
        error = ServeError(400, "bad_request", f"{first['where']}: {first['message']}", {"details": details})
        return JSONResponse(error.body(), status_code=400)

    @api.exception_handler(Exception)
    async def on_anything(_: Request, exc: Exception) -> JSONResponse:
        log.error("chunkyard serve: internal error", exc_info=exc)
        error = as_serve_error(exc)
        return JSONResponse(error.body(), status_code=error.status)

    @api.exception_handler(StarletteHTTPException)
    async def on_http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        error = ServeError(exc.status_code, code, str(exc.detail))
        return JSONResponse(error.body(), status_code=exc.status_code, headers=exc.headers)

    return Guard(api, limits, metrics, token)
