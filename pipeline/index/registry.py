"""A table of named implementations, each imported on first use.

The index has two: embedders (``pipeline.index.embedders.EMBEDDERS``) and stores
(``pipeline.index.vector_store.STORES``). A base module lists its built-in entries as
``"module:attribute"`` strings, so it never imports its implementations (they import the
base for its protocol and types: no cycle), and an implementation's heavy dependencies
(onnxruntime, LanceDB, torch) load only when it is asked for. A plugin registers an object
directly, or a string of its own.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from importlib import import_module
from typing import Any, Generic, TypeVar

from pipeline.errors import UsageError

T = TypeVar("T")


class Registry(Generic[T]):
    """Names → implementations (``T``), given as objects or as ``"module:attribute"`` paths.

    Args:
        what: what the entries are, for error messages (``embedder``, ``store``).
    """

    def __init__(self, what: str) -> None:
        self.what = what
        self._entries: dict[str, str | T] = {}

    def add(self, name: str, target: str | T, *, replace: bool = False) -> None:
        """Register ``target`` under ``name``; an existing name needs ``replace=True``."""
        if not name or ":" in name:
            raise UsageError(f"{self.what} name {name!r}: expected a non-empty name without ':'")
        if name in self._entries and not replace:
            raise UsageError(f"{self.what} {name!r} is registered already (hint: pass replace=True)")
        self._entries[name] = target

    def register(self, name: str, *, replace: bool = False) -> Callable[[T], T]:
        """The decorator form of :meth:`add`: ``@EMBEDDERS.register("mine")``."""

        def decorate(target: T) -> T:
            self.add(name, target, replace=replace)
            return target

        return decorate

    def remove(self, name: str) -> None:
        """Forget ``name`` (a plugin's test cleaning up); an unknown name is no error."""
        self._entries.pop(name, None)

    def get(self, name: str) -> T:
        """The implementation registered as ``name``, imported now if it was given as a path.

        Raises:
            UsageError: no such name.
        """
        try:
            target = self._entries[name]
        except KeyError:
            raise UsageError(
                f"unknown {self.what} {name!r} (hint: one of {', '.join(sorted(self._entries))})"
            ) from None
        if isinstance(target, str):
            loaded: T = resolve(target)
            self._entries[name] = loaded
            return loaded
        return target

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._entries))

    def names(self) -> list[str]:
        """Registered names, in registration order."""
        return list(self._entries)


def resolve(target: str) -> Any:
    """The attribute a ``"module:attribute"`` path names, importing its module."""
    module, _, attribute = target.partition(":")
    return getattr(import_module(module), attribute)
