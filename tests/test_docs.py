"""Every command the README and docs/ show runs here (issue 13; sqlite-utils' test_docs.py).

Each ``sh`` block of a page is run line by line, in order, in a sandbox that holds a copy of
the sample corpus, so a page reads as a tutorial: ``chunkyard`` commands run for real and
must exit 0 (``watch`` is stopped with Ctrl-C after its first sync); ``make`` targets must
exist (``make -n``); install lines must name extras that exist; nothing else may appear. Each
``python`` block is executed.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from conftest import require

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
CHUNKYARD = [sys.executable, "-m", "pipeline"]
_FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```", re.MULTILINE | re.DOTALL)


def blocks(page: Path, lang: str) -> list[str]:
    return [body for kind, body in _FENCE.findall(page.read_text(encoding="utf-8")) if kind == lang]


def commands(page: Path) -> list[list[str]]:
    """The commands of a page's ``sh`` blocks, comments dropped, ``&&`` chains split."""
    out: list[list[str]] = []
    for body in blocks(page, "sh"):
        for line in body.splitlines():
            words = shlex.split(line, comments=True)
            while "&&" in words:
                i = words.index("&&")
                out.append(words[:i])
                words = words[i + 1 :]
            if words:
                out.append(words)
    return out


def test_the_readme_starts_with_the_two_commands_and_the_tour() -> None:
    shown = commands(ROOT / "README.md")
    assert shown[:2] == [["make", "ingest"], ["make", "test"]]
    tour = [c[1] for c in shown if c[0] == "chunkyard"]
    assert tour[:5] == ["ingest", "validate", "resolve", "ingest", "watch"]


def _extras() -> set[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    return set(project.get("optional-dependencies", {}))


def run_one(words: list[str], sandbox: Path, absent: list[tuple[str, str]] | None = None) -> None:
    """Run one shown command; a required part it needs that is missing is added to ``absent``
    (the caller calls ``conftest.require`` once the page's other lines have run)."""
    env = {**os.environ, "NO_COLOR": "1", "COLUMNS": "200"}
    while words and re.fullmatch(r"[A-Z_]+=.*", words[0]):  # VAR=value prefixes
        name, _, value = words.pop(0).partition("=")
        env[name] = value
    program = words[0].removeprefix(".venv/bin/")
    on_ray = "--executor" in words[:-1] and words[words.index("--executor") + 1] == "ray"
    if program == "ray" or on_ray:
        return  # Ray only ever starts in a loopback-only namespace: tests/test_ray.py runs these lines
    if program == "chunkyard" or words[:3] == [".venv/bin/python", "-m", "pipeline"]:
        args = words[1:] if program == "chunkyard" else words[3:]
        if args[:1] == ["watch"]:
            watch(args, sandbox, env)
            return
        proc = subprocess.run(
            [*CHUNKYARD, *args], cwd=sandbox, env=env, capture_output=True, text=True, check=False
        )
        assert proc.returncode == 0, f"{shlex.join(words)}\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}"
    elif program == "make":
        proc = subprocess.run(
            ["make", "-n", *words[1:]], cwd=ROOT, capture_output=True, text=True, check=False
        )
        assert proc.returncode == 0, f"{shlex.join(words)}: {proc.stderr}"
    elif program == "pip" or words[:3] == ["python3", "-m", "venv"]:
        for spec in words:
            if spec.startswith((".[", "'.[")):
                wanted = set(spec.strip("'.[]").split(","))
                assert wanted <= _extras(), f"{spec}: no such extra in pyproject.toml"
    elif program == "pytest":  # shown with CHUNKYARD_REGEN=1: the folder it names exists
        assert all((ROOT / w).exists() for w in words[1:] if not w.startswith("-"))
        assert env.get("CHUNKYARD_REGEN") == "1"
    elif program == "sysctl":
        if shutil.which("sysctl") is None:
            if absent is None:
                require("sysctl", "sysctl is not installed here (procps)")
            else:
                absent.append(
                    ("sysctl", f"sysctl is not installed here (procps): {shlex.join(words)} not run")
                )
            return
        require("sysctl", None)
        subprocess.run(words, check=True, capture_output=True)
    else:
        raise AssertionError(f"{shlex.join(words)}: a command the docs test does not know how to run")


def watch(args: list[str], sandbox: Path, env: dict[str, str]) -> None:
    """Start ``watch``, wait for its first sync (the lock file appears), then Ctrl-C."""
    proc = subprocess.Popen(
        [*CHUNKYARD, *args], cwd=sandbox, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        out, err = "", ""
        for line in proc.stdout or ():  # one line once the first sync is done
            out += line
            break
        proc.send_signal(signal.SIGINT)
        more_out, err = proc.communicate(timeout=60)
        out += more_out
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode in (0, 130), f"watch: exit {proc.returncode}\n{out}{err}"
    assert "Traceback" not in err


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_shown_command_runs(page: Path, tmp_path: Path) -> None:
    shown = commands(page)
    if not shown:
        pytest.skip(f"{page.name} shows no command")
    sandbox = tmp_path / "sandbox"
    shutil.copytree(ROOT / "corpus", sandbox / "corpus")
    shutil.copytree(ROOT / "tests" / "gold", sandbox / "gold")  # the gold set `chunkyard eval` is shown with
    absent: list[tuple[str, str]] = []
    for words in shown:
        run_one(list(words), sandbox, absent)
    for part, problem in absent:  # the page's other lines ran; now skip, or fail under CI
        require(part, problem)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_python_example_runs(page: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    examples = blocks(page, "python")
    if not examples:
        pytest.skip(f"{page.name} shows no Python")
    shutil.copytree(ROOT / "corpus", tmp_path / "corpus")
    monkeypatch.chdir(tmp_path)
    for i, source in enumerate(examples):
        try:
            exec(compile(source, f"{page.name} example {i + 1}", "exec"), {"__name__": "docs_example"})  # noqa: S102
        except Exception as exc:  # name the example: the traceback alone points into exec
            raise AssertionError(f"docs/{page.name}, Python example {i + 1} fails: {exc!r}") from exc
    for name in LEFT_BEHIND.get(page.name, ()):
        assert (tmp_path / name).is_file(), f"docs/{page.name}'s examples should leave {name}"


#: What a page's Python examples leave in the folder they run in (the adapters' sync cursors).
LEFT_BEHIND = {"api.md": ("chunks-langchain.cursor.json", "chunks-llamaindex.cursor.json")}
