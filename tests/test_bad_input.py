"""Bad input is reported, never fatal and never destructive (SPEC §5); exit codes 0 / 1 / 2."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from conftest import NOBODY, as_nobody, require

import pipeline.run.ingest as ingest_mod
import pipeline.run.plan as plan_mod
import pipeline.run.worker  # noqa: F401 - loaded before any test drops privileges
from pipeline.errors import StageError
from pipeline.run.db import StateDB, dump_state
from pipeline.run.emit import stable_view
from pipeline.run.feed import read_feed
from pipeline.run.ingest import Options, Summary, ingest
from pipeline.run.state import STATE_DIR
from pipeline.runner import counter

GOOD = "# Good\n\nA perfectly fine document.\n\n## Part\n\nWith two sections and some words.\n"
VICTIM = "# Victim\n\nThis document will be broken later.\n\n## Part\n\nIts chunks must survive that.\n"


def run(corpus: Path, out: Path, **kw: Any) -> Summary:
    return ingest(Options(corpus=corpus, out=out, jobs=1, **kw))


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "300", "NO_COLOR": "1"}
    return subprocess.run(
        [sys.executable, "-m", "pipeline", *args], capture_output=True, text=True, env=env, check=False
    )


def files_of(out: Path) -> dict[str, bytes]:
    return {p.relative_to(out).as_posix(): p.read_bytes() for p in sorted(out.rglob("doc_*.json"))}


def entry(out: Path, rel: str) -> dict[str, Any]:
    docs: dict[str, Any] = dump_state(out)["docs"]
    return docs[rel]


@pytest.fixture
def built(tmp_path: Path) -> tuple[Path, Path]:
    corpus, out = tmp_path / "corpus", tmp_path / "out"
    corpus.mkdir()
    (corpus / "good.md").write_text(GOOD)
    (corpus / "victim.md").write_text(VICTIM)
    assert not run(corpus, out).failures
    return corpus, out


def break_and_check(corpus: Path, out: Path, raw: bytes, reason: str, **kw: Any) -> Summary:
    """Break victim.md; the run reports it and keeps its previous chunks; good.md is still chunked."""
    before = {k: v for k, v in files_of(out).items() if "victim" in k}
    old_entry = entry(out, "victim.md")
    (corpus / "victim.md").write_bytes(raw)
    (corpus / "good.md").write_text(GOOD + "\nAn edit, so that there is other work to do.\n")
    summary = run(corpus, out, **kw)
    assert summary.exit_code == 1
    assert len(summary.failures) == 1 and summary.failures[0].startswith("victim.md"), summary.failures
    assert reason in summary.failures[0]
    assert "hint:" in summary.failures[0]
    assert {k: v for k, v in files_of(out).items() if "victim" in k} == before
    assert entry(out, "victim.md") == old_entry
    assert "An edit" in files_of(out)["doc_good__ch1.json"].decode()
    return summary


def test_invalid_utf8_names_the_byte_offset(built: tuple[Path, Path]) -> None:
    corpus, out = built
    raw = b"# Victim\n\nCaf\xe9 au lait.\n"
    summary = break_and_check(corpus, out, raw, "not valid UTF-8")
    offset = raw.index(0xE9)
    assert f"byte {offset}" in summary.failures[0]


def test_binary_file_with_nul_bytes(built: tuple[Path, Path]) -> None:
    corpus, out = built
    break_and_check(corpus, out, b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", "NUL byte")


def test_file_over_the_size_limit(built: tuple[Path, Path]) -> None:
    corpus, out = built
    break_and_check(corpus, out, b"# Big\n\n" + b"word " * 400, "over the 1,000-byte limit", max_bytes=1000)


@pytest.mark.parametrize(("stat_says", "limit"), [(100, 1000), (1000, 1000), (900, 2008)])
def test_a_file_read_in_full_whatever_its_stat_said(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stat_says: int, limit: int
) -> None:
    """The read is sized by fstat; a file that grew since is read on, and never past the limit."""
    from pipeline.stages.normalize import read_source

    data = b"# Grew\n\n" + b"word " * 400  # 2,008 bytes
    path = tmp_path / "grew.md"
    path.write_bytes(data)
    real = os.fstat
    calls = []

    def fstat(fd: int) -> Any:
        calls.append(fd)
        st = real(fd)
        return os.stat_result((*st[:6], stat_says if len(calls) == 1 else st.st_size, *st[7:]))

    monkeypatch.setattr(os, "fstat", fstat)
    if limit >= len(data):
        assert read_source(path, "grew.md", limit) == data
    else:
        with pytest.raises(
            StageError, match=f"grew.md: read: file is 2,008 bytes, over the {limit:,}-byte limit"
        ):
            read_source(path, "grew.md", limit)


def test_pathological_nesting_is_not_fatal(built: tuple[Path, Path]) -> None:
    corpus, out = built
    text = "> " * 5000 + "deep\n\n" + "- " * 3000 + "deeper\n"
    (corpus / "deep.md").write_text(text)
    summary = run(corpus, out, doc_timeout=0)  # the outcome is the document's, not the machine's speed
    assert summary.exit_code == 0, summary.failures  # chunked (parse stops descending), not an error
    files = sorted(out.glob("doc_deep__ch*.json"), key=lambda p: int(p.stem.rsplit("ch", 1)[1]))
    recs = [json.loads(p.read_bytes()) for p in files]
    covered = bytearray(len(text))
    for r in recs:
        covered[r["charOffsets"]["charStart"] : r["charOffsets"]["charEnd"]] = (
            b"\x01" * r["charOffsets"]["totalChars"]
        )
    assert recs and all(covered[i] or text[i].isspace() for i in range(len(text)))  # nothing lost
    assert (out / "doc_good__ch0.json").exists()


def test_file_that_vanishes_mid_run(built: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    corpus, out = built
    real = plan_mod.discover

    def discover_then_delete(*a: Any, **k: Any) -> Any:
        found = real(*a, **k)
        (corpus / "victim.md").unlink()  # gone between discovery and reading
        return found

    monkeypatch.setattr(plan_mod, "discover", discover_then_delete)
    os.utime(corpus / "victim.md", ns=(1, 1))  # so the run wants to read it
    before = {k: v for k, v in files_of(out).items() if "victim" in k}
    summary = run(corpus, out)
    assert summary.exit_code == 1 and "vanished" in summary.failures[0]
    assert {k: v for k, v in files_of(out).items() if "victim" in k} == before
    monkeypatch.undo()
    summary = run(corpus, out)  # next run: it is simply gone
    assert summary.exit_code == 0 and not [k for k in files_of(out) if "victim" in k]


@pytest.fixture
def world(tmp_path: Path) -> Iterator[Path]:
    """A folder every user can reach (pytest's own tmp folders are private to root)."""
    path = Path(tempfile.mkdtemp(prefix="chunkyard-", dir="/tmp"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_unreadable_file(world: Path) -> None:
    corpus, out = world / "corpus", world / "out"
    corpus.mkdir(mode=0o755)
    (corpus / "good.md").write_text(GOOD)
    (corpus / "victim.md").write_text(VICTIM)
    assert not run(corpus, out).failures
    counter("cl100k_base")  # the vocabulary is loaded now, before privileges go
    before = files_of(out)
    (corpus / "victim.md").write_text(VICTIM + "\nEdited, then made unreadable.\n")
    (corpus / "victim.md").chmod(0o000)
    if os.geteuid() != 0:
        summary = run(corpus, out)
    else:  # root reads anything: drop to nobody, who owns the output but cannot read the file
        shutil.chown(out, NOBODY, NOBODY)
        for path in out.rglob("*"):
            shutil.chown(path, NOBODY, NOBODY)
        with as_nobody():
            summary = run(corpus, out)
    assert summary.exit_code == 1
    assert summary.failures[0].startswith("victim.md") and "permission denied" in summary.failures[0]
    assert files_of(out) == before


def test_output_folder_not_writable(world: Path) -> None:
    corpus, out = world / "corpus", world / "out"
    corpus.mkdir(mode=0o755)
    (corpus / "good.md").write_text(GOOD)
    assert not run(corpus, out).failures
    before = files_of(out)
    (corpus / "good.md").write_text(GOOD + "\nEdited.\n")
    if os.geteuid() == 0:
        with as_nobody(), pytest.raises(ingest_mod.UsageError, match="choose a writable --out"):
            run(corpus, out)
    else:
        out.chmod(0o555)
        (out / STATE_DIR).chmod(0o555)
        with pytest.raises(ingest_mod.UsageError):
            run(corpus, out)
    assert files_of(out) == before


def test_exit_codes(built: tuple[Path, Path], tmp_path: Path) -> None:
    corpus, out = built
    assert cli("ingest", str(corpus), "--out", str(out), "-q").returncode == 0
    (corpus / "victim.md").write_bytes(b"\xff\xfe# UTF-16")
    proc = cli("ingest", str(corpus), "--out", str(out))
    assert proc.returncode == 1
    assert "victim.md" in proc.stderr and "UTF-16" in proc.stderr  # listed at the end, with the reason
    assert cli("ingest", str(tmp_path / "nowhere"), "--out", str(out)).returncode == 2
    (tmp_path / "a-file").write_text("not a folder")
    proc = cli("ingest", str(corpus), "--out", str(tmp_path / "a-file"))
    assert proc.returncode == 2 and "writable" in proc.stderr
    assert cli("ingest", str(corpus), "--out", str(out), "--target-tokens", "1").returncode == 2


# ---------------------------------------------------------------- a full disk


@pytest.fixture
def small_disk(world: Path) -> Iterator[Path]:
    mnt = world / "disk"
    mnt.mkdir()
    proc = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mnt)], capture_output=True, check=False
    )
    if proc.returncode != 0:
        require("tmpfs", f"cannot mount a small tmpfs to fill ({proc.stderr.decode().strip()}); needs root")
    require("tmpfs", None)
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def resize(mnt: Path, size: int) -> None:
    subprocess.run(["mount", "-o", f"remount,size={size}", str(mnt)], check=True)


