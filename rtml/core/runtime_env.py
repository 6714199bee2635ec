"""Runtime environments (``runtime_env``, as Ray's), the owner's half: checked, packaged,
uploaded once, merged with the parent's.

    @remote(runtime_env=...) / .options(runtime_env=...)   init(runtime_env=...)
        check(env)        keys and types, at once: TypeError / ValueError naming the fix
    first .remote() under a runtime (cached per runtime), init before it starts anything:
        prepare(env)      local paths -> packages: a directory's files (``excludes`` and
                          ALWAYS_EXCLUDED left out) or a .zip, content-addressed by a hash
                          of its files (names, exec bits, bytes), at most PACKAGE_MAX_BYTES
        upload(plane, p)  each package written to the control plane once (EXISTS, SET NX):
                          a second job with the same files reuses it
        merge(parent, p)  the parent's env (the job's, or the worker's own for a nested
                          call) under the call's: the call wins per key, env_vars merged
    -> its wire form: canonical JSON ("" = none) in RequestLease.runtime_env (the lease
       queue's key carries it) and ActorSpec.runtime_env; the node runs it in a worker of
       its own (``rtml.worker.runtime_env`` says why, and sets it up)

The resolved env names packages by hash::

    {"env_vars": {"K": "v"}, "pip": ["requests==2.31"],
     "working_dir": {"package": "<sha256 hex>", "root": ""},
     "py_modules": [{"package": "<sha256 hex>", "root": ""}, ...]}

``root`` is the directory inside the archive to use: a .zip whose entries all lie in one
top-level directory is used from that directory, as Ray does.

A directory is read once per runtime (the first call that names it): files changed after
that are not seen by the same job.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import re
import types
import zipfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from rtml.ids import ClientID

if TYPE_CHECKING:
    from rtml.control_plane import ControlPlane

log = logging.getLogger(__name__)

KEYS = ("env_vars", "excludes", "pip", "py_modules", "working_dir")
"""The keys rtml supports."""
RAY_ONLY = frozenset({"conda", "container", "image_uri", "uv", "java_jars", "nsight",
                      "config", "worker_process_setup_hook", "py_executable", "rocprof_sys",
                      "_inject_current_ray", "_ray_release", "_ray_commit"})
"""Ray's other keys: refused with the reason rather than ignored."""
PACKAGE_MAX_BYTES = 100 << 20
"""Bytes of files one working_dir or py_modules entry may hold (Ray's limit is 100 MiB
too); below what the control plane's replies may carry (128 MiB)."""
ALWAYS_EXCLUDED = (".git", ".hg", ".svn", "__pycache__")
"""Left out of every package, as Ray leaves out ``.git``."""
PIP_OPTIONS = frozenset({"packages", "pip_check"})
_MIB = float(1 << 20)
_EXPAND = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def check(env: Any) -> dict[str, Any] | None:
    """A ``runtime_env`` option as given: a dict of known keys with values of the right
    types (None: none). Returns a copy. Raises TypeError or ValueError saying the fix."""
    if env is None:
        return None
    if not isinstance(env, dict):
        raise TypeError(f"runtime_env must be a dict (as Ray's), e.g. {{'env_vars': "
                        f"{{'KEY': 'value'}}}}, got {type(env).__name__}")
    ray_only = sorted(set(env) & RAY_ONLY)
    if ray_only:
        raise ValueError(f"runtime_env key(s) {ray_only} are not supported by rtml; it "
                         f"supports {list(KEYS)}: install what they bring on the nodes, or "
                         f"use 'pip'")
    unknown = sorted(str(key) for key in env if key not in KEYS)
    if unknown:
        raise ValueError(f"unknown runtime_env key(s) {unknown}; valid keys are {list(KEYS)}")
    _check_env_vars(env.get("env_vars"))
    if env.get("working_dir") is not None:
        _check_path("working_dir", env["working_dir"])
    _check_py_modules(env.get("py_modules"))
    _check_strings("excludes", env.get("excludes"))
    _check_pip(env.get("pip"))
    return dict(env)


def _check_env_vars(env_vars: Any) -> None:
    if env_vars is None:
        return
    if not isinstance(env_vars, dict):
        raise TypeError(f"runtime_env['env_vars'] must be a dict of str to str, got "
                        f"{type(env_vars).__name__}")
    for name, value in env_vars.items():
        if not isinstance(name, str) or not name or "=" in name or "\0" in name:
            raise TypeError(f"runtime_env['env_vars'] names must be non-empty str without "
                            f"'=', got {name!r}")
        if not isinstance(value, str):
            raise TypeError(f"runtime_env['env_vars'][{name!r}] must be a str, got "
                            f"{value!r} ({type(value).__name__}): pass str({value!r})")


