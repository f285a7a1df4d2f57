"""Search-time expansion over real chunk files: a hit grows into its section's neighbours, within a budget."""

from __future__ import annotations

import subprocess
import sys
from itertools import pairwise
from pathlib import Path

import pytest

from pipeline.chunkfolder import iter_chunk_files, read_chunk_file
from pipeline.evaluate.gold import Sources
from pipeline.index.expand import ChunkFiles, ChunkSpan, chunk_spans, expand

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def chunk_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """corpus/ chunked small (64 tokens), so sections hold several chunks."""
    out = tmp_path_factory.mktemp("chunks")
    subprocess.run(
        [sys.executable, "-m", "pipeline", "ingest", str(ROOT / "corpus"), "--out", str(out), "--quiet",
         "--jobs", "1", "--target-tokens", "64", "--overlap-tokens", "0"],
        check=True,
    )
    return out


@pytest.fixture(scope="module")
def spans(chunk_dir: Path) -> dict[str, ChunkSpan]:
    return chunk_spans(read_chunk_file(chunk_dir / rel) for rel in iter_chunk_files(chunk_dir))


def section_runs(spans: dict[str, ChunkSpan]) -> list[list[ChunkSpan]]:
    """Runs of ≥ 3 chunks linked next to next within one section."""
    runs = []
    for span in spans.values():
        before = spans.get(span.prev_id) if span.prev_id else None
        if before is not None and before.section_id == span.section_id:
            continue  # not the first of its run
        run = [span]
        while run[-1].next_id and spans[run[-1].next_id].section_id == span.section_id:
            run.append(spans[run[-1].next_id])
        if len(run) >= 3:
            runs.append(run)
    return runs


def item(span: ChunkSpan) -> dict[str, object]:
    return {"chunk_id": span.chunk_id, "source": span.source, "score": 1.0, "text": "the hit's own text",
            "offsets": {"start": span.start, "end": span.end, "unit": "char"}, "tokens": span.tokens}


def test_a_hit_grows_into_its_section_after_then_before_and_cites_one_exact_span(spans):
    runs = section_runs(spans)
    assert runs, "corpus/ at 64 tokens has sections of three chunks or more"
    sources = Sources(ROOT / "corpus")
    for run in runs:
        middle = run[1]
        whole = sum(s.tokens for s in run)
        [got] = expand([item(middle)], spans.get, budget=whole,
                       text_of=lambda src, a, b: sources.get(src).text[a:b])
        assert got["chunk_ids"][0] == middle.chunk_id
        assert set(got["chunk_ids"]) == {s.chunk_id for s in run}  # the whole section run, nothing more
        assert (got["offsets"]["start"], got["offsets"]["end"]) == (run[0].start, run[-1].end)
        assert got["text"] == sources.get(middle.source).text[run[0].start : run[-1].end]
        assert got["tokens"] == whole
        # one chunk less of budget: the chunk after is taken before the one before the hit
        [small] = expand([item(middle)], spans.get, budget=middle.tokens + run[2].tokens)
        assert small["chunk_ids"] == [middle.chunk_id, run[2].chunk_id]
        assert "text" not in small  # no text_of: the hit's text would not match the passage


def test_a_passage_never_crosses_its_section_or_its_budget(spans):
    budget = 160
    for span in spans.values():
        [got] = expand([item(span)], spans.get, budget=budget)
        members = [spans[c] for c in got["chunk_ids"]]
        assert {(m.source, m.section_id) for m in members} == {(span.source, span.section_id)}
        assert got["tokens"] <= max(budget, span.tokens)
        if span.tokens > budget:
            assert got["chunk_ids"] == [span.chunk_id]  # too big to grow: alone


