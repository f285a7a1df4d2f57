"""One error hierarchy: every error raised on purpose names where, what and the fix."""

from __future__ import annotations


class PipelineError(Exception):
    """Root of every error chunkyard raises on purpose."""


class StageError(PipelineError):
    """A document could not pass one stage; the run goes on with the others.

    Args:
        stage: the stage that failed (``read``, ``normalize``, ``parse`` ...).
        where: the file, with a byte offset or line where one is known.
        problem: what is wrong, in a few words.
        hint: how to fix it.
    """

    def __init__(self, stage: str, where: str, problem: str, hint: str) -> None:
        super().__init__(f"{where}: {stage}: {problem} (hint: {hint})")
        self.stage = stage
        self.where = where
        self.problem = problem
        self.hint = hint


class SchemaError(PipelineError):
    """A chunk record does not match ``schemas/chunk.schema.json``: it is never written."""


class UsageError(PipelineError):
    """Bad options or setup (exit code 2)."""
