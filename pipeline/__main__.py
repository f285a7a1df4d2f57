"""``python -m pipeline``: the same as the ``chunkyard`` command.

Guarded: ``serve --processes N`` spawns its server processes with multiprocessing, which
imports this module again in each of them (as ``__mp_main__``), and they must not run the CLI.
"""

from pipeline.cli.app import run

if __name__ == "__main__":
    run()
