"""One self-contained HTML page: inline CSS and JS, data as JSON, a CSP that allows nothing else.

The page is static (``file://`` works): no server, no network, no CDN. Its data goes in
``<script type="application/json">`` elements, which a browser never executes, with every
``<`` written as ``\\u003c`` so no document text can close the element or open a comment.
The one script (``assets/view.js``) reads them with ``JSON.parse`` and builds the DOM
with ``textContent`` only; the Content-Security-Policy admits that script and that style
sheet by their SHA-256 and nothing else (no other script, no network, no frames, no forms).
"""

from __future__ import annotations

import base64
import hashlib
import html
import os
from collections.abc import Iterable
from functools import cache
from pathlib import Path
from typing import Any

import orjson

from pipeline.errors import PipelineError

ASSETS = Path(__file__).with_name("assets")


@cache
def asset(name: str) -> str:
    """The text of one bundled asset (``view.js``, ``view.css``)."""
    return (ASSETS / name).read_text(encoding="utf-8")


def csp_hash(text: str) -> str:
    """CSP source expression for an inline element's exact text."""
    digest = hashlib.sha256(text.encode("utf-8")).digest()
    return f"'sha256-{base64.b64encode(digest).decode()}'"


def json_block(value: Any) -> bytes:
    """``value`` as JSON safe inside a ``<script type="application/json">`` element.

    ``<`` only ever occurs inside JSON strings, where ``\\u003c`` means the same thing to
    ``JSON.parse``; without it, ``</script>`` in a document would end the element.
    """
    return orjson.dumps(value).replace(b"<", b"\\u003c")


def csp(script: str, style: str) -> str:
    """The page's policy: its own script and style by hash, and nothing else at all."""
    return (
        f"default-src 'none'; script-src {csp_hash(script)}; style-src {csp_hash(style)}; "
        "base-uri 'none'; form-action 'none'"
    )


def page_bytes(title: str, meta: dict[str, Any], docs: Iterable[tuple[int, dict[str, Any]]] = ()) -> bytes:
    """The whole page: ``meta`` is the ``cy-meta`` data block; ``docs`` are lazily parsed blocks."""
    script, style = asset("view.js"), asset("view.css")
    head = (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">\n'
        f'<meta http-equiv="Content-Security-Policy" content="{html.escape(csp(script, style))}">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"<title>{html.escape(title)}</title>\n<style>{style}</style>\n</head>\n<body>\n"
        "<noscript>This report needs JavaScript (its own, inline; nothing is loaded).</noscript>\n"
        '<div id="app"></div>\n'
    ).encode()
    parts = [head, b'<script type="application/json" id="cy-meta">', json_block(meta), b"</script>\n"]
    for n, doc in docs:
        parts += [
            f'<script type="application/json" id="cy-doc-{n}">'.encode(),
            json_block(doc),
            b"</script>\n",
        ]
    parts.append(f"<script>{script}</script>\n</body></html>\n".encode())
    return b"".join(parts)


def write_page(path: Path, data: bytes) -> None:
    """Write the page atomically (a temp file renamed into place)."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        tmp.write_bytes(data)
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise PipelineError(
            f"{path}: cannot write the report ({exc.strerror}); choose a writable --html"
        ) from None