def _check_path(what: str, path: Any) -> None:
    if not isinstance(path, str | os.PathLike):
        raise TypeError(f"runtime_env[{what!r}] must be a path (str), got {path!r}")
    if "://" in os.fspath(path):
        raise ValueError(f"runtime_env[{what!r}] {os.fspath(path)!r}: rtml uploads local "
                         f"directories and .zip files only; fetch the remote archive first "
                         f"and pass its local path")


def _check_py_modules(modules: Any) -> None:
    if modules is None:
        return
    if not isinstance(modules, list | tuple):
        raise TypeError(f"runtime_env['py_modules'] must be a list of paths or modules, got "
                        f"{type(modules).__name__}")
    for module in modules:
        if not isinstance(module, types.ModuleType):
            _check_path("py_modules", module)


def _check_strings(what: str, values: Any) -> None:
    if values is None:
        return
    if not isinstance(values, list | tuple) or not all(isinstance(v, str) for v in values):
        raise TypeError(f"runtime_env[{what!r}] must be a list of str, got {values!r}")


def _check_pip(pip: Any) -> None:
    if pip is None or isinstance(pip, str | os.PathLike):
        return
    if isinstance(pip, dict):
        extra = sorted(set(pip) - PIP_OPTIONS)
        if extra:
            raise ValueError(f"runtime_env['pip'] as a dict takes {sorted(PIP_OPTIONS)}, "
                             f"not {extra}")
        _check_pip(pip.get("packages"))
        return
    _check_strings("pip", pip)


# -- preparing: paths to packages -------------------------------------------------------------

@dataclass
class Package:
    """One directory or .zip, named by the hash of its files."""

    digest: str
    source: str  # the path, for messages
    what: str  # "working_dir" or "py_modules"
    build: Any = None  # () -> the zip's bytes (a directory is zipped only if not stored)


@dataclass
class Prepared:
    """An env with its paths turned into packages, not uploaded yet."""

    env: dict[str, Any]
    packages: list[Package] = field(default_factory=list)


def prepare(env: dict[str, Any] | None) -> Prepared:
    """Read what ``env`` names locally (relative paths from the current directory).
    Raises ValueError: a path that does not exist or is not a directory or .zip, a
    package over PACKAGE_MAX_BYTES, a requirements file that cannot be read."""
    prepared = Prepared({})
    if not env:
        return prepared
    excludes = list(env.get("excludes") or ())
    if env.get("env_vars"):
        prepared.env["env_vars"] = dict(env["env_vars"])
    if env.get("working_dir") is not None:
        package, root = _package(os.fspath(env["working_dir"]), "working_dir", excludes)
        prepared.packages.append(package)
        prepared.env["working_dir"] = {"package": package.digest, "root": root}
    if env.get("py_modules"):
        modules = []
        for module in env["py_modules"]:
            package, root = _package(_module_path(module), "py_modules", excludes,
                                     as_module=True)
            prepared.packages.append(package)
            modules.append({"package": package.digest, "root": root})
        prepared.env["py_modules"] = modules
    pip = _requirements(env.get("pip"))
    if pip:
        prepared.env["pip"] = pip
    return prepared


def _module_path(module: Any) -> str:
    if not isinstance(module, types.ModuleType):
        return os.fspath(module)
    paths = getattr(module, "__path__", None)
    if paths:  # a package: its directory
        return str(list(paths)[0])
    if getattr(module, "__file__", None):
        return str(module.__file__)
    raise ValueError(f"runtime_env['py_modules']: module {module.__name__} has no file "
                     f"to upload (a built-in or namespace module); give its directory")


def _package(given: str, what: str, excludes: list[str],
             as_module: bool = False) -> tuple[Package, str]:
    """The package of one path, and the directory inside it to use."""
    path = Path(given).expanduser().absolute()
    if path.is_dir():
        files = sorted(_files(path, Excludes(excludes, path)))  # (by name, as zip_digest)
        _check_size(what, path, sum(p.stat().st_size for _, p in files))
        prefix = f"{path.name}/" if as_module else ""
        entries = [(prefix + name, p) for name, p in files]
        digest = _digest((name, _is_exec(p.stat().st_mode), p.read_bytes())
                         for name, p in entries)
        return Package(digest, str(path), what, lambda: _zip(entries)), ""
    if path.is_file() and path.suffix == ".zip":
        _check_size(what, path, path.stat().st_size)
        data = path.read_bytes()
        try:
            digest, root = zip_digest(data)
        except zipfile.BadZipFile as exc:
            raise ValueError(f"runtime_env[{what!r}] {given!r} is not a zip file ({exc}): "
                             f"give a directory or a .zip") from None
        # A module's archive goes on sys.path as it is: its top directory is the module.
        return Package(digest, str(path), what, lambda: data), "" if as_module else root
    if as_module and path.is_file() and path.suffix == ".py":
        data = path.read_bytes()
        _check_size(what, path, len(data))
        entries = [(path.name, path)]
        return Package(_digest([(path.name, _is_exec(path.stat().st_mode), data)]),
                       str(path), what, lambda: _zip(entries)), ""
    kind = "does not exist" if not path.exists() else "is neither a directory nor a .zip"
    raise ValueError(f"runtime_env[{what!r}] {given!r} {kind} (relative paths are taken from "
                     f"{os.getcwd()}): give an existing directory or .zip file")


