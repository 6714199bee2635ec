"""The modules compiled to C with mypyc, and the choice between them and their source.

``setup.py`` compiles :data:`COMPILED`, the hot path (submit -> run -> result), with
mypyc where a C compiler is present; without one the install is pure Python and behaves
the same, slower. The source stays the one definition of what these modules do: the
build records a digest of every ``.py`` file of the package (:data:`STAMP`: compiled code
also bakes in other modules' types and constants), and importing rtml loads the source
instead of the compiled modules when

- ``RTML_PURE_PYTHON=1`` is set (to profile or debug the Python; set it where the
  cluster's daemons start too, as their workers load what their node manager chose), or
- a file changed after the build (an editable install not rebuilt since an edit or a
  pull): what runs is then still what the source says, with a warning.

It is all or none: compiled modules call each other's classes directly, so one module
from source next to compiled ones would meet two versions of the same class.

What compiled code asks of these modules (mypyc's rules; the tests run compiled in CI):

- type hints are checked at run time: a stand-in of the wrong type is a TypeError;
- a class's instances take only the attributes its ``__init__`` declares (no
  ``__dict__``, no ``setattr`` of new names), and its methods cannot be patched;
- a pickled class whose ``__init__`` takes arguments needs a ``__reduce__``;
- no attribute named like a C keyword once mangled (``_thread`` becomes ``__thread``).

Standard library only: ``setup.py`` runs this file before rtml's dependencies exist.
"""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

COMPILED = (
    "rtml/ids.py",
    "rtml/rpc/framing.py",
    "rtml/rpc/reactor.py",
    "rtml/core/actor_caller.py",
    "rtml/core/actors.py",
    "rtml/core/arguments.py",
    "rtml/core/calls.py",
    "rtml/core/context.py",
    "rtml/core/kept_calls.py",
    "rtml/core/current.py",
    "rtml/core/links.py",
    "rtml/core/memory_store.py",
    "rtml/core/object_ref.py",
    "rtml/core/owner.py",
    "rtml/core/references.py",
    "rtml/core/runtime.py",
    "rtml/core/serialization.py",
    "rtml/core/shared_objects.py",
    "rtml/core/signatures.py",
    "rtml/core/submitter.py",
    "rtml/core/tasks.py",
    "rtml/worker/executor.py",
    "rtml/worker/main.py",
)
"""Paths from the project root."""
GROUP = "rtml_native"
"""mypyc's name for the shared library that holds them all (``rtml_native__mypyc``)."""
STAMP = "_native_stamp"
"""A file in the rtml package written once the build compiled everything: one ``path
digest`` line per ``.py`` file of the package."""
PURE_ENV = "RTML_PURE_PYTHON"


def stamp_text(root: Path) -> str:
    """The stamp for the package under ``root`` (the project root or site-packages)."""
    return "".join(f"{path} {digest}\n" for path, digest in _digests(root).items())


def _digests(root: Path) -> dict[str, str]:
    return {path.relative_to(root).as_posix():
            hashlib.blake2b(path.read_bytes(), digest_size=16).hexdigest()
            for path in sorted((root / "rtml").rglob("*.py"))}


def changed_since_build(root: Path) -> list[str]:
    """The package's files added, removed or edited since the build (the stamp itself if
    the build did not finish)."""
    try:
        lines = (root / "rtml" / STAMP).read_text().splitlines()
    except OSError:
        return [f"rtml/{STAMP} (missing)"]
    built = dict(line.split(" ", 1) for line in lines)
    now = _digests(root)
    return sorted(path for path in built.keys() | now.keys() if built.get(path) != now.get(path))


def choose() -> str:
    """Called first by ``import rtml``: "compiled", "source" or "pure" (no compiled build).

    Unless "compiled", puts a finder first on ``sys.meta_path`` that loads
    :data:`COMPILED` from their ``.py`` files.
    """
    built = importlib.util.find_spec(f"{GROUP}__mypyc") is not None
    if built and os.environ.get(PURE_ENV) != "1":
        changed = changed_since_build(Path(__file__).resolve().parent.parent)
        if not changed:
            return "compiled"
        shown = ", ".join(changed[:3]) + (f" and {len(changed) - 3} more" if changed[3:] else "")
        warnings.warn(f"rtml: the compiled build does not match the source ({shown}); "
                      "running the source, which is slower. Rebuild with `pip install -e .` "
                      "(or set RTML_PURE_PYTHON=1 to silence this)", RuntimeWarning,
                      stacklevel=3)
    if not any(isinstance(finder, _SourceFinder) for finder in sys.meta_path):
        # Also without the library: compiled modules left without it could not load.
        sys.meta_path.insert(0, _SourceFinder())
    return "source" if built else "pure"


class _SourceFinder(importlib.abc.MetaPathFinder):
    """Finds the compiled modules' ``.py`` files, ahead of their extension modules."""

    names = frozenset(path[:-3].replace("/", ".") for path in COMPILED)

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname not in self.names or path is None:
            return None
        for entry in path:
            source = os.path.join(entry, fullname.rpartition(".")[2] + ".py")
            if os.path.isfile(source):
                return importlib.util.spec_from_file_location(fullname, source)
        return None
