"""A value that holds something to give back (a native handle, a slot): closed by `with` and,
failing that, when it is collected."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TypeVar

C = TypeVar("C", bound="Closing")


class Closing(ABC):
    """A base whose subclass defines close() (idempotent): `with` closes it, and so does its
    collection, an error then swallowed (the interpreter may be ending)."""

    @abstractmethod
    def close(self) -> None:
        """Give back what it holds; a second call does nothing."""

    def __enter__(self: C) -> C:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass
