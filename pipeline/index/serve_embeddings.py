"""Serve the offline ONNX model over an OpenAI-compatible ``/v1/embeddings`` API.

``python -m pipeline.index.serve_embeddings [--port 8000] [--host 127.0.0.1] [--threads 2]``

For a machine that embeds for several others, or to try the ``openai:`` embedder without an
account: ``openai:all-MiniLM-L6-v2@http://127.0.0.1:8000/v1`` gives the vectors the in-process
default gives. Standard library only (``http.server``) plus the ``embed`` extra.

``--max-input-tokens N`` refuses (HTTP 400, ``context_length_exceeded``) any input longer
than ``N`` wordpieces, as OpenAI's API refuses inputs past its model's context instead of
cutting them: a client can be tried against that refusal without an account.

Endpoints: ``POST /v1/embeddings`` (``{"model", "input": str | [str], "encoding_format":
"float"}``), ``GET /v1/models`` and ``GET /v1/models/{id}``. Errors are OpenAI's shape,
``{"error": {"message", "type", "code"}}``. Once listening it prints one line,
``serving all-MiniLM-L6-v2 on http://HOST:PORT/v1``, so a caller can wait for it
(``--port 0`` picks a free port and that line names it).
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import sys
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from pipeline.index.embed_onnx import OnnxEmbedder

MODEL_ID = "all-MiniLM-L6-v2"
#: Model names a request may use for the one model served.
ALIASES = frozenset({MODEL_ID, "sentence-transformers/all-MiniLM-L6-v2", OnnxEmbedder.name, "default"})
#: Largest request body (a batch of 2,048 long chunks is well under this).
MAX_BODY = 64 * 1024 * 1024
MAX_INPUTS = 2048


class ApiError(Exception):
    """A request the server refuses, with the HTTP status and OpenAI's error fields."""

    def __init__(
        self, status: HTTPStatus, message: str, code: str, kind: str = "invalid_request_error"
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.kind = kind


def read_inputs(body: Any) -> list[str]:
    """The texts of an embeddings request, or an ``ApiError`` saying what is wrong."""
    if not isinstance(body, dict):
        raise ApiError(HTTPStatus.BAD_REQUEST, "the body must be a JSON object", "invalid_body")
    model = body.get("model")
    if model not in ALIASES:
        raise ApiError(
            HTTPStatus.NOT_FOUND, f"model {model!r} is not served here; use {MODEL_ID!r}", "model_not_found"
        )
    fmt = body.get("encoding_format", "float")
    if fmt != "float":
        raise ApiError(
            HTTPStatus.BAD_REQUEST, f"encoding_format {fmt!r}: only 'float' is served", "invalid_format"
        )
    dims = body.get("dimensions")
    if dims is not None and dims != OnnxEmbedder.dim:
        raise ApiError(
            HTTPStatus.BAD_REQUEST, f"dimensions {dims!r}: this model has {OnnxEmbedder.dim}", "invalid_dims"
        )
    inputs = body.get("input")
    texts = [inputs] if isinstance(inputs, str) else inputs
    if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
        raise ApiError(
            HTTPStatus.BAD_REQUEST, "input must be a string or a non-empty list of strings", "invalid_input"
        )
    if len(texts) > MAX_INPUTS:
        raise ApiError(HTTPStatus.BAD_REQUEST, f"at most {MAX_INPUTS} inputs per request", "too_many_inputs")
    return texts


class EmbeddingsHandler(BaseHTTPRequestHandler):
    """One request; ``server.embedder`` is shared by all (it serialises model calls)."""

    server_version = "chunkyard-embeddings/1"
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        if isinstance(self.server, EmbeddingsServer) and self.server.verbose:
            super().log_message(format, *args)

    def _send(self, status: HTTPStatus, payload: dict[str, Any]) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _error(self, exc: ApiError) -> None:
        self._send(exc.status, {"error": {"message": str(exc), "type": exc.kind, "code": exc.code}})

    def do_GET(self) -> None:
        model = {"id": MODEL_ID, "object": "model", "created": 0, "owned_by": "chunkyard"}
        if self.path.rstrip("/") == "/v1/models":
            self._send(HTTPStatus.OK, {"object": "list", "data": [model]})
        elif self.path == f"/v1/models/{MODEL_ID}":
            self._send(HTTPStatus.OK, model)
        else:
            self._error(
                ApiError(HTTPStatus.NOT_FOUND, f"no route {self.path}; try POST /v1/embeddings", "not_found")
            )

    def do_POST(self) -> None:
        try:
            if self.path.rstrip("/") != "/v1/embeddings":
                raise ApiError(
                    HTTPStatus.NOT_FOUND, f"no route {self.path}; try POST /v1/embeddings", "not_found"
                )
            length = int(self.headers.get("Content-Length") or 0)
            if not 0 < length <= MAX_BODY:
                raise ApiError(
                    HTTPStatus.BAD_REQUEST, f"body of {length} bytes (1..{MAX_BODY})", "invalid_body"
                )
            try:
                body = json.loads(self.rfile.read(length))
            except ValueError as exc:
                raise ApiError(
                    HTTPStatus.BAD_REQUEST, f"the body is not JSON: {exc}", "invalid_body"
                ) from exc
            texts = read_inputs(body)
        except ApiError as exc:
            self._error(exc)
            return
        assert isinstance(self.server, EmbeddingsServer)
        embedder = self.server.embedder
        limit = self.server.max_input_tokens
        too_long = [i for i, t in enumerate(texts) if limit and embedder.count_tokens(t) > limit]
        if too_long:
            first = texts[too_long[0]]
            self._error(
                ApiError(
                    HTTPStatus.BAD_REQUEST,
                    f"This model's maximum context length is {limit} tokens, however input "
                    f"{too_long[0]} has {embedder.count_tokens(first)} tokens. Please reduce the length of the input.",
                    "context_length_exceeded",
                )
            )
            return
        vectors = embedder.embed(texts)
        used = sum(min(embedder.count_tokens(t) + 2, embedder.max_tokens) for t in texts)
        data = [
            {"object": "embedding", "index": i, "embedding": row.tolist()} for i, row in enumerate(vectors)
        ]
        usage = {"prompt_tokens": used, "total_tokens": used}
        self._send(HTTPStatus.OK, {"object": "list", "data": data, "model": MODEL_ID, "usage": usage})


class EmbeddingsServer(ThreadingHTTPServer):
    """The HTTP server with the one model every request shares."""

    daemon_threads = True

    def __init__(
        self, host: str = "127.0.0.1", port: int = 0, threads: int | None = None, max_input_tokens: int = 0
    ) -> None:
        super().__init__((host, port), EmbeddingsHandler)
        self.embedder = OnnxEmbedder(threads=threads)
        self.verbose = False
        #: inputs longer than this many wordpieces are refused (0: none; the model cuts at its window)
        self.max_input_tokens = max_input_tokens

    @property
    def base_url(self) -> str:
        """``http://HOST:PORT/v1`` with the port actually bound."""
        host, port = self.server_address[:2]
        name = host.decode() if isinstance(host, bytes) else host
        return f"http://{name}:{port}/v1"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m pipeline.index.serve_embeddings", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)"
    )
    parser.add_argument(
        "--port", type=int, default=8000, help="port (0 = any free one; the ready line names it)"
    )
    parser.add_argument("--threads", type=int, default=None, help="model threads (default 2)")
    parser.add_argument(
        "--allow-remote", action="store_true", help="allow a --host that is not a loopback address"
    )
    parser.add_argument("--verbose", action="store_true", help="log every request to stderr")
    parser.add_argument(
        "--max-input-tokens",
        type=int,
        default=0,
        help="refuse inputs longer than this many wordpieces, as OpenAI does past a model's context (0: none)",
    )
    args = parser.parse_args(argv)
    try:
        loopback = ipaddress.ip_address(args.host).is_loopback
    except ValueError:
        loopback = args.host == "localhost"
    if not loopback and not args.allow_remote:
        parser.error(
            f"--host {args.host} is not a loopback address; add --allow-remote to serve other machines"
        )
    server = EmbeddingsServer(args.host, args.port, args.threads, args.max_input_tokens)
    server.verbose = args.verbose
    server.embedder.embed(["warm up"])  # load the model before saying ready
    print(f"serving {MODEL_ID} on {server.base_url}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
