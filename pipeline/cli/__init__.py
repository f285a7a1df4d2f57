"""The command line: a thin typer layer (``app``) over the run and audit layers, rendered by rich."""
