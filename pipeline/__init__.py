"""chunkyard: Markdown → one validated JSON file per chunk, for retrieval-augmented generation."""

__version__ = "0.1.0"
__all__ = ("__version__",)
