"""``python -m pipeline``: the same as the ``chunkyard`` command."""

from pipeline.cli.app import run

run()