def test_document_scope_grows_across_headings_but_not_across_documents(spans):
    budget = 160
    crossed = 0
    for span in spans.values():
        [got] = expand([item(span)], spans.get, budget=budget, scope="document")
        members = sorted((spans[c] for c in got["chunk_ids"]), key=lambda m: m.start)
        assert {m.source for m in members} == {span.source}
        assert all(a.next_id == b.chunk_id for a, b in pairwise(members))  # one run: one span
        assert got["tokens"] <= max(budget, span.tokens)
        assert got["chunk_ids"][0] == span.chunk_id
        crossed += len({m.section_id for m in members}) > 1
    assert crossed >= 10, "corpus/ at 64 tokens has short sections: passages cross headings"
    with pytest.raises(ValueError, match="unknown passage scope"):
        expand([item(next(iter(spans.values())))], spans.get, scope="page")


def test_later_hits_inside_an_earlier_passage_are_dropped_and_unknown_items_pass(spans):
    run = section_runs(spans)[0]
    unknown = {"chunk_id": "elsewhere", "source": "x.md", "offsets": {"start": 0, "end": 5}, "text": "hello"}
    budget = sum(s.tokens for s in run)
    got = expand([item(run[0]), unknown, item(run[2]), item(run[1])], spans.get, budget=budget)
    assert [g["chunk_id"] for g in got] == [run[0].chunk_id, "elsewhere"]
    assert got[1] == unknown
    # a second hit next to a first passage grows away from it, never into it
    first, second = expand([item(run[0]), item(run[1])], spans.get, budget=run[0].tokens)
    assert first["chunk_ids"] == [run[0].chunk_id]
    assert second["chunk_ids"][0] == run[1].chunk_id and run[0].chunk_id not in second["chunk_ids"]


def test_ranked_only_merges_adjacent_hits_and_skips_unranked_neighbours(spans):
    run = section_runs(spans)[0]
    budget = sum(s.tokens for s in run)
    # the middle chunk and the last are ranked (1st and 3rd), the first is not: one passage of two
    other = next(s for s in spans.values() if s.source != run[0].source)
    got = expand([item(run[1]), item(other), item(run[2])], spans.get, budget=budget, ranked_only=True)
    assert got[0]["chunk_ids"] == [run[1].chunk_id, run[2].chunk_id]
    assert run[0].chunk_id not in got[0]["chunk_ids"]  # unranked: not taken, though the budget allows
    assert [g["chunk_id"] for g in got] == [run[1].chunk_id, other.chunk_id]  # the 3rd merged into the 1st
    # without ranked_only the unranked first chunk joins too
    [whole, _] = expand([item(run[1]), item(other)], spans.get, budget=budget)
    assert run[0].chunk_id in whole["chunk_ids"]


def test_ranked_only_grows_toward_the_better_ranked_neighbour_first(spans):
    run = section_runs(spans)[0]
    first, middle, last = run[0], run[1], run[2]
    budget = middle.tokens + max(first.tokens, last.tokens)  # room for one neighbour only
    # the chunk before the hit ranked better than the one after: it is taken, not the one after
    got = expand([item(middle), item(first), item(last)], spans.get, budget=budget, ranked_only=True)
    assert got[0]["chunk_ids"] == [middle.chunk_id, first.chunk_id]
    # the other way round, and without ranks (plain growth): the one after, as always
    got = expand([item(middle), item(last), item(first)], spans.get, budget=budget, ranked_only=True)
    assert got[0]["chunk_ids"] == [middle.chunk_id, last.chunk_id]
    [plain] = expand([item(middle)], spans.get, budget=budget)
    assert plain["chunk_ids"] == [middle.chunk_id, last.chunk_id]


