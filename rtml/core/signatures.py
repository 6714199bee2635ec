"""A call's arguments checked against its function's signature at ``.remote()``, as Ray
does: a wrong call fails at its call site with a TypeError, not later inside the task.

Most remote functions and actor methods take plain parameters (no ``*args``,
``**kwargs`` or keyword-only ones); their check counts arguments and looks names up
(~26 ns compiled). Other signatures, and every call that fails the quick check, go
through ``inspect.Signature.bind`` (a few us), whose error is the one raised.

A check keeps only the parameters' names, kinds and whether each has a default (shown
as ``...``), so it pickles small and whatever the defaults are: it travels inside actor
handles.
"""

from __future__ import annotations

import inspect
from typing import Any

_PLAIN = inspect.Parameter.POSITIONAL_OR_KEYWORD
_EMPTY = inspect.Parameter.empty


class _Default:
    def __repr__(self) -> str:
        return "..."


_DEFAULT = _Default()


class CallCheck:
    """The signature of one callable, ready to check calls (``what`` names it in errors)."""

    def __init__(self, what: str, signature: inspect.Signature | None) -> None:
        self.what = what
        self._signature = signature
        params = list(signature.parameters.values()) if signature is not None else []
        plain = signature is not None and all(p.kind is _PLAIN for p in params)
        self._names: tuple[str, ...] | None = tuple(p.name for p in params) if plain else None
        self._required = sum(p.default is _EMPTY for p in params)

    @classmethod
    def of(cls, function: Any, what: str, bound: bool = False) -> CallCheck:
        """The check of ``function`` (``bound``: a method, whose first parameter is the
        instance; a class: its constructor). One without a signature accepts every call."""
        try:
            signature = inspect.signature(function)
        except (TypeError, ValueError):  # e.g. some builtins have none
            return cls(what, None)
        params = list(signature.parameters.values())[1 if bound else 0:]
        return cls(what, inspect.Signature(
            [p.replace(annotation=_EMPTY, default=_EMPTY if p.default is _EMPTY else _DEFAULT)
             for p in params]))

    def __reduce__(self) -> tuple[Any, ...]:
        return CallCheck, (self.what, self._signature)

    def check(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """Raise TypeError, naming the callable and its signature, if ``args`` and
        ``kwargs`` cannot be bound to it."""
        if self._quick(args, kwargs) or self._signature is None:
            return
        try:
            self._signature.bind(*args, **kwargs)
        except TypeError as exc:
            raise TypeError(f"{self.what}{self._signature} cannot take these arguments: "
                            f"{exc}") from None

    def _quick(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        names = self._names
        if names is None:
            return False
        given = len(args)
        if not kwargs:
            return self._required <= given <= len(names)
        rest = names[given:]
        return (all(name in rest for name in kwargs)
                and all(name in kwargs for name in names[given:self._required]))
