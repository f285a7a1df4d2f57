"""One document in the terminal, its chunks as bands of alternating colors (``chunkyard view DOC``)."""

from __future__ import annotations

import os
from pathlib import Path

from rich.console import Console
from rich.text import Text

from pipeline.audit.chunk_state import ChunkStore
from pipeline.errors import UsageError
from pipeline.view.collect import DocView

BANDS = ("black on #a9c7ff", "black on #ffd7a8")
OVERLAP = "black on #ff9b9b"
OUTSIDE = "dim"


def printable(text: str) -> str:
    """``text`` with control characters (escape sequences!) shown as symbols, one for one."""
    out = []
    for ch in text:
        o = ord(ch)
        if (o < 0x20 and ch not in "\n\t") or o == 0x7F:
            out.append(chr(0x2400 + o) if o < 0x20 else "\u2421")
        elif 0x80 <= o < 0xA0:
            out.append("\ufffd")
        else:
            out.append(ch)
    return "".join(out)


def find_doc(store: ChunkStore, arg: str) -> str:
    """The manifest key for ``arg``: a key itself, a path to the source, or a doc name."""
    docs = store.docs
    if arg in docs:
        return arg
    path = Path(arg)
    for base in (store.corpus.resolve(), Path.cwd()):
        try:
            rel = (path if path.is_absolute() else (Path.cwd() / path)).resolve().relative_to(base)
        except (ValueError, OSError):
            continue
        if rel.as_posix() in docs:
            return rel.as_posix()
    by_name = [k for k in docs if k.rsplit(".", 1)[0] == arg.replace(os.sep, "/")]
    if len(by_name) == 1:
        return by_name[0]
    raise UsageError(
        f"{arg}: not a document of {store.out} (hint: give its path relative to the corpus, "
        "as chunkyard validate lists it, or run chunkyard ingest first)"
    )


def banded(doc: DocView) -> Text:
    """The document as rich ``Text``: chunk spans alternate colors, overlaps and gaps stand out."""
    n_chars = len(doc.text)
    text = Text(printable(doc.text), no_wrap=False)
    delta = [0] * (n_chars + 1)
    for n, ch in enumerate(doc.chunks):
        start, end = min(ch[0], n_chars), min(ch[1], n_chars)
        text.stylize(BANDS[n % 2], start, end)
        delta[start] += 1
        delta[end] -= 1
    depth, kind, run_start = 0, 1, 0  # kind: 0 outside every chunk, 1 one chunk, 2 overlap
    for i in range(n_chars + 1):
        depth += delta[i] if i < n_chars else 0
        now = min(depth, 2) if i < n_chars else -1
        if now != kind:
            if kind != 1 and i > run_start:
                text.stylize(OUTSIDE if kind == 0 else OVERLAP, run_start, i)
            kind, run_start = now, i
    return text


def print_document(doc: DocView, console: Console) -> None:
    """A header line, then the banded text."""
    tokens = sum(ch[2] for ch in doc.chunks)
    head = Text(f"{doc.rel_path}: {len(doc.chunks)} chunks, {tokens} tokens", style="bold")
    console.print(head)
    if doc.error:
        console.print(Text(doc.error, style="red"))
    if doc.stale:
        console.print(Text(f"{doc.stale} chunk(s) no longer match the source: re-run ingest", style="yellow"))
    console.print(banded(doc), soft_wrap=True)
