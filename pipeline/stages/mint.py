"""Stage mint: drafts → chunk records with ids, links, hashes and revisions.

The contract: docs/spec.md, "Chunk files" and "Ids".
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import orjson
from blake3 import blake3

from pipeline.models import Chunk, Draft, Policy, SourceDoc
from pipeline.stages.tokens import estimate_tokens

if TYPE_CHECKING:
    from pipeline.stages.parse import Lines

CHUNKER_VERSION = "md-heading-v1"
SCHEMA_VERSION = "1.1.0"  # 1.1: doc_id in every record
#: Longest chunk file name we write; most file systems allow 255 bytes.
MAX_NAME_BYTES = 240

_UID_UNSAFE = re.compile(r"[|%\s]")
_MD_LEAD = re.compile(r"^\s*(?:#{1,6}\s+|>\s*|[-*+]\s+|\d{1,9}[.)]\s+|\|)+")
#: An inline link or image whose text holds at most one level of balanced brackets: its text stays.
_MD_LINK = re.compile(r"!?\[((?:[^\[\]]|\[[^\[\]]*\])*)\]\([^()]*\)")
#: Emphasis and code marks: every run of ``*`` and backticks, and a run of ``_`` that does not
#: sit between two word characters. Each branch starts with a literal (``(?<!\w)_+`` is
#: ``_(?<!\w_)_*``), so the engine skips to the next mark instead of trying every position.
_MD_EMPHASIS = re.compile(r"[*`]+|_(?<!\w_)_*|_+(?!\w)")
#: A line that starts another block (in or out of a quote): a heading, list item, fence or table row.
_NEW_BLOCK = re.compile(
    r"[ \t]*(?:>[ \t]?)*[ \t]*(?:#{1,6}(?:[ \t]|$)|[-*+][ \t]|\d{1,9}[.)][ \t]|```|~~~|\|)"
)
_QUOTE_LEAD = re.compile(r"[ \t]*(?:>[ \t]?)+")  # a quote's marks on a continuation line
#: The longest anchor (docs/spec.md, "Chunk files").
ANCHOR_CHARS = 200
#: A sentence's last character: ``.!?`` before a blank, or a CJK full stop, ! or ?.
_SENTENCE_END = re.compile(r"[.!?](?=\s)|[。！？]")
_RULE_LINE = re.compile(r"[|\-: =#*_>]+")  # table rules, thematic breaks, bare markers


def sha1_8(text: str, width: int = 8) -> str:
    return hashlib.sha1(text.encode("utf-8")).hexdigest()[:width]


def text_rev(text: str) -> str:
    """``rev``: sha1_8 of the whitespace-collapsed canonical text (001's revision lock)."""
    return sha1_8(" ".join(text.split()))


def policy_hash(policy: Policy) -> str:
    """blake3 of the canonical JSON of the policy, 16 hex (003)."""
    canonical = orjson.dumps(policy.as_dict(), option=orjson.OPT_SORT_KEYS)
    return blake3(canonical).hexdigest()[:16]


def doc_uid(doc: SourceDoc) -> str:
    """Front matter ``doc_id``, else the doc name; ``|``, ``%`` and blanks percent-encoded."""
    front = doc.front_matter or {}
    raw = front.get("doc_id")
    uid = str(raw).strip() if isinstance(raw, str | int) and str(raw).strip() else doc.doc_name
    return _UID_UNSAFE.sub(lambda m: "".join(f"%{b:02X}" for b in m[0].encode("utf-8")), uid)


def chunk_file(doc_name: str, n: int) -> str:
    """``<reldir>/doc_<stem>__ch<N>.json``; a stem too long for the file system is cut and hashed."""
    folder, _, stem = doc_name.rpartition("/")
    name = f"doc_{stem}__ch{n}.json"
    if len(name.encode("utf-8")) > MAX_NAME_BYTES:
        short = stem.encode("utf-8")[:160].decode("utf-8", "ignore")
        name = f"doc_{short}~{hashlib.sha1(stem.encode('utf-8')).hexdigest()[:12]}__ch{n}.json"
    return f"{folder}/{name}" if folder else name


def chunk_files(doc_name: str, count: int) -> list[str]:
    """``chunk_file(doc_name, n)`` for n < ``count``, the name built once when it is short."""
    folder, _, stem = doc_name.rpartition("/")
    if len(stem) * 4 + len("doc___ch.json") + len(str(count)) > MAX_NAME_BYTES:  # maybe too long
        return [chunk_file(doc_name, n) for n in range(count)]  # in UTF-8: name by name
    lead = f"{folder}/doc_{stem}__ch" if folder else f"doc_{stem}__ch"
    return [f"{lead}{n}.json" for n in range(count)]


def anchor(text: str) -> str:
    """The first salient sentence (000): the first line of text that is not a heading, a fence
    or a rule, joined with the lines that soft-wrap its paragraph, Markdown marks dropped (a link
    or an image keeps its text), up to its first sentence end; at most ``ANCHOR_CHARS``, cut at a
    word boundary. A chunk of nothing but headings anchors on the first of them."""
    fallback = ""
    lines = _lines(text)
    for line in lines:
        stripped = line.strip()
        if not stripped or stripped.startswith(("```", "~~~")) or _RULE_LINE.fullmatch(stripped):
            continue
        if fallback and stripped.startswith("#"):
            continue  # a heading is only ever the fallback, and the first one is kept
        plain = _plain(stripped)
        if not plain:
            continue
        if stripped.startswith("#"):
            fallback = plain
            continue
        end = _SENTENCE_END.search(plain)
        if not stripped.startswith("|"):  # a table row is a line of its own; a paragraph wraps
            parts = [stripped]
            while end is None and len(plain) < ANCHOR_CHARS:
                more = next(lines, None)
                if more is None or _ends_paragraph(more):
                    break
                parts.append(_QUOTE_LEAD.sub("", more, count=1) if ">" in more else more)
                plain = _plain(" ".join(parts))
                end = _SENTENCE_END.search(plain)
        return _cap(plain[: end.start() + 1] if end else plain)
    return _cap(fallback or " ".join(text.split()))


def _plain(line: str) -> str:
    """A line (or joined lines) without its block marks, links, images and emphasis."""
    lead = _MD_LEAD.match(line)  # anchored: what ``sub`` would drop, without its scan
    plain = line[lead.end() :] if lead else line
    while "](" in plain:  # outermost first, then what its text holds: ``[![alt](img)](url)`` → ``alt``
        unwrapped = _MD_LINK.sub(_link_text, plain)
        if unwrapped == plain:
            break
        plain = unwrapped
    if "*" in plain or "_" in plain or "`" in plain:
        plain = _MD_EMPHASIS.sub("", plain)
    return " ".join(plain.split())


def _ends_paragraph(line: str) -> bool:
    """Whether ``line`` cannot continue the paragraph above it: blank, or another block's start."""
    stripped = line.strip()
    return not stripped or bool(_NEW_BLOCK.match(line)) or bool(_RULE_LINE.fullmatch(stripped))


def _cap(plain: str) -> str:
    """At most ``ANCHOR_CHARS`` characters, cut at the last word boundary that fits."""
    if len(plain) <= ANCHOR_CHARS:
        return plain
    cut = plain.rfind(" ", 0, ANCHOR_CHARS + 1)
    return plain[:cut] if cut > 0 else plain[:ANCHOR_CHARS]


def _link_text(match: re.Match[str]) -> str:
    return match[1]  # the text of a link, the alt text of an image


def _lines(text: str) -> Iterator[str]:
    """The lines of ``text``, one at a time: the anchor is nearly always in the first few."""
    pos = 0
    while (nl := text.find("\n", pos)) >= 0:
        yield text[pos:nl]
        pos = nl + 1
    yield text[pos:]


def mint(
    doc: SourceDoc,
    drafts: Sequence[Draft],
    *,
    title: str,
    outline_hash: str,
    policy: Policy,
    uid: str,
    processed_at: str,
    processing_ms: float,
    version: str,
    lines: Lines | None = None,
) -> list[Chunk]:
    """Turn drafts into chunk records, linked in reading order."""
    name = doc.doc_name
    front = doc.front_matter or {}
    source_url = next(
        (str(front[k]) for k in ("source_url", "url") if isinstance(front.get(k), str) and front[k]),
        doc.rel_path,
    )
    rev = text_rev(doc.text)
    lang = front.get("lang") if isinstance(front.get("lang"), str) and front.get("lang") else policy.lang
    options = policy.as_dict()
    p_hash = policy_hash(policy)
    analyzer = "verbatim+context-prefix" if policy.context_prefix else "verbatim"
    total = len(drafts)
    if lines is None:
        from pipeline.stages.parse import (
            Lines,  # loading mistletoe is slow: not on a run with nothing to chunk
        )

        lines = Lines(doc.text)
    chunks = []
    widths: dict[str, int] = {}  # b= is 3 digits, wider for a whole section past 999 pieces
    for d in drafts:
        widths[d.section.path] = max(widths.get(d.section.path, 3), len(str(d.first_piece)))
    metadata: dict[str, Any] = {  # the same for every chunk of the document: one dict, shared
        "sourceFile": doc.rel_path,
        "processedAt": processed_at,
        "chunkingOptions": options,
        "chunkerVersion": CHUNKER_VERSION,
        "policyHash": p_hash,
        "analyzer": analyzer,
        "lang": lang,
        "pipeline": {"version": version, "processingTimeMs": processing_ms},
    }
    if doc.front_matter is not None:
        metadata["frontMatter"] = doc.front_matter
    parent = f"doc:{name}"
    ids = [f"{parent}::ch{n}" for n in range(total)]
    uid_rev = f"{uid}|r={outline_hash}|s="
    files = chunk_files(name, total)
    heads: dict[str, dict[str, Any]] = {}  # per section; its lists are shared by its chunks
    for n, d in enumerate(drafts):
        sect = d.section
        head = heads.get(sect.path)
        if head is None:
            titles, slugs = sect.titles, sect.slugs
            head = heads[sect.path] = {
                "sectionTitle": titles[-1] if titles else "",
                "headerPath": list(titles),
                "headerBreadcrumb": " > ".join(titles),
                "headerDepths": list(sect.depths),
                "headerSlugs": list(slugs),
                "sectionSlug": slugs[-1] if slugs else "",
            }
        start, end = d.start, d.end
        original = doc.text[start:end]
        record: dict[str, Any] = {
            "id": ids[n],
            "parentId": parent,
            "prevId": ids[n - 1] if n else None,
            "nextId": ids[n + 1] if n + 1 < total else None,
            "chunkNumber": n,
            "contentType": "doc",
            "doc_id": uid,  # 001's doc_id: a citation is copied from the record's own fields
            "chunk_id": f"{uid_rev}{sect.path}|p=000|b={d.first_piece:0{widths[sect.path]}d}",
            "section_id": sect.path,
            "block_type": d.block_type,
            "fileTitle": title,
            **head,  # sectionTitle … sectionSlug, in this place of the record
            "originalText": original,
            "embedText": d.embed_text,
            "charOffsets": {"charStart": start, "charEnd": end, "totalChars": end - start},
            "lineSpan": {
                "lineStart": lines.line_of(start),
                "lineEnd": lines.line_of(end - 1),
            },
            "tokenStats": {
                "tokens": d.tokens,
                # errs high (docs/spec.md, "Chunk files"): the heuristic, never below the exact count
                "estimatedTokens": max(estimate_tokens(d.embed_text), d.tokens),
                "tokenizer": policy.tokenizer,
            },
            "hash": "blake3:" + blake3(original.encode("utf-8")).hexdigest(),
            "anchor": anchor(original),
            "source_url": source_url,
            "rev": rev,
            "blocks": _provenance(d),
            "metadata": metadata,
            "schema_version": SCHEMA_VERSION,
        }
        chunks.append(Chunk(files[n], record))
    return chunks


def _provenance(d: Draft) -> list[dict[str, Any]]:
    """Every contributing block, its pieces in this chunk merged into one span."""
    out: list[dict[str, Any]] = []
    sect = d.section
    last = -1  # the block of ``out[-1]``: a piece of the same block widens its span
    span: dict[str, Any] = {}
    for p in d.pieces:
        bi = p.block_index
        if bi == last:
            span["charEnd"] = max(span["charEnd"], p.end)
            continue
        span = {
            "block_id": f"{sect.path}/{bi:03d}",
            "type": sect.blocks[bi].kind,
            "charStart": p.start,
            "charEnd": p.end,
        }
        out.append(span)
        last = bi
    return out
