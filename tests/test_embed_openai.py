"""The ``openai:`` embedder against a real server on 127.0.0.1 that serves the ONNX model.

The server runs as its own process (``python -m pipeline.index.serve_embeddings --port 0``);
the test waits for its ready line, which names the port, and stops it by its pid.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from pipeline.errors import UsageError
from pipeline.index.embed_openai import OpenAIEmbedder
from pipeline.index.embedders import EmbedderError, make_embedder
from pipeline.index.serve_embeddings import main as serve_main

TEXTS = [
    "How do I install the package with npm?",
    "Run `npm install left-pad` to add the package to your project.",
    "The borrow checker rejects two mutable references to one value.",
    "日本語のテキスト 🎉",
    "ownership " * 400,  # past the 256-wordpiece window: cut the same way on both sides
]


@pytest.fixture(scope="module")
def server_url() -> Iterator[str]:
    """The base URL of a serve_embeddings process on a free port of 127.0.0.1."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "pipeline.index.serve_embeddings", "--port", "0", "--threads", "1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        ready = proc.stdout.readline()  # blocks until the model is loaded and the port bound
        assert ready.startswith("serving all-MiniLM-L6-v2 on http://127.0.0.1:"), (ready, proc.stderr.read())
        yield ready.split(" on ", 1)[1].strip()
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def post(url: str, body: Any) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(
        f"{url}/embeddings", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_vectors_through_the_server_equal_the_in_process_model(server_url: str) -> None:
    remote = make_embedder(f"openai:all-MiniLM-L6-v2@{server_url}")
    assert isinstance(remote, OpenAIEmbedder)
    assert (remote.name, remote.dim, remote.normalized, remote.max_tokens) == (
        "openai:all-MiniLM-L6-v2",
        384,  # learnt from a probe request
        True,
        256,
    )
    local = make_embedder().embed(TEXTS)
    got = remote.embed(TEXTS)
    assert got.dtype == np.float32 and got.shape == (len(TEXTS), 384)
    assert np.abs(got - local).max() < 1e-5
    batched = make_embedder(f"openai:all-MiniLM-L6-v2@{server_url}?batch=2&dim=384").embed(TEXTS)
    assert np.abs(batched - local).max() < 1e-5  # three requests, rows in order
    assert remote.embed([]).shape == (0, 384)


def test_count_tokens_uses_the_models_units(server_url: str) -> None:
    remote = make_embedder(f"openai:all-MiniLM-L6-v2@{server_url}?dim=384")
    assert remote.count_tokens("ownership " * 400) == make_embedder().count_tokens("ownership " * 400) == 400
    openai_style = make_embedder(f"openai:text-embedding-3-small@{server_url}?dim=1536")
    assert (openai_style.max_tokens, openai_style.count_tokens("hello world")) == (8191, 2)  # cl100k


def test_server_down_is_a_clear_error_naming_the_url_and_the_fix() -> None:
    url = f"http://127.0.0.1:{free_port()}/v1"
    with pytest.raises(EmbedderError) as err:
        make_embedder(f"openai:all-MiniLM-L6-v2@{url}")  # the dimension probe fails
    message = str(err.value)
    assert f"{url}/embeddings: cannot reach the embedding server" in message
    assert "python -m pipeline.index.serve_embeddings" in message
    declared = make_embedder(f"openai:all-MiniLM-L6-v2@{url}?dim=384")  # no probe: fails on use
    with pytest.raises(EmbedderError, match="cannot reach"):
        declared.embed(["x"])


def test_a_wrong_dimension_is_refused(server_url: str) -> None:
    wrong = make_embedder(f"openai:all-MiniLM-L6-v2@{server_url}?dim=512")
    with pytest.raises(EmbedderError, match=r"returned 384-dim vectors, expected 512.*fix \?dim="):
        wrong.embed(["hello"])


def test_a_model_the_server_lacks_is_an_http_error_with_a_hint(server_url: str) -> None:
    with pytest.raises(EmbedderError) as err:
        make_embedder(f"openai:text-embedding-3-small@{server_url}")
    message = str(err.value)
    assert "HTTP 404" in message and "'text-embedding-3-small' is not served here" in message
    assert "does the server serve 'text-embedding-3-small'" in message


def test_a_server_that_never_answers_times_out() -> None:
    with socket.socket() as silent:  # accepts connections (backlog) and never replies
        silent.bind(("127.0.0.1", 0))
        silent.listen(4)
        url = f"http://127.0.0.1:{silent.getsockname()[1]}/v1"
        remote = make_embedder(f"openai:all-MiniLM-L6-v2@{url}?dim=384&timeout=0.3")
        with pytest.raises(EmbedderError, match=r"no answer within 0\.3 s.*timeout="):
            remote.embed(["hello"])


def test_bad_specs_are_usage_errors() -> None:
    with pytest.raises(UsageError, match="unknown option 'dims'"):
        make_embedder("openai:m@http://127.0.0.1:1/v1?dims=3")
    with pytest.raises(UsageError, match="not an http"):
        make_embedder("openai:m@ftp://127.0.0.1/v1?dim=3")
    with pytest.raises(UsageError, match="no model name"):
        make_embedder("openai:@http://127.0.0.1:1/v1?dim=3")
    with pytest.raises(UsageError, match="unknown tokenizer 'bpe'"):
        make_embedder("openai:m@http://127.0.0.1:1/v1?dim=3&tokenizer=bpe")
    with pytest.raises(UsageError, match="invalid literal"):
        make_embedder("openai:m@http://127.0.0.1:1/v1?dim=many")


def test_the_server_speaks_openais_shapes_and_errors(server_url: str) -> None:
    status, answer = post(server_url, {"model": "all-MiniLM-L6-v2", "input": "one text"})
    assert status == 200 and answer["object"] == "list" and answer["model"] == "all-MiniLM-L6-v2"
    assert [d["index"] for d in answer["data"]] == [0] and len(answer["data"][0]["embedding"]) == 384
    assert answer["usage"]["prompt_tokens"] == 2 + 2  # "one text" + [CLS] [SEP]
    status, answer = post(server_url, {"model": "all-MiniLM-L6-v2", "input": [[1, 2, 3]]})
    assert status == 400 and answer["error"]["code"] == "invalid_input"
    status, answer = post(server_url, {"model": "all-MiniLM-L6-v2", "input": ["x"], "encoding_format": "base64"})
    assert status == 400 and "only 'float'" in answer["error"]["message"]
    with urllib.request.urlopen(f"{server_url}/models", timeout=30) as response:
        assert [m["id"] for m in json.loads(response.read())["data"]] == ["all-MiniLM-L6-v2"]


def test_the_server_refuses_a_non_loopback_address_unless_told() -> None:
    with pytest.raises(SystemExit) as exit_:
        serve_main(["--host", "0.0.0.0", "--port", "0"])
    assert exit_.value.code == 2