def test_depth_limits_which_ranked_neighbours_may_join(spans):
    run = section_runs(spans)[0]
    other = [s for s in spans.values() if s.source != run[0].source][:3]
    budget = sum(s.tokens for s in run)
    ranked = [item(run[1]), *(item(s) for s in other), item(run[2])]  # the neighbour after ranks 5th
    [first, *_] = expand(ranked, spans.get, budget=budget, ranked_only=True, depth=4)
    assert first["chunk_ids"] == [run[1].chunk_id]  # the 5th is beyond the depth: a wall
    [first, *_] = expand(ranked, spans.get, budget=budget, ranked_only=True, depth=5)
    assert first["chunk_ids"] == [run[1].chunk_id, run[2].chunk_id]
    # the hits below the depth stay chunks: the 5th and a 6th next to it do not merge
    low = expand([*ranked, item(run[0])], spans.get, budget=budget, ranked_only=True, depth=4)
    assert [g["chunk_ids"] for g in low[-2:]] == [[run[2].chunk_id], [run[0].chunk_id]]
    with pytest.raises(ValueError, match="depth"):
        expand(ranked, spans.get, ranked_only=True, depth=0)


def test_chunk_files_reads_the_same_spans_lazily(chunk_dir, spans):
    """From a hit's own file, neighbours are found by SPEC §2's file naming: the same spans as reading all."""
    files = {read_chunk_file(chunk_dir / rel)["chunk_id"]: rel for rel in iter_chunk_files(chunk_dir)}
    for run in section_runs(spans)[:5]:
        lazy = ChunkFiles(chunk_dir)
        lazy.remember(run[0].chunk_id, files[run[0].chunk_id])
        walked = [lazy(run[0].chunk_id)]
        while walked[-1] is not None and walked[-1].next_id and len(walked) < len(run):
            walked.append(lazy(walked[-1].next_id))
        assert walked == run  # every field, links as chunk ids
        assert len(lazy.spans) <= len(run) + 1  # only the files it walked were turned into spans
    assert ChunkFiles(chunk_dir)("never-remembered") is None


def doc_runs(spans: dict[str, ChunkSpan], length: int) -> list[list[ChunkSpan]]:
    """The first ``length`` chunks of each document that has that many, linked next to next."""
    runs = []
    for span in spans.values():
        if span.prev_id is not None:
            continue
        run = [span]
        while run[-1].next_id and len(run) < length:
            run.append(spans[run[-1].next_id])
        if len(run) == length:
            runs.append(run)
    return runs


def test_a_shared_prompt_gives_each_later_passage_half_of_what_it_has_left(spans):
    """With ``prompt``, passages share one prompt: the first grows to the budget (half the prompt),
    each later one to half of what the prompt has left after those above it, never below half
    the budget, so a hit ranked lower still fits beside the first passages."""
    first_run, second_run, third_run = doc_runs(spans, 8)[:3]  # chunks of about 64 tokens
    budget = 240
    prompt = 2 * budget
    hits = [item(first_run[0]), item(second_run[0]), item(third_run[0])]
    got = expand(hits, spans.get, budget=budget, prompt=prompt, scope="document")
    alone = [expand([h], spans.get, budget=budget, scope="document")[0] for h in hits]
    assert got[0]["chunk_ids"] == alone[0]["chunk_ids"]  # the first: the whole budget, as without a prompt
    left = prompt - got[0]["tokens"]
    [want] = expand([hits[1]], spans.get, budget=max(budget // 2, min(budget, left // 2)), scope="document")
    assert got[1]["chunk_ids"] == want["chunk_ids"]
    assert got[1]["tokens"] < alone[1]["tokens"]  # the premise: the prompt's share binds
    assert (prompt - got[0]["tokens"] - got[1]["tokens"]) // 2 < budget // 2  # the premise: below the floor
    [floor] = expand([hits[2]], spans.get, budget=budget // 2, scope="document")
    assert got[2]["chunk_ids"] == floor["chunk_ids"] and len(floor["chunk_ids"]) > 1  # half the budget still
    # without a prompt every passage may take the whole budget
    assert [g["chunk_ids"] for g in expand(hits, spans.get, budget=budget, scope="document")] == [
        a["chunk_ids"] for a in alone
    ]
    with pytest.raises(ValueError, match="prompt"):
        expand(hits, spans.get, budget=budget, prompt=-1)
