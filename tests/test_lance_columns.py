"""The LanceDB store's payload column, built from joined buffers rather than object by object:
the same strings, in order, whatever the parts it is cut into (Arrow's ``string`` offsets are
32-bit, so a commit of more than ``_COLUMN_PART_BYTES`` is several parts)."""

from __future__ import annotations

import orjson
import pyarrow as pa
import pytest

from pipeline.index import lance_store
from pipeline.index.lance_store import utf8_column

VALUES = [orjson.dumps({"text": t, "n": i}) for i, t in enumerate(["é中文", "", "plain", "😀 x", "a" * 50])]


def test_one_part_holds_every_value_as_text() -> None:
    column = utf8_column(pa, VALUES)
    column.validate(full=True)  # offsets and UTF-8 checked by Arrow itself
    assert column.type == pa.string()
    assert column.num_chunks == 1
    assert column.to_pylist() == [v.decode() for v in VALUES]


@pytest.mark.parametrize("part_bytes", [1, 30, 64])
def test_parts_keep_the_values_and_their_order(monkeypatch: pytest.MonkeyPatch, part_bytes: int) -> None:
    monkeypatch.setattr(lance_store, "_COLUMN_PART_BYTES", part_bytes)
    column = utf8_column(pa, VALUES)
    column.validate(full=True)
    assert column.num_chunks > 1
    for chunk in column.chunks:  # a part is within the bound, or one value longer than it
        assert len(chunk) == 1 or sum(len(v.encode()) for v in chunk.to_pylist()) <= part_bytes
    assert column.to_pylist() == [v.decode() for v in VALUES]


def test_no_values_make_an_empty_column() -> None:
    column = utf8_column(pa, [])
    assert len(column) == 0 and column.type == pa.string()
