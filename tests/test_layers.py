"""The folder tree is the architecture: imports only point down the layers (issue 13).

models/errors/chunkfolder < stages < runner < run < audit < index < evaluate < view < adapters < cli.
A module may import its own layer and any layer below it, never one above; the package's
public face (``pipeline/__init__.py``) and ``__main__`` stand on top of everything.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "pipeline"

#: Lowest first. A top-level module or a sub-package is one layer.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("_version", "models", "errors", "chunkfolder"),
    ("stages",),
    ("runner",),
    ("run",),
    ("audit",),
    ("index",),
    ("evaluate",),
    ("view",),
    ("adapters",),
    ("serve",),
    ("api",),
    ("cli",),
    ("__init__", "__main__"),
)
RANK = {name: rank for rank, names in enumerate(LAYERS) for name in names}


def layer_of(module: str) -> str:
    """``pipeline.run.ingest`` → ``run``; ``pipeline`` itself → ``__init__``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__" and len(parts) > 1:
        parts.pop()
    return ".".join(parts)


def imports(path: Path, as_module: str | None = None) -> list[tuple[int, str]]:
    """Every ``pipeline`` module a file imports, lazily (inside functions) or not.

    ``as_module`` reads the file as if it were that module (for the rule's own test).
    """
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    here = (as_module or module_name(path)).split(".")
    package = here if path.name == "__init__.py" else here[:-1]
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] == "pipeline"]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                target = ".".join([*base, *([node.module] if node.module else [])])
            else:
                target = node.module or ""
            if target.split(".")[0] != "pipeline":
                continue
            if target == "pipeline":  # ``from pipeline import x``: x is the module (or the face)
                found += [(node.lineno, f"pipeline.{a.name}") for a in node.names]
            else:
                found.append((node.lineno, target))
    return found


SOURCES = sorted(PACKAGE.rglob("*.py"))


def test_every_module_sits_in_a_known_layer() -> None:
    unknown = {layer_of(module_name(p)) for p in SOURCES} - RANK.keys()
    assert not unknown, f"add these to LAYERS in {__file__}: {sorted(unknown)}"


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_imports_only_point_down(path: Path) -> None:
    here = layer_of(module_name(path))
    upward = [
        f"{path.relative_to(PACKAGE.parent)}:{line} imports {target} ({layer_of(target)} is above {here})"
        for line, target in imports(path)
        if RANK.get(layer_of(target), -1) > RANK[here]
    ]
    assert not upward, "\n".join(upward)


def test_the_check_sees_an_upward_import(tmp_path: Path) -> None:
    """The rule itself can fail: a stage importing the run layer or the runner is caught."""
    probe = tmp_path / "probe.py"
    probe.write_text("from pipeline.run.ingest import ingest\n\ndef f():\n    from .. import runner\n")
    found = [target for _, target in imports(probe, as_module="pipeline.stages.probe")]
    assert found == ["pipeline.run.ingest", "pipeline.runner"]
    assert all(RANK[layer_of(t)] > RANK["stages"] for t in found)