#: Some 2 MB of chunk files: more than the small disk has room for.
BIG_VICTIM = "# Victim\n\n" + "\n\n".join(
    f"## Part {n}\n\n" + f"Paragraph {n} with quite a few words in it. " * 40 for n in range(200)
)


def small_documents(corpus: Path) -> None:
    for i in range(6):
        (corpus / f"doc{i}.md").write_text(GOOD.replace("Good", f"Doc {i}"))


def converges_with_room_again(small_disk: Path, corpus: Path, out: Path, clean: Path) -> None:
    """Room again: the next run converges to what a clean run gives."""
    resize(small_disk, 64 * 1024 * 1024)
    time.sleep(0.01)
    assert cli("ingest", str(corpus), "--out", str(out), "-q").returncode == 0
    assert not run(corpus, clean).failures
    got, want = files_of(out), files_of(clean)
    assert got.keys() == want.keys()
    for rel in got:
        assert stable_view(orjson.loads(got[rel])) == stable_view(orjson.loads(want[rel])), rel


def test_full_disk_leaves_no_partial_files(world: Path, small_disk: Path) -> None:
    corpus, out, clean = world / "corpus", small_disk / "out", world / "clean"
    corpus.mkdir()
    small_documents(corpus)
    (corpus / "victim.md").write_text(VICTIM)
    assert not run(corpus, out).failures
    before = files_of(out)
    used = shutil.disk_usage(small_disk).used
    resize(small_disk, used + 64 * 1024)  # a little room: the big rewrite of victim.md cannot fit
    (corpus / "victim.md").write_text(BIG_VICTIM)
    (corpus / "doc0.md").write_text(GOOD + "\nA small edit.\n")
    proc = cli("ingest", str(corpus), "--out", str(out), "--jobs", "1", "--json")
    summary = orjson.loads(proc.stdout)
    assert proc.returncode in (1, 2), proc.stderr
    print(f"\nfull disk: exit {proc.returncode}; failures: {summary['failures']}")
    assert any(f.startswith("victim.md") and "No space left" in f for f in summary["failures"]), summary
    assert not list(out.rglob("*.tmp"))  # no partial files...
    after = files_of(out)
    for data in after.values():  # ...every visible file whole...
        orjson.loads(data)
    assert {k: v for k, v in after.items() if "victim" in k} == {
        k: v for k, v in before.items() if "victim" in k
    }
    assert all(line.event for line in read_feed(out, 0))  # the feed reads whole
    converges_with_room_again(small_disk, corpus, out, clean)


