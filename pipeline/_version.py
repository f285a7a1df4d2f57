"""The package version, in one place (read by the chunk records and the CLI)."""

__version__ = "0.4.0"
