"""What the adapter tests share: a small corpus with edits, and the chunk state read straight from disk."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pipeline.api import ingest
from pipeline.models import Policy

#: The change feed is the one with sequence numbers in the state database (SPEC §10),
#: not the JSON-lines file: tests that edit the file itself do not apply.

#: Small enough that every section makes several chunks: an edit inside one paragraph
#: must then re-embed one chunk, not the document.
POLICY = Policy(target_tokens=48, overlap_tokens=8)

PARAGRAPH = (
    "Paragraph {n} of {name} talks about topic {n}: retrieval needs stable chunk ids, "
    "exact offsets and citations that can be checked against the source text."
)


def document(name: str, sections: int = 3, paragraphs: int = 4, heading: str = "Part") -> str:
    parts = [f"# Guide {name}", ""]
    for s in range(sections):
        parts += [f"## {heading} {s}", ""]
        for p in range(paragraphs):
            parts += [PARAGRAPH.format(n=s * 10 + p, name=name), ""]
    return "\n".join(parts)


def make_corpus(root: Path, names: tuple[str, ...] = ("alpha", "beta", "gamma")) -> Path:
    corpus = root / "corpus"
    (corpus / "sub").mkdir(parents=True)
    for i, name in enumerate(names):
        folder = corpus / "sub" if i % 2 else corpus
        (folder / f"{name}.md").write_text(document(name))
    return corpus


def run_ingest(corpus: Path, out: Path) -> None:
    summary = ingest(corpus, out, policy=POLICY, doc_timeout=0, doc_memory_mb=0)
    assert summary.exit_code == 0, summary.failures


def chunk_state(out: Path) -> dict[str, dict[str, Any]]:
    """``chunk_id`` → record, read from the chunk files themselves (not through the API)."""
    state: dict[str, dict[str, Any]] = {}
    for path in out.rglob("doc_*.json"):
        if ".chunkyard" in path.parts:
            continue
        record = json.loads(path.read_text(encoding="utf-8"))
        state[record["chunk_id"]] = record
    return state


def embed_texts(out: Path) -> dict[str, str]:
    return {cid: rec["embedText"] for cid, rec in chunk_state(out).items()}


def changed_texts(before: dict[str, str], after: dict[str, str]) -> set[str]:
    """The chunk ids whose embedded text is new or different: what must be embedded."""
    return {cid for cid, text in after.items() if before.get(cid) != text}


def edit_one_paragraph(corpus: Path, name: str = "alpha") -> Path:
    path = corpus / f"{name}.md"
    text = path.read_text()
    old = PARAGRAPH.format(n=11, name=name)
    assert old in text
    path.write_text(text.replace(old, old.replace("stable chunk ids", "stable, edit-proof chunk ids")))
    return path


def random_edit(corpus: Path, rng: Any, step: int) -> str:
    """One realistic edit of the corpus, chosen by ``rng``; returns what it did."""
    docs = sorted(p for p in corpus.rglob("*.md"))
    kind = rng.choice(["edit", "insert", "remove", "heading", "add", "delete", "rename"] if docs else ["add"])
    if kind == "add" or (kind == "delete" and len(docs) < 2):
        path = corpus / f"new{step}.md"
        path.write_text(document(f"new{step}", sections=rng.randint(1, 3)))
        return f"add {path.name}"
    path = rng.choice(docs)
    if kind == "delete":
        path.unlink()
        return f"delete {path.name}"
    if kind == "rename":
        target = path.with_name(f"renamed{step}.md")
        path.rename(target)
        return f"rename {path.name} -> {target.name}"
    lines = path.read_text().split("\n")
    paras = [i for i, line in enumerate(lines) if line.startswith("Paragraph")]
    heads = [i for i, line in enumerate(lines) if line.startswith("## ")]
    if kind == "heading" and heads:
        i = rng.choice(heads)
        lines[i] += f" v{step}"
    elif kind == "insert" and paras:
        i = rng.choice(paras)
        lines[i:i] = [f"Inserted paragraph {step}: a new thought about chunk ids and offsets.", ""]
    elif kind == "remove" and len(paras) > 1:
        i = rng.choice(paras)
        del lines[i : i + 2]
    elif paras:
        i = rng.choice(paras)
        lines[i] = lines[i].replace("exact offsets", f"exact offsets (edit {step})", 1)
    path.write_text("\n".join(lines))
    return f"{kind} {path.name}"
