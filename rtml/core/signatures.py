"""A call's arguments checked against its function's signature at ``.remote()``, as Ray
does: a wrong call fails at its call site with a TypeError, not later inside the task.

Most remote functions take plain parameters (no ``*args``, ``**kwargs`` or keyword-only
ones); their check counts arguments and looks names up (~0.2 us). Other signatures, and
every call that fails the quick check, go through ``inspect.Signature.bind`` (a few us),
whose error is the one raised.
"""

from __future__ import annotations

import inspect
from typing import Any

_PLAIN = inspect.Parameter.POSITIONAL_OR_KEYWORD


class CallCheck:
    """The signature of one function (``bound``: a method, whose first parameter is the
    instance), ready to check calls."""

    def __init__(self, function: Any, what: str, bound: bool = False) -> None:
        self.what = what
        try:
            signature: inspect.Signature | None = inspect.signature(function)
        except (TypeError, ValueError):  # e.g. some builtins have none: calls go unchecked
            signature = None
        params = list(signature.parameters.values()) if signature is not None else []
        if signature is not None and bound and params:
            params = params[1:]
            signature = signature.replace(parameters=params)
        self._signature = signature
        plain = signature is not None and all(p.kind is _PLAIN for p in params)
        self._names: tuple[str, ...] | None = tuple(p.name for p in params) if plain else None
        self._required = sum(p.default is inspect.Parameter.empty for p in params)

    def check(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """Raise TypeError, naming the function and its signature, if ``args`` and
        ``kwargs`` cannot be bound to it."""
        if self._quick(args, kwargs) or self._signature is None:
            return
        try:
            self._signature.bind(*args, **kwargs)
        except TypeError as exc:
            raise TypeError(f"{self.what}{_shown(self._signature)} cannot take these "
                            f"arguments: {exc}") from None

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


def _shown(signature: inspect.Signature) -> str:
    """The signature as the user wrote its parameters, without annotations."""
    empty = inspect.Parameter.empty
    return str(signature.replace(
        parameters=[p.replace(annotation=empty) for p in signature.parameters.values()],
        return_annotation=inspect.Signature.empty))
