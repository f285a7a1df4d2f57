"""chunkyard: Markdown → one validated JSON file per chunk, for retrieval-augmented generation."""

from pipeline._version import __version__

__all__ = ("__version__",)
