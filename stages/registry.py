"""One generic name → object registry for estimators, losses, reward functions and engines.

Registering a name twice is an error; looking up an unknown name raises a ``KeyError`` that lists
the known names, so a typo in a config is reported with the choices next to it.

Example:
    >>> SQUARES = Registry[object]("square function")
    >>> @SQUARES.register("square")
    ... def square(x):
    ...     return x * x
    >>> SQUARES.get("square")(3)
    9
    >>> SQUARES.get("cube")
    Traceback (most recent call last):
    ...
    KeyError: "unknown square function 'cube'; known: ['square']"
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    """A named table of interchangeable implementations with the same signature."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        """Decorator: add ``obj`` under ``name``; a second registration of the name raises."""

        def add(obj: T) -> T:
            self.add(name, obj)
            return obj

        return add

    def add(self, name: str, obj: T) -> None:
        """Add ``obj`` under ``name``. Re-adding the very same object is allowed (module reloads)."""
        existing = self._entries.get(name)
        if existing is not None and existing is not obj:
            raise ValueError(
                f"{self.kind} {name!r} is already registered to {existing!r}; "
                f"pick another name or remove the first registration"
            )
        self._entries[name] = obj

    def get(self, name: str) -> T:
        """The entry for ``name`` (case-sensitive); unknown names list the known ones."""
        try:
            return self._entries[name]
        except KeyError:
            raise KeyError(
                f"unknown {self.kind} {name!r}; known: {sorted(self._entries)}"
            ) from None

    def remove(self, name: str) -> None:
        """Drop the entry ``name`` (a test's temporary registration); unknown names raise KeyError."""
        self.get(name)
        del self._entries[name]

    def names(self) -> list[str]:
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._entries))

    def __len__(self) -> int:
        return len(self._entries)