def test_a_full_disk_on_a_fresh_output_leaves_no_part_of_a_document(world: Path, small_disk: Path) -> None:
    """A fresh output folder takes unnamed files linked in (emit.py): a document that
    does not fit still leaves none of its files, and no temp file, behind."""
    corpus, out, clean = world / "corpus", small_disk / "out", world / "clean"
    corpus.mkdir()
    small_documents(corpus)
    (corpus / "victim.md").write_text(BIG_VICTIM)
    resize(small_disk, 1536 * 1024)  # room for the small documents and the state (its WAL), not the victim's 2 MB
    proc = cli("ingest", str(corpus), "--out", str(out), "--jobs", "1", "--json")
    summary = orjson.loads(proc.stdout)
    assert proc.returncode in (1, 2), proc.stderr
    assert any(f.startswith("victim.md") and "No space left" in f for f in summary["failures"]), summary
    assert not list(out.rglob("*.tmp"))
    got = files_of(out)
    assert not [k for k in got if "victim" in k]
    assert {k.split("__")[0] for k in got} == {f"doc_doc{i}" for i in range(6)}
    for data in got.values():
        orjson.loads(data)
    converges_with_room_again(small_disk, corpus, out, clean)


def test_state_that_cannot_be_written_is_exit_2_and_repaired(
    built: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The disk fills up once the run began: exit 2, every failure listed, the next run repairs."""
    corpus, out = built
    (corpus / "good.md").write_text(GOOD + "\nEdited.\n")
    (corpus / "victim.md").write_bytes(b"\x00binary")

    real_commit, commits = StateDB.commit, [0]

    def full(self: StateDB) -> None:
        commits[0] += 1
        if commits[0] == 1:  # the in-flight record still fits; nothing after it does
            return real_commit(self)
        self.conn.execute("ROLLBACK")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(StateDB, "commit", full)
    summary = run(corpus, out)
    assert summary.exit_code == 2
    assert [f.split(":")[0] for f in summary.failures] == ["victim.md", str(out / STATE_DIR)]
    assert "No space left on device" in summary.failures[1]
    monkeypatch.undo()
    assert dump_state(out)["inflight"] is not None
    summary = run(corpus, out)
    assert summary.exit_code == 1 and summary.processed == 2  # good.md re-checked: its files are right
    assert summary.written == 0 and summary.changed == 2  # already on disk; announced in the feed now
    # victim.md still fails, so it stays to be re-checked, but nothing calls for a sweep any more
    left = dump_state(out)["inflight"]
    assert left["docs"] == ["victim.md"] and left["sweep"] is False
