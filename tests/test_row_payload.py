"""A stored row's payload is its fields as JSON with sorted keys, byte for byte: ``row_digest``
digests it, and every index already on disk compares against the digests it wrote. The
encoding orders the fields itself (no per-row key sort); these bytes are what it must give."""

from __future__ import annotations

import dataclasses

import orjson

from pipeline.index.rows import ChunkRow, digest_bytes


def _row() -> ChunkRow:
    text = 'Ünïcode text, a "quote" and 中文 — all kept.'
    return ChunkRow(
        chunk_id="guide|r=1|s=2|p=000|b=000",
        file="doc_guide__ch2.json",
        id="doc:guide:2",
        hash="blake3:00ff",
        digest="blake3:11ee",
        doc_id="guide",
        section_id="2",
        source_url="guide.md",
        source_file="guide.md",
        start=10,
        end=10 + len(text),
        line_start=3,
        line_end=4,
        tokens=9,
        rev="0123abcd",
        analyzer="verbatim",
        policy_hash="p",
        title="Guide",
        breadcrumb="Guide > Two",
        text=text,
        embed_text="Guide > Two\n" + text,
        model_tokens=12,
    )


def test_payload_is_the_fields_as_sorted_json_and_reads_back() -> None:
    row = _row()
    want = orjson.dumps(dataclasses.asdict(row), option=orjson.OPT_SORT_KEYS)
    assert row.to_json() == want
    assert row.encoded() == (want, digest_bytes(want)) and row.row_digest == digest_bytes(want)
    assert ChunkRow.from_json(want) == row
    assert row.with_tokens(40).to_json() == orjson.dumps(
        dataclasses.asdict(dataclasses.replace(row, model_tokens=40)), option=orjson.OPT_SORT_KEYS
    )
