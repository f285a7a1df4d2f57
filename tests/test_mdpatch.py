"""The parser patches: importing changes nothing in mistletoe; one call puts them in, once."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = """
import sys
from mistletoe import block_token, block_tokenizer
before = (block_tokenizer.tokenize_block, block_token.Footnote.__dict__["read"],
          block_token.Paragraph.__dict__["read"], list(block_token._token_types), block_token.List.pattern)
import pipeline.stages.parse
import pipeline.run.worker
from pipeline.stages.mdpatch import install_patches
after_import = (block_tokenizer.tokenize_block, block_token.Footnote.__dict__["read"],
                block_token.Paragraph.__dict__["read"], list(block_token._token_types), block_token.List.pattern)
print("import-changed", before != after_import)
install_patches()
patched = (block_tokenizer.tokenize_block, list(block_token._token_types))
install_patches()
print("installed", block_tokenizer.tokenize_block is not before[0], len(patched[1]) == len(before[3]) + 1)
print("idempotent", (block_tokenizer.tokenize_block, list(block_token._token_types)) == patched)
print("maxunicode", sys.maxunicode == 0x10FFFF)
"""


def run(code: str) -> dict[str, str]:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    return dict(line.split(" ", 1) for line in out.stdout.strip().splitlines())


def test_importing_changes_nothing_and_one_call_installs_once() -> None:
    """mistletoe is imported first here (its own slow way), so the import of the parse stage
    and the worker can be seen to leave every reader, pattern and token list as it was."""
    assert run(SCRIPT) == {"import-changed": "False", "installed": "True True", "idempotent": "True",
                           "maxunicode": "True"}


def test_the_parse_stage_installs_them_itself() -> None:
    """A process that only calls ``parse`` (a Ray worker, the API) gets the patched readers:
    an NBSP after ``#`` is no ATX heading to CommonMark (mistletoe's own pattern took it)."""
    code = (
        "from pipeline.models import SourceDoc\n"
        "from pipeline.stages.parse import parse\n"
        "blocks = parse(SourceDoc('t.md', 't', '#\\u00a0not a heading\\n'))\n"
        "print('kinds', ','.join(b.kind for b in blocks))\n"
    )
    assert run(code) == {"kinds": "paragraph"}
