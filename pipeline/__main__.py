"""``python -m pipeline``: the same as the ``chunkyard`` command."""

from .cli import run

run()