def _check_size(what: str, path: Path, size: int) -> None:
    if size > PACKAGE_MAX_BYTES:
        raise ValueError(f"runtime_env[{what!r}] {path} holds {size / _MIB:.1f} MiB, more "
                         f"than a package may ({PACKAGE_MAX_BYTES / _MIB:.0f} MiB): leave "
                         f"large files out with runtime_env['excludes'] (gitignore-style "
                         f"patterns), or keep data where the cluster's machines read it")


def _files(root: Path, excludes: Excludes) -> Iterator[tuple[str, Path]]:
    """The files under ``root`` that are not excluded, sorted, as (relative name, path)."""
    for current, dirs, files in os.walk(root):
        here = Path(current)
        rel = here.relative_to(root).as_posix()
        rel = "" if rel == "." else rel + "/"
        dirs[:] = sorted(d for d in dirs if d not in ALWAYS_EXCLUDED
                         and not excludes.excluded(rel + d, is_dir=True))
        for name in sorted(files):
            path = here / name
            if path.is_file() and not excludes.excluded(rel + name, is_dir=False):
                yield rel + name, path


def _is_exec(mode: int) -> bool:
    return bool(mode & 0o111)


def _digest(entries: Iterable[tuple[str, bool, bytes]]) -> str:
    """The hash that names a package: of its files' names, exec bits and bytes."""
    hasher = hashlib.sha256()
    for name, executable, data in entries:
        hasher.update(b"%s\0%d\0%d\0" % (name.encode(), executable, len(data)))
        hasher.update(data)
    return hasher.hexdigest()


def zip_digest(data: bytes) -> tuple[str, str]:
    """The hash of a zip's files (as ``_digest``), and its single top-level directory
    ("" if its entries do not all lie in one). Raises zipfile.BadZipFile."""
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        infos = sorted((i for i in archive.infolist() if not i.is_dir()),
                       key=lambda i: i.filename)
        digest = _digest((i.filename, _is_exec(i.external_attr >> 16), archive.read(i))
                         for i in infos)
        tops = {i.filename.split("/", 1)[0] for i in archive.infolist()}
        nested = all("/" in i.filename for i in infos)
    return digest, (tops.pop() if len(tops) == 1 and nested and infos else "")


