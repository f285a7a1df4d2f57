"""An embedder that calls an OpenAI-compatible ``POST /v1/embeddings`` endpoint.

Spec: ``openai:MODEL[@BASE_URL][?dim=N&max_tokens=N&tokenizer=NAME&batch=N&timeout=S&api_key_env=VAR]``.

* ``BASE_URL`` defaults to ``$OPENAI_BASE_URL``, else ``https://api.openai.com/v1``; a local
  server (``python -m pipeline.index.serve_embeddings``) is ``http://127.0.0.1:PORT/v1``.
* The API key comes from the environment only, never from the spec (specs end up in
  indexes and logs): ``$CHUNKYARD_EMBED_API_KEY``, else ``$OPENAI_API_KEY``, else the
  variable ``api_key_env`` names. A local server needs none.
* ``dim`` is checked on every answer; without it one probe request learns it.
* ``tokenizer`` and ``max_tokens`` say how the model counts (``count_tokens``): known
  models have defaults (all-MiniLM-L6-v2: wordpiece, 256; OpenAI's: cl100k_base, 8191).

Only the standard library is used (urllib, json); vectors come back L2-normalised.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from pipeline.errors import UsageError
from pipeline.index.embedders import EmbedderError
from pipeline.stages.tokens import TOKENIZERS, Counter

if TYPE_CHECKING:
    import numpy

DEFAULT_BASE_URL = "https://api.openai.com/v1"
KEY_ENVS = ("CHUNKYARD_EMBED_API_KEY", "OPENAI_API_KEY")
#: (tokenizer, window) of models whose units are known.
KNOWN_MODELS = {
    "all-MiniLM-L6-v2": ("wordpiece", 256),
    "text-embedding-3-small": ("cl100k_base", 8191),
    "text-embedding-3-large": ("cl100k_base", 8191),
    "text-embedding-ada-002": ("cl100k_base", 8191),
}
SERVER_HINT = (
    "start it (python -m pipeline.index.serve_embeddings --port PORT) or fix the URL in openai:MODEL@URL"
)
_PARAMS = ("dim", "max_tokens", "tokenizer", "batch", "timeout", "api_key_env")


class OpenAIEmbedder:
    """Vectors from an OpenAI-compatible server, batched, with a timeout per request."""

    normalized = True

    def __init__(
        self,
        model: str,
        base_url: str | None = None,
        *,
        dim: int | None = None,
        max_tokens: int | None = None,
        tokenizer: str | None = None,
        batch_size: int = 64,
        timeout: float = 60.0,
        api_key_env: str | None = None,
    ) -> None:
        if not model:
            raise UsageError("openai embedder: no model name (spec: openai:MODEL@http://HOST:PORT/v1)")
        known_tokenizer, known_window = KNOWN_MODELS.get(model, ("cl100k_base", 8191))
        self.model = model
        self.name = f"openai:{model}"
        self.base_url = (base_url or os.environ.get("OPENAI_BASE_URL") or DEFAULT_BASE_URL).rstrip("/")
        self.url = f"{self.base_url}/embeddings"
        if urllib.parse.urlsplit(self.url).scheme not in ("http", "https"):
            raise UsageError(
                f"openai embedder: {self.base_url!r} is not an http(s) URL (e.g. http://127.0.0.1:8000/v1)"
            )
        self.tokenizer = tokenizer or known_tokenizer
        if self.tokenizer not in TOKENIZERS:
            raise UsageError(
                f"openai embedder: unknown tokenizer {self.tokenizer!r}; choose one of {', '.join(TOKENIZERS)}"
            )
        self.max_tokens = max_tokens or known_window
        if batch_size < 1 or timeout <= 0 or self.max_tokens < 1:
            raise UsageError("openai embedder: batch, timeout and max_tokens must be positive")
        self.batch_size = batch_size
        self.timeout = timeout
        self._key_envs = (*KEY_ENVS, *([api_key_env] if api_key_env else []))
        self._counter: Counter | None = None
        self._declared_dim = dim
        self.dim = dim if dim is not None else self._probe_dim()

    def _probe_dim(self) -> int:
        """One request to learn the model's dimension (the spec may give ``?dim=`` instead)."""
        return int(self._request(["dimension probe"]).shape[1])

    def count_tokens(self, text: str) -> int:
        """``text``'s length in the model's units, by the tokenizer the spec names."""
        if self._counter is None:
            self._counter = Counter(self.tokenizer)
        return self._counter.count(text)

    def embed(self, texts: Sequence[str]) -> numpy.ndarray:
        """float32 ``(len(texts), dim)``, in order, L2-normalised; batches of ``batch_size``."""
        import numpy as np

        out: numpy.ndarray = np.zeros((len(texts), self.dim), dtype=np.float32)
        for start in range(0, len(texts), self.batch_size):
            batch = list(texts[start : start + self.batch_size])
            out[start : start + len(batch)] = self._request(batch)
        return out

    def _api_key(self) -> str | None:
        for env in self._key_envs:
            if os.environ.get(env):
                return os.environ[env]
        return None

    def _request(self, batch: list[str]) -> numpy.ndarray:
        import numpy as np

        body = json.dumps({"model": self.model, "input": batch, "encoding_format": "float"}).encode()
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        key = self._api_key()
        if key:
            headers["Authorization"] = f"Bearer {key}"
        request = urllib.request.Request(self.url, data=body, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                payload = json.loads(response.read())
        except urllib.error.HTTPError as exc:
            raise EmbedderError(self._http_problem(exc)) from exc
        except urllib.error.URLError as exc:
            if isinstance(exc.reason, TimeoutError):
                raise EmbedderError(self._timeout_problem()) from exc
            raise EmbedderError(
                f"{self.url}: cannot reach the embedding server: {exc.reason} (hint: {SERVER_HINT})"
            ) from exc
        except TimeoutError as exc:
            raise EmbedderError(self._timeout_problem()) from exc
        except (OSError, ValueError) as exc:
            raise EmbedderError(
                f"{self.url}: bad answer: {exc} (hint: is this an OpenAI-compatible /v1 URL?)"
            ) from exc
        vectors = self._vectors(payload, len(batch))
        array = np.asarray(vectors, dtype=np.float32)
        norms = np.linalg.norm(array, axis=1, keepdims=True)
        result: numpy.ndarray = array / np.clip(norms, 1e-12, None)
        return result

    def _vectors(self, payload: Any, expected: int) -> list[list[float]]:
        """The answer's embeddings in input order, checked for count and dimension."""
        data = payload.get("data") if isinstance(payload, dict) else None
        if not isinstance(data, list) or len(data) != expected:
            got = len(data) if isinstance(data, list) else "no 'data' list"
            raise EmbedderError(
                f"{self.url}: asked for {expected} embeddings, got {got} (hint: is this an OpenAI-compatible /v1 URL?)"
            )
        try:
            rows = sorted(data, key=lambda item: int(item.get("index", 0)))
            vectors = [list(map(float, item["embedding"])) for item in rows]
        except (AttributeError, KeyError, TypeError, ValueError) as exc:
            raise EmbedderError(
                f"{self.url}: malformed embeddings in the answer ({exc}); send encoding_format=float"
            ) from exc
        want = self._declared_dim if self._declared_dim is not None else len(vectors[0])
        wrong = {len(v) for v in vectors} - {want}
        if wrong:
            raise EmbedderError(
                f"{self.url}: model {self.model!r} returned {min(wrong)}-dim vectors, expected {want} "
                f"(hint: fix ?dim= in the embedder spec, or rebuild the index for this model)"
            )
        self._declared_dim = want
        return vectors

    def _timeout_problem(self) -> str:
        return f"{self.url}: no answer within {self.timeout:g} s (hint: is the server busy? raise ?timeout=SECONDS)"

    def _http_problem(self, exc: urllib.error.HTTPError) -> str:
        try:
            detail = json.loads(exc.read()).get("error", {}).get("message", "")
        except (ValueError, AttributeError, OSError):
            detail = ""
        hint = {
            401: f"set the API key in ${KEY_ENVS[0]} or ${KEY_ENVS[1]}",
            403: f"the API key in ${KEY_ENVS[0]} / ${KEY_ENVS[1]} may not use this model",
            404: f"is {self.base_url!r} the /v1 base URL, and does the server serve {self.model!r}?",
            429: "rate limited: wait, or lower ?batch=",
        }.get(exc.code, "see the server's log")
        return f"{self.url}: HTTP {exc.code} {exc.reason}{': ' + detail if detail else ''} (hint: {hint})"


def parse_openai_spec(spec: str) -> OpenAIEmbedder:
    """``openai:MODEL[@BASE_URL][?k=v&...]`` → an embedder (see the module docstring)."""
    rest = spec.removeprefix("openai:")
    rest, _, query = rest.partition("?")
    model, _, base_url = rest.partition("@")
    params = dict(urllib.parse.parse_qsl(query, keep_blank_values=True))
    unknown = sorted(set(params) - set(_PARAMS))
    if unknown:
        raise UsageError(f"embedder {spec!r}: unknown option {unknown[0]!r}; known: {', '.join(_PARAMS)}")
    try:
        return OpenAIEmbedder(
            model,
            base_url or None,
            dim=int(params["dim"]) if "dim" in params else None,
            max_tokens=int(params["max_tokens"]) if "max_tokens" in params else None,
            tokenizer=params.get("tokenizer"),
            batch_size=int(params.get("batch", 64)),
            timeout=float(params.get("timeout", 60.0)),
            api_key_env=params.get("api_key_env"),
        )
    except ValueError as exc:
        raise UsageError(f"embedder {spec!r}: {exc}") from exc


def make_openai(model: str, *, threads: int | None = None, device: str | None = None) -> OpenAIEmbedder:
    """The ``openai`` entry of the embedder table: ``openai:MODEL[@BASE_URL][?k=v&...]``.

    The model runs on its server: ``threads`` does not apply, and a ``device`` is refused.
    """
    if device is not None:
        raise UsageError(f"openai:{model}: runs on its server, not on {device!r} (hint: drop the device)")
    return parse_openai_spec(f"openai:{model}")
