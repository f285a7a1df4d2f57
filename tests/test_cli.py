"""The command line (SPEC §5, §7): exit codes, --json, --quiet, --help, file naming, re-runs."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from contextlib import redirect_stdout
from pathlib import Path

import pytest
import typer
from conftest import ROOT, SCHEMA, stable, stable_bytes
from typer.testing import CliRunner

from pipeline.cli.app import app

GOOD = "# Title\n\nSome text.\n\n## Part\n\nMore text, with `code`.\n"
runner = CliRunner()


def make_corpus(root: Path, files: dict[str, str | bytes]) -> Path:
    for rel, content in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content.encode("utf-8") if isinstance(content, str) else content)
    return root


def ingest(*args: str):
    return runner.invoke(app, ["ingest", *args])


def chunk_files(out: Path) -> dict[str, bytes]:
    return {
        p.relative_to(out).as_posix(): p.read_bytes()
        for p in sorted(out.rglob("*.json"))
        if ".chunkyard" not in p.relative_to(out).parts
    }


def run_checker(checker, corpus: Path, out: Path) -> tuple[int, str]:
    with redirect_stdout(io.StringIO()) as printed:
        code = checker.main(["--corpus", str(corpus), "--chunks", str(out), "--schema", str(SCHEMA)])
    return code, printed.getvalue()


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    return make_corpus(tmp_path / "corpus", {"one.md": GOOD, "sub/two.md": GOOD.replace("Title", "Two")})


# -- exit codes ------------------------------------------------------------------------


def test_ok_is_exit_0(corpus: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = ingest(str(corpus), "--out", str(out), "--jobs", "1")
    assert result.exit_code == 0, result.output
    assert set(chunk_files(out)) == {
        "doc_one__ch0.json",
        "doc_one__ch1.json",
        "sub/doc_two__ch0.json",
        "sub/doc_two__ch1.json",
    }
    assert "chunks" in result.stdout  # the summary table


def test_corpus_as_option_and_jobs_2(corpus: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = runner.invoke(
        app, ["ingest", "--corpus", str(corpus), "--out", str(out), "--jobs", "2", "--quiet"]
    )
    assert result.exit_code == 0, result.output
    assert len(chunk_files(out)) == 4


def test_bad_utf8_file_is_exit_1_and_the_good_ones_are_chunked(corpus: Path, tmp_path: Path) -> None:
    make_corpus(corpus, {"bad.md": b"# Bad\n\ncaf\xe9 au lait\n", "nul.md": b"bin\x00ary"})
    out = tmp_path / "out"
    result = ingest(str(corpus), "--out", str(out), "--jobs", "1")
    assert result.exit_code == 1, result.output
    files = chunk_files(out)
    assert {"doc_one__ch0.json", "sub/doc_two__ch0.json"} <= set(files)
    assert not [f for f in files if "bad" in f or "nul" in f]
    assert "bad.md:byte 10" in result.stderr  # where: the file and the byte offset
    assert "nul.md:byte 3" in result.stderr
    assert "hint" in result.stderr


def test_failed_document_keeps_its_previous_chunks(corpus: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert ingest(str(corpus), "--out", str(out), "--jobs", "1", "--quiet").exit_code == 0
    before = chunk_files(out)
    (corpus / "one.md").write_bytes(b"# Title\n\nnow \xff broken\n")
    result = ingest(str(corpus), "--out", str(out), "--jobs", "1", "--quiet")
    assert result.exit_code == 1
    assert chunk_files(out) == before


def test_missing_corpus_is_exit_2(tmp_path: Path) -> None:
    result = ingest(str(tmp_path / "nope"), "--out", str(tmp_path / "out"))
    assert result.exit_code == 2
    assert "nope" in result.stderr
    assert not (tmp_path / "out").exists() or not chunk_files(tmp_path / "out")


@pytest.mark.parametrize(
    "args",
    [
        ["--target-tokens", "5"],
        ["--target-tokens", "many"],
        ["--overlap-tokens", "-1"],
        ["--target-tokens", "64", "--overlap-tokens", "64"],
        ["--tokenizer", "nope"],
        ["--jobs", "-3"],
        ["--no-such-option"],
    ],
    ids=lambda a: " ".join(a),
)
def test_bad_option_is_exit_2(args: list[str], corpus: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = ingest(str(corpus), "--out", str(out), *args)
    assert result.exit_code == 2, result.output
    assert not out.exists() or not chunk_files(out)


# -- output modes ----------------------------------------------------------------------


def test_json_summary_parses(corpus: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = ingest(str(corpus), "--out", str(out), "--jobs", "1", "--json")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["documents"] == 2
    assert summary["chunks"] == len(chunk_files(out)) == 4
    assert isinstance(summary["seconds"], int | float) and summary["seconds"] >= 0


def test_json_summary_lists_failures(corpus: Path, tmp_path: Path) -> None:
    make_corpus(corpus, {"bad.md": b"\xff"})
    result = ingest(str(corpus), "--out", str(tmp_path / "out"), "--jobs", "1", "--json")
    assert result.exit_code == 1
    summary = json.loads(result.stdout)
    assert summary["documents"] == 3
    assert any("bad.md" in f and "byte 0" in f for f in summary["failures"])


def test_quiet_prints_nothing_on_success(corpus: Path, tmp_path: Path) -> None:
    make_corpus(corpus, {"warn.md": "---\ntitle: [bad yaml\n---\n# Body\n"})  # a warning, not an error
    result = ingest(str(corpus), "--out", str(tmp_path / "out"), "--jobs", "1", "--quiet")
    assert result.exit_code == 0
    assert result.stdout == ""
    assert result.stderr == ""


def test_warnings_are_shown_without_quiet(corpus: Path, tmp_path: Path) -> None:
    make_corpus(corpus, {"warn.md": "---\ntitle: [bad yaml\n---\n# Body\n"})
    result = ingest(str(corpus), "--out", str(tmp_path / "out"), "--jobs", "1")
    assert result.exit_code == 0
    assert "warn.md" in result.stderr and "YAML" in result.stderr


def commands() -> list[str]:
    return sorted(typer.main.get_command(app).commands)  # type: ignore[attr-defined]


def test_every_spec_command_exists() -> None:
    """SPEC §7 names five commands; each exists and takes ``--out`` and the corpus as ``--corpus``."""
    spec = ["ingest", "watch", "validate", "resolve", "check-citations"]
    assert set(spec) <= set(commands()), set(spec) - set(commands())
    group = typer.main.get_command(app)
    for name in spec:
        options = {o for p in group.commands[name].params for o in p.opts}  # type: ignore[attr-defined]
        assert {"--out", "--corpus"} <= options, f"{name} lacks {({'--out', '--corpus'} - options)}"


@pytest.mark.parametrize("command", [None, *commands()])
def test_help_works_for_every_command(command: str | None) -> None:
    args = ["--help"] if command is None else [command, "--help"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "Usage" in result.stdout
    assert len(result.stdout.strip().splitlines()) > 3


def test_every_command_has_a_help_text() -> None:
    group = typer.main.get_command(app)
    for name, command in group.commands.items():  # type: ignore[attr-defined]
        assert (command.help or "").strip(), f"{name} has no help"
        for param in command.params:
            if param.param_type_name == "option" and param.name != "help":
                assert (param.help or "").strip(), f"{name} {param.opts} has no help"


def test_brackets_in_help_texts_are_shown_not_read_as_markup() -> None:
    """``--help`` goes through rich markup: an unescaped ``chunkyard[ray]`` loses its ``[ray]``."""
    import re

    group = typer.main.get_command(app)
    checked = 0
    for name, command in group.commands.items():  # type: ignore[attr-defined]
        shown = " ".join(runner.invoke(app, [name, "--help"], terminal_width=400).stdout.split())
        for param in command.params:
            for bracketed in re.findall(r"\w+\\?\[\w+\]", param.help or ""):
                checked += 1
                assert bracketed.replace("\\", "") in shown, f"{name} {param.opts}: {bracketed} not shown"
    assert checked, "no help text names an extra: nothing was checked"


def test_version() -> None:
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0
    assert result.stdout.startswith("chunkyard ")


# -- file naming -----------------------------------------------------------------------


def test_folders_are_mirrored_so_readmes_do_not_collide(tmp_path: Path) -> None:
    corpus = make_corpus(
        tmp_path / "c",
        {"a/README.md": "# A\n\ntext a\n", "b/README.md": "# B\n\ntext b\n", "README.md": "# Top\n"},
    )
    out = tmp_path / "out"
    assert ingest(str(corpus), "--out", str(out), "--jobs", "1", "--quiet").exit_code == 0
    files = chunk_files(out)
    assert set(files) == {"a/doc_README__ch0.json", "b/doc_README__ch0.json", "doc_README__ch0.json"}
    recs = {rel: json.loads(data) for rel, data in files.items()}
    assert recs["a/doc_README__ch0.json"]["id"] == "doc:a/README::ch0"
    assert recs["b/doc_README__ch0.json"]["parentId"] == "doc:b/README"
    assert recs["b/doc_README__ch0.json"]["metadata"]["sourceFile"] == "b/README.md"
    assert len({r["chunk_id"] for r in recs.values()}) == 3


ODD = {
    "!.md": "# Bang\n\nbang\n",
    "[[.md": "# Brackets\n\nbrackets\n",
    "with space.md": "# Space\n\nspace\n",
    "a|b.md": "# Pipe\n\npipe\n",
    "..md": "# Dots\n\ndots\n",
    "ünï cödé.md": "# Unicode\n\nunicode\n",
    "%20.md": "# Percent\n\npercent\n",
    "dir with space/x.markdown": "# Nested\n\nnested\n",
    "UPPER.MD": "# Upper\n\nupper\n",
}


def test_odd_file_names(tmp_path: Path, checker) -> None:
    corpus = make_corpus(
        tmp_path / "c", {**ODD, ".md": "hidden, not a document\n", "notes.txt": "not markdown\n"}
    )
    out = tmp_path / "out"
    result = ingest(str(corpus), "--out", str(out), "--jobs", "1", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["documents"] == len(ODD)
    files = chunk_files(out)
    assert set(files) == {
        "doc_!__ch0.json",
        "doc_[[__ch0.json",
        "doc_with space__ch0.json",
        "doc_a|b__ch0.json",
        "doc_.__ch0.json",
        "doc_ünï cödé__ch0.json",
        "doc_%20__ch0.json",
        "dir with space/doc_x__ch0.json",
        "doc_UPPER__ch0.json",
    }
    recs = [json.loads(d) for d in files.values()]
    by_id = {r["id"]: r for r in recs}
    assert by_id["doc:a|b::ch0"]["chunk_id"].startswith("a%7Cb|r=")
    assert by_id["doc:with space::ch0"]["chunk_id"].startswith("with%20space|r=")
    assert by_id["doc:%20::ch0"]["chunk_id"].startswith("%2520|r=")
    assert by_id["doc:.::ch0"]["metadata"]["sourceFile"] == "..md"
    assert len({r["chunk_id"] for r in recs}) == len(recs)
    code, printed = run_checker(checker, corpus, out)
    assert code == 0, printed


def test_long_file_name_is_shortened_but_unique(tmp_path: Path) -> None:
    stem_a, stem_b = "a" * 236 + "-one", "a" * 236 + "-two"  # 243-byte source names
    corpus = make_corpus(tmp_path / "c", {f"{stem_a}.md": "# A\n", f"{stem_b}.md": "# B\n"})
    out = tmp_path / "out"
    result = ingest(str(corpus), "--out", str(out), "--jobs", "1", "--quiet")
    assert result.exit_code == 0, result.output
    files = chunk_files(out)
    assert len(files) == 2
    assert all(len(Path(f).name.encode()) <= 255 for f in files)


# -- re-runs ---------------------------------------------------------------------------


def test_two_runs_give_byte_identical_files(tmp_path: Path) -> None:
    src = ROOT / "corpus"
    out1, out2 = tmp_path / "out1", tmp_path / "out2"
    assert ingest(str(src), "--out", str(out1), "--jobs", "2", "--quiet").exit_code == 0
    assert ingest(str(src), "--out", str(out2), "--jobs", "1", "--quiet").exit_code == 0
    a, b = chunk_files(out1), chunk_files(out2)
    assert set(a) == set(b) and a
    for rel in a:
        assert stable_bytes(a[rel]) == stable_bytes(b[rel]), rel
        assert stable(json.loads(a[rel])) == stable(json.loads(b[rel]))


def test_rerun_rewrites_nothing(corpus: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert ingest(str(corpus), "--out", str(out), "--jobs", "1", "--quiet").exit_code == 0
    before = {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in out.rglob("doc_*.json")}
    for extra in ([], ["--full"]):
        result = ingest(str(corpus), "--out", str(out), "--jobs", "1", "--json", *extra)
        assert result.exit_code == 0
        assert json.loads(result.stdout)["chunks"] == len(before)
        after = {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in out.rglob("doc_*.json")}
        assert after == before, f"files rewritten by a re-run {extra}"


def test_shrunk_and_deleted_documents_lose_their_files(corpus: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert ingest(str(corpus), "--out", str(out), "--jobs", "1", "--quiet").exit_code == 0
    (corpus / "one.md").write_text("# Title\n\nOnly one chunk now.\n")
    (corpus / "sub" / "two.md").unlink()
    assert ingest(str(corpus), "--out", str(out), "--jobs", "1", "--quiet").exit_code == 0
    assert set(chunk_files(out)) == {"doc_one__ch0.json"}


def test_output_inside_the_corpus_is_not_ingested(corpus: Path) -> None:
    out = corpus / "chunks"
    for _ in range(2):
        result = ingest(str(corpus), "--out", str(out), "--jobs", "1", "--json")
        assert result.exit_code == 0
        assert json.loads(result.stdout)["documents"] == 2


# -- a real process --------------------------------------------------------------------


def python_m_pipeline(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONIOENCODING": "utf-8"}
    return subprocess.run(
        [sys.executable, "-m", "pipeline", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_python_m_pipeline_ingest(tmp_path: Path, checker) -> None:
    corpus = make_corpus(
        tmp_path / "corpus",
        {"one.md": GOOD, "deep/er/two.md": GOOD, **{k: v for k, v in ODD.items() if "/" not in k}},
    )
    done = python_m_pipeline("ingest", "corpus", "--out", "chunks", "--json", "--jobs", "2", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["documents"] == len([p for p in corpus.rglob("*") if p.suffix.lower() == ".md"])
    assert summary["chunks"] == len(chunk_files(tmp_path / "chunks"))
    code, printed = run_checker(checker, corpus, tmp_path / "chunks")
    assert code == 0, printed
    make_corpus(corpus, {"bad.md": b"ok\n\xc3("})
    done = python_m_pipeline("ingest", "corpus", "--out", "chunks", "--quiet", cwd=tmp_path)
    assert done.returncode == 1
    assert done.stdout == ""
    assert "bad.md:byte 3" in done.stderr
    done = python_m_pipeline("ingest", "missing", "--out", "chunks", "--quiet", cwd=tmp_path)
    assert done.returncode == 2