def _zip(entries: list[tuple[str, Path]]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, path in entries:
            info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
            info.external_attr = (0o755 if _is_exec(path.stat().st_mode) else 0o644) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(info, path.read_bytes())
    return buffer.getvalue()


def _requirements(pip: Any) -> list[str]:
    if isinstance(pip, dict):
        pip = pip.get("packages")
    if pip is None:
        return []
    if isinstance(pip, str | os.PathLike):
        path = Path(pip).expanduser()
        try:
            lines = path.read_text().splitlines()
        except OSError as exc:
            raise ValueError(f"runtime_env['pip'] {os.fspath(pip)!r}: cannot read this "
                             f"requirements file ({exc.strerror}); give a list of "
                             f"requirements or an existing requirements.txt") from None
        pip = [line.strip() for line in lines]
    return [line for line in pip if line.strip() and not line.strip().startswith("#")]


class Excludes:
    """gitignore-style patterns, on paths relative to a package's root: ``*`` and ``?``
    within a name, ``**`` across directories, a trailing ``/`` for directories only, a
    ``/`` at the start or inside anchors the pattern at the root (else it matches a name
    at any depth), ``!`` re-includes. An absolute path under ``root`` is taken as that
    path."""

    def __init__(self, patterns: list[str], root: Path) -> None:
        self.rules = [rule for rule in (_rule(p, root) for p in patterns) if rule is not None]

    def excluded(self, relative: str, is_dir: bool) -> bool:
        """Whether the file or directory at ``relative`` (``a/b.txt``) is left out."""
        out = False
        for regex, negate, dir_only in self.rules:
            if (is_dir or not dir_only) and regex.match(relative):
                out = not negate
        return out


def _rule(pattern: str, root: Path) -> tuple[re.Pattern[str], bool, bool] | None:
    pattern = pattern.strip()
    if not pattern or pattern.startswith("#"):
        return None
    negate = pattern.startswith("!")
    pattern = pattern[1:] if negate else pattern
    if Path(pattern).is_relative_to(root):  # a path given whole
        pattern = "/" + Path(pattern).relative_to(root).as_posix() + (
            "/" if pattern.endswith("/") else "")
    dir_only = pattern.endswith("/")
    pattern = pattern.rstrip("/")
    anchored = "/" in pattern
    body = _glob_regex(pattern.lstrip("/"))
    return re.compile(("^" if anchored else "^(?:.*/)?") + body + "$"), negate, dir_only


def _glob_regex(glob: str) -> str:
    out, i = [], 0
    while i < len(glob):
        if glob.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif glob.startswith("**", i):
            out.append(".*")
            i += 2
        elif glob[i] == "*":
            out.append("[^/]*")
            i += 1
        elif glob[i] == "?":
            out.append("[^/]")
            i += 1
        elif glob[i] == "[" and "]" in glob[i + 1:]:
            end = glob.index("]", i + 1)
            inner = glob[i + 1:end]
            out.append("[" + ("^" + inner[1:] if inner.startswith("!") else inner) + "]")
            i = end + 1
        else:
            out.append(re.escape(glob[i]))
            i += 1
    return "".join(out)


# -- uploading and merging -----------------------------------------------------------------

def upload(plane: ControlPlane, prepared: Prepared) -> None:
    """Write each package the control plane does not hold yet (content-addressed: what
    another job uploaded is reused). Raises RtmlSystemError if Redis fails."""
    for package in prepared.packages:
        if plane.has_package(package.digest):
            log.info("runtime_env %s %s: package %s is stored already", package.what,
                     package.source, package.digest[:16])
            continue
        data = package.build()
        plane.put_package(package.digest, data)
        log.info("runtime_env %s %s: uploaded package %s (%d bytes)", package.what,
                 package.source, package.digest[:16], len(data))


def merge(parent: dict[str, Any], child: dict[str, Any]) -> dict[str, Any]:
    """``child`` over ``parent``, as Ray: each key of the child's replaces the parent's,
    but env_vars are merged (the child's win)."""
    merged = {**parent, **child}
    if "env_vars" in parent and "env_vars" in child:
        merged["env_vars"] = {**parent["env_vars"], **child["env_vars"]}
    return merged


def dumps(env: dict[str, Any]) -> str:
    """The wire form: canonical JSON, so equal envs share workers; "" for none."""
    return json.dumps(env, sort_keys=True, separators=(",", ":")) if env else ""


def loads(text: str) -> dict[str, Any]:
    return json.loads(text) if text else {}


def expand(value: str) -> str:
    """``${NAME}`` in an env var's value replaced by the process's NAME (as Ray)."""
    return _EXPAND.sub(lambda match: os.environ.get(match.group(1), ""), value)


class RuntimeParts(Protocol):
    """What ``resolve`` reads of a runtime (a ClientRuntime: not named, so that this
    module stays out of the runtime's import cycle)."""

    client_id: ClientID
    runtime_env: str  # the env its calls inherit (the job's, or a worker's own)
    plane: ControlPlane


_resolved: dict[tuple[ClientID, str], str] = {}
"""(runtime's client id, the env as given) -> its wire form merged with the runtime's."""


def resolve(rt: RuntimeParts, env: dict[str, Any] | None) -> str:
    """The wire form of a call's env under ``rt``: prepared and uploaded on first use,
    merged under the runtime's own (``rt.runtime_env``). Raises ValueError or TypeError
    (a bad env), RtmlSystemError (the control plane failed)."""
    if env is None:
        return rt.runtime_env
    key = (rt.client_id, _given_key(env))
    wire = _resolved.get(key)
    if wire is None:
        prepared = prepare(check(env))
        upload(rt.plane, prepared)
        wire = _resolved[key] = dumps(merge(loads(rt.runtime_env), prepared.env))
    return wire


def _given_key(env: dict[str, Any]) -> str:
    def path_of(value: Any) -> str:
        if isinstance(value, types.ModuleType):
            return f"module:{value.__name__}"
        if isinstance(value, os.PathLike):
            return os.fspath(value)
        raise TypeError(f"runtime_env holds {value!r}, which is not JSON, a path or a module")
    return os.getcwd() + "\0" + json.dumps(env, sort_keys=True, default=path_of)
