#!/usr/bin/env python3
"""Generate a corpus of hostile and broken input (issue 7): every case chunkyard must survive.

    python tests/make_hostile_corpus.py DEST [--before] [--small]

or, from a test::

    from make_hostile_corpus import make_hostile_corpus
    cases = make_hostile_corpus(dest)

Nothing here is committed as a large file: the big documents are written on demand.
``--before`` (``stage="before"``) writes tame versions of the documents that will
be broken, so that a first ingest gives them chunk files that the hostile run
must leave alone (and content to ``empty.md`` / ``blank.md``, whose chunks must go).
``--small`` leaves out the heavy documents (100 000 headings, a 10 MB line, 50 MB).

Each case says what a run must make of it (``Case.expect``):

- ``good``: chunked, and the output passes ``check_chunks.py``;
- ``good-own``: chunked, checked by chunkyard's own invariants only, because the
  shared checker cannot follow it (a shortened chunk file name, a folder tree
  deeper than ``pathlib.rglob`` can recurse, a document it checks in quadratic time);
- ``empty``: no chunks (its earlier chunks removed);
- ``bad``: listed among the failures with ``Case.reason`` in the message, and
  its earlier chunk files untouched;
- ``heavy``: chunked (the hostile run sets no time limit), held to the checks that stay
  linear in its size;
- ``skip``: not a document (a dangling link, a folder loop): nothing happens.

A case may also expect a warning (``Case.warning``).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

GOOD = "# {title}\n\nA tame version of this document, chunked before it went bad.\n\n## Part\n\nMore words.\n"
LONG_STEM = "L" * 240  # + ".md" = 243 bytes: a legal file name, too long for "doc_…__chN.json"
DEEP_FOLDERS = 1200  # deeper than Python's recursion limit


@dataclass(frozen=True)
class Case:
    """One file of the corpus and what a run must make of it."""

    rel: str
    expect: str  # good | good-own | empty | bad | heavy | skip
    reason: str = ""  # for ``bad``: a phrase the failure message must hold
    warning: str = ""  # a phrase some warning about this file must hold
    before: bool = False  # written tame by stage "before", so it has chunks to keep (or lose)
    heavy: bool = False  # left out by ``small``


def _words(n: int, seed: int = 0) -> str:
    vocab = [
        "alpha",
        "beta",
        "gamma",
        "delta",
        "chunk",
        "token",
        "budget",
        "section",
        "heading",
        "retrieval",
        "offset",
    ]
    return " ".join(vocab[(i * 7 + seed) % len(vocab)] for i in range(n))


def _paragraphs(n: int) -> str:
    return "\n\n".join(f"{_words(40, i)}. {_words(25, i + 1)}." for i in range(n)) + "\n"


# -- content ------------------------------------------------------------------------------

#: The first line of a document that ``test_hostile.py``'s test-only stage never finishes.
STALL_MARK = "<!-- chunkyard-test: stall -->"

CONTENT: dict[str, Callable[[], bytes]] = {
    # content cases that must be chunked
    "plain.md": lambda: ("# Plain\n\n" + _paragraphs(6) + "\n## Second\n\n" + _paragraphs(3)).encode(),
    "fence_unterminated.md": lambda: (
        "# Fence\n\nBefore the fence.\n\n```python\ndef f():\n    return 1\n\n# not a heading\n"
        + _paragraphs(3)
    ).encode(),
    "frontmatter_unterminated.md": lambda: (
        "---\ntitle: Never closed\nauthor: x\n\n# Body\n\n" + _paragraphs(2)
    ).encode(),
    "frontmatter_invalid.md": lambda: (
        "---\ntitle: [unclosed\n  : : bad yaml\n---\n# Body\n\n" + _paragraphs(2)
    ).encode(),
    "frontmatter_laughs.md": lambda: (
        "---\na: &a [x, x, x, x, x, x, x, x, x]\n"
        + "".join(
            f"{c}: &{c} [{', '.join([f'*{p}'] * 9)}]\n" for p, c in zip("abcdefgh", "bcdefghi", strict=True)
        )
        + "---\n# Laughs\n\nThe front matter above expands to 387 million values.\n"
    ).encode(),
    "frontmatter_deep.md": lambda: (
        "---\nx: "
        + "[" * 30_000
        + "]" * 30_000
        + "\n---\n# Deep front matter\n\nlibyaml would overflow its C stack.\n"
    ).encode(),
    "frontmatter_bigint.md": lambda: (
        b"---\nid: 123456789012345678901234567890\nratio: .inf\n---\n# Big numbers\n\nNot 64-bit.\n"
    ),
    "table_2000_cols.md": lambda: (
        "# Wide\n\n"
        + "|"
        + "|".join(f"c{i}" for i in range(2000))
        + "|\n"
        + "|"
        + "|".join("-" for _ in range(2000))
        + "|\n"
        + ("|" + "|".join(str(i % 10) for i in range(2000)) + "|\n") * 5
        + "\nAfter the table.\n"
    ).encode(),
    "quote_10k.md": lambda: (
        "# Quotes\n\n" + ">" * 10_000 + " ten thousand levels deep\n\nAfter.\n"
    ).encode(),
    "list_10k.md": lambda: ("# Lists\n\n" + "- " * 10_000 + "ten thousand levels deep\n\nAfter.\n").encode(),
    "list_600_indented.md": lambda: (
        "# Stairs\n\n" + "".join("  " * i + f"- level {i}\n" for i in range(600))
    ).encode(),
    "quote_stairs_500.md": lambda: (
        "# Quote stairs\n\n" + "".join(">" * i + f" level {i}\n" for i in range(1, 500))
    ).encode(),
    "emphasis.md": lambda: (
        "# Emphasis\n\n"
        + "*a" * 30_000
        + "\n\n"
        + "_b" * 30_000
        + "\n\n"
        + "**" * 20_000
        + "\n\n"
        + "[" * 30_000
        + "\n\n"
        + "](" * 20_000
        + "\n\n"
        + "<" * 20_000
        + "\n\n"
        + "`" * 10_001
        + "\n"
    ).encode(),
    "heading_emphasis.md": lambda: (
        "# " + "*a_" * 5_000 + "\n\ntext\n\n## " + "[x](" * 3_000 + "\n\nmore\n"
    ).encode(),
    "linkdefs_20k.md": lambda: (
        "# References\n\n"
        + "".join(f'[ref{i}]: https://example.com/{i} "Title {i}"\n' for i in range(20_000))
    ).encode(),
    "linkdefs_unclosed_titles.md": lambda: (
        "# Titles\n\n" + "".join(f'[r{i}]: /u{i} "never closed\n' for i in range(20_000))
    ).encode(),
    "headings_2k.md": lambda: "".join(
        f"{'#' * (1 + i % 6)} Heading {i}\n\nline {i}\n\n" for i in range(2_000)
    ).encode(),
    "setext_many.md": lambda: "".join(
        f"Title {i}\n{'=-'[i % 2] * 3}\n\nbody {i}\n\n" for i in range(1_000)
    ).encode(),
    "line_1mb.md": lambda: ("# One line\n\n" + _words(200_000) + "\n").encode(),
    "line_500k_nospace.md": lambda: ("# One word\n\n" + "x" * 500_000 + "\n").encode(),
    "html_unclosed.md": lambda: (
        "# HTML\n\n<div>\n<script>\n" + _paragraphs(30) + "\n# Still script\n"
    ).encode(),
    "mixed_eol.md": lambda: (
        b"# Mixed\r\n\r\nCRLF line.\r\nLF line.\nCR line.\rLast.\r\n\r\n## Two\r\rText after a CR-only blank.\r"
    ),
    "unicode_odd.md": lambda: (
        "# Zero\u200bwidth \u202eRTL override\u202c and combining e\u0301\u0301\u0301\n\n"
        "Astral 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 🧑‍🤝‍🧑 and \ufeff BOM in the middle, \u2028 line separator, \u0085 NEL.\n\n"
        "## עברית ועוד\n\nمرحبا بالعالم. 中文句子。\n"
    ).encode(),
    "bom_utf8.md": lambda: "\ufeff# With a UTF-8 BOM\n\nFine.\n".encode(),
    "controls.md": lambda: (
        b"# Controls\n\nBell \x07 escape \x1b[31m vertical tab \x0b form feed \x0c done.\n"
    ),
    "only_frontmatter.md": lambda: b"---\ntitle: Only front matter\n---\n",
    # empty documents (they had chunks before)
    "empty.md": lambda: b"",
    "blank.md": lambda: b"  \n\n\t\n   \n",
    # bad input
    "bad_utf8.md": lambda: b"# Bad\n\nCaf\xe9 au lait.\n",
    "utf16_bom.md": lambda: "\ufeff# UTF-16\n\nWith a byte order mark.\n".encode("utf-16"),
    "nul_bytes.md": lambda: b"# Binary\n\n\x00\x01\x02\x00",
    # chunked by ``chunkyard``; ``test_hostile.py`` runs it through a test-only stage that never ends
    "stall.md": lambda: f"{STALL_MARK}\n# Stalls\n\nUnder the test's stage, this never finishes.\n".encode(),
    # heavy (issue 7's sizes)
    "headings_100k.md": lambda: "".join(f"# Heading {i}\n" for i in range(100_000)).encode(),
    "line_10mb.md": lambda: ("# Ten megabytes\n\n" + _words(2_000_000) + "\n").encode(),
}

CASES: tuple[Case, ...] = (
    Case("plain.md", "good"),
    Case("fence_unterminated.md", "good"),
    Case("frontmatter_unterminated.md", "good", warning="never closed"),
    Case("frontmatter_invalid.md", "good", warning="not valid YAML"),
    Case("frontmatter_laughs.md", "good", warning="expands to more than"),
    Case("frontmatter_deep.md", "good", warning="nested too deep"),
    Case("frontmatter_bigint.md", "good"),
    Case("table_2000_cols.md", "good"),
    Case("quote_10k.md", "good"),
    Case("list_10k.md", "good"),
    Case("list_600_indented.md", "good"),
    Case("quote_stairs_500.md", "good"),
    Case("emphasis.md", "good"),
    Case("heading_emphasis.md", "good"),
    Case("linkdefs_20k.md", "good"),
    Case("linkdefs_unclosed_titles.md", "good"),
    Case("headings_2k.md", "good-own"),  # the checker is quadratic in headings
    Case("setext_many.md", "good-own"),
    Case("line_1mb.md", "good"),
    Case("line_500k_nospace.md", "good"),
    Case("html_unclosed.md", "good"),
    Case("mixed_eol.md", "good"),
    Case("unicode_odd.md", "good"),
    Case("bom_utf8.md", "good"),
    Case("controls.md", "good"),
    Case("only_frontmatter.md", "empty"),
    Case("empty.md", "empty", before=True),
    Case("blank.md", "empty", before=True),
    Case("bad_utf8.md", "bad", reason="not valid UTF-8", before=True),
    Case("utf16_bom.md", "bad", reason="UTF-16", before=True),
    Case("nul_bytes.md", "bad", reason="NUL byte", before=True),
    Case("huge_50mb.md", "bad", reason="over the", before=True, heavy=True),
    Case("stall.md", "good"),
    Case("unreadable.md", "bad", reason="permission denied", before=True),
    Case("locked/inside.md", "bad", reason="cannot list folder", before=True),
    Case("caf\udce9.md", "bad", reason="not valid UTF-8"),  # the name itself is Latin-1
    Case("headings_100k.md", "heavy", heavy=True),
    Case("line_10mb.md", "heavy", heavy=True),
    # file-system cases
    Case("names/with space.md", "good"),
    Case("names/ünï cödé 漢字.md", "good"),
    Case("names/a|b%c.md", "good"),
    Case("names/-rf.md", "good"),
    Case("names/--help.md", "good"),
    Case("names/[[.md", "good"),
    Case("names/..md", "good"),
    Case("names/!.md", "good"),
    Case("names/UPPER.MARKDOWN", "good"),
    Case(f"names/{LONG_STEM}.md", "good-own"),  # chunk file name shortened with a hash
    Case("links/to_plain.md", "good"),  # a symlink to ../plain.md: followed
    Case("links/dangling.md", "skip"),
    Case("links/loop", "skip"),  # a symlink to its own folder: not walked twice
    Case("deep/" + "/".join(["d"] * DEEP_FOLDERS) + "/bottom.md", "good-own"),
)


def _write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists() or path.is_symlink():
        path.chmod(0o644)
    path.write_bytes(data)


def _deep_folder(dest: Path, depth: int) -> Path:
    """``deep/d/d/…/d``, made level by level (``os.makedirs`` recurses once per level)."""
    path = dest / "deep"
    path.mkdir(exist_ok=True)
    fd = os.open(path, os.O_RDONLY)
    try:
        for _ in range(depth):
            with contextlib.suppress(FileExistsError):
                os.mkdir("d", dir_fd=fd)
            nxt = os.open("d", os.O_RDONLY, dir_fd=fd)
            os.close(fd)
            fd = nxt
        with os.fdopen(
            os.open("bottom.md", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644, dir_fd=fd), "w"
        ) as fh:
            fh.write("# At the bottom\n\nTwelve hundred folders down.\n")
    finally:
        os.close(fd)
    return path


def make_hostile_corpus(dest: Path, *, stage: str = "hostile", small: bool = False) -> tuple[Case, ...]:
    """Write the corpus into ``dest`` (created if need be); return the cases written.

    ``stage="before"`` writes tame versions of the cases marked ``before``, and
    nothing else; ``stage="hostile"`` writes every case as it is meant to be.
    The folder and file permissions let any user read what is meant to be read
    (so a test may run the CLI as an unprivileged user when it runs as root).
    """
    dest.mkdir(parents=True, exist_ok=True)
    dest.chmod(0o755)
    cases = tuple(c for c in CASES if not (small and c.heavy))
    if stage == "before":
        for case in cases:
            if case.before:
                path = dest / case.rel
                if path.parent.exists():
                    path.parent.chmod(0o755)
                _write(path, GOOD.format(title=case.rel).encode())
        return tuple(c for c in cases if c.before)
    if stage != "hostile":
        raise ValueError(f"unknown stage {stage!r}")
    for case in cases:
        if case.rel in CONTENT:
            _write(dest / case.rel, CONTENT[case.rel]())
        elif case.rel == "huge_50mb.md":
            _write(dest / case.rel, b"")
            with open(dest / case.rel, "wb") as fh:
                block = ("# Huge\n\n" + _paragraphs(50)).encode()
                fh.writelines(block for _ in range(50 * 1024 * 1024 // len(block) + 1))
        elif case.rel == "unreadable.md":
            _write(dest / case.rel, GOOD.format(title="now unreadable").encode())
            (dest / case.rel).chmod(0)
        elif case.rel == "locked/inside.md":
            (dest / "locked").mkdir(exist_ok=True)
            (dest / "locked").chmod(0o755)
            _write(dest / case.rel, GOOD.format(title="in a locked folder").encode())
            (dest / "locked").chmod(0)
        elif "\udce9" in case.rel:
            raw = os.path.join(os.fsencode(dest), os.fsencode(case.rel))
            with open(raw, "wb") as fh:
                fh.write(b"# Latin-1 name\n\nThe name is not UTF-8.\n")
        elif case.rel.startswith("names/"):
            _write(dest / case.rel, f"# {case.rel[6:60]}\n\nA document with an awkward name.\n".encode())
        elif case.rel == "links/to_plain.md":
            _link(dest / case.rel, Path("..") / "plain.md")
        elif case.rel == "links/dangling.md":
            _link(dest / case.rel, Path("nowhere.md"))
        elif case.rel == "links/loop":
            _link(dest / case.rel, Path("."))
        elif case.rel.startswith("deep/"):
            _deep_folder(dest, DEEP_FOLDERS)
        else:  # pragma: no cover - a case without content is a bug in this file
            raise AssertionError(f"no content for {case.rel}")
    return cases


def _link(path: Path, target: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.is_symlink() or path.exists():
        path.unlink()
    path.symlink_to(target)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("dest", type=Path)
    ap.add_argument("--before", action="store_true", help="write the tame versions only")
    ap.add_argument("--small", action="store_true", help="leave out the heavy documents")
    args = ap.parse_args(argv)
    cases = make_hostile_corpus(args.dest, stage="before" if args.before else "hostile", small=args.small)
    for case in cases:
        shown = os.fsencode(case.rel).decode("utf-8", "backslashreplace")
        print(f"{case.expect:8s} {shown}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
