"""A job's working directory on the wire: packed as a zip by the client, unpacked by the
head where the job runs.

    client: pack(dir, excludes) -> zip bytes (<= MAX_PACKED)  --SubmitJob.working_dir-->
    head:   unpack(zip bytes, <session>/jobs/<submission id>/) -> the entrypoint's cwd

Left out, as Ray does for ``.git``: version-control directories, ``__pycache__``, and
what ``excludes`` names (fnmatch patterns on the path relative to the directory, or on
a file or directory's name). Symlinks are stored as what they point to only if that
lies inside the directory; others are left out. The head refuses an archive larger
than MAX_PACKED, or one that unpacks to more than MAX_UNPACKED (a zip bomb), and
unpacks nothing outside its directory.
"""

from __future__ import annotations

import fnmatch
import io
import os
import zipfile
from pathlib import Path

MAX_PACKED = 100 << 20
"""Bytes a job's packed working directory may take (Ray's limit is 100 MiB too)."""
MAX_UNPACKED = 1 << 30
"""Bytes it may unpack to."""
ALWAYS_EXCLUDED = (".git", ".hg", ".svn", "__pycache__")

_MIB = float(1 << 20)


class WorkingDirError(ValueError):
    """A working directory that cannot be packed or unpacked; the message says why."""


def pack(directory: str | os.PathLike[str], excludes: list[str] | tuple[str, ...] = (),
         limit: int = MAX_PACKED) -> bytes:
    """The zip of ``directory``. Raises WorkingDirError: not a directory, or larger than
    ``limit`` bytes packed (the message names the largest files)."""
    root = Path(directory).expanduser().resolve()
    if not root.is_dir():
        raise WorkingDirError(f"working_dir {directory} is not a directory")
    buffer = io.BytesIO()
    sizes: list[tuple[int, str]] = []
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for path in _files(root, excludes):
            name = path.relative_to(root).as_posix()
            sizes.append((path.stat().st_size, name))
            archive.write(path, name)
            if buffer.tell() > limit:
                break
    if buffer.tell() > limit:
        raise WorkingDirError(_too_large(root, buffer.tell(), limit, sizes))
    return buffer.getvalue()


def _too_large(root: Path, size: int, limit: int, sizes: list[tuple[int, str]]) -> str:
    largest = ", ".join(f"{name} ({n / _MIB:.1f} MiB)" for n, name in sorted(sizes)[-3:])
    return (f"working_dir {root} packs to more than {limit / _MIB:g} MiB (at least "
            f"{size / _MIB:.1f} MiB; largest files: {largest}); leave out large files with "
            f"runtime_env excludes, or put data where the cluster's machines read it")


def _files(root: Path, excludes: list[str] | tuple[str, ...]) -> list[Path]:
    """The files to pack, sorted: symlinks kept only if they point inside ``root``."""
    found = []
    for current, dirs, files in os.walk(root, followlinks=False):
        here = Path(current)
        dirs[:] = sorted(d for d in dirs if not _excluded(here / d, root, excludes)
                         and _inside(here / d, root))
        for name in sorted(files):
            path = here / name
            if not _excluded(path, root, excludes) and _inside(path, root) and path.is_file():
                found.append(path)
    return found


def _excluded(path: Path, root: Path, excludes: list[str] | tuple[str, ...]) -> bool:
    relative = path.relative_to(root).as_posix()
    return path.name in ALWAYS_EXCLUDED or any(
        fnmatch.fnmatch(relative, pattern) or fnmatch.fnmatch(path.name, pattern)
        for pattern in excludes)


def _inside(path: Path, root: Path) -> bool:
    return not path.is_symlink() or path.resolve().is_relative_to(root)


def unpack(data: bytes, target: Path, limit: int = MAX_UNPACKED) -> None:
    """Unpack the zip ``data`` into the existing directory ``target``. Raises
    WorkingDirError: not a zip, too large, or a member would land outside ``target``."""
    if len(data) > MAX_PACKED:
        raise WorkingDirError(f"the working_dir archive is {len(data) / _MIB:.1f} MiB, more "
                              f"than the {MAX_PACKED / _MIB:.0f} MiB a job may upload")
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
    except zipfile.BadZipFile as exc:
        raise WorkingDirError(f"the working_dir archive is not a zip file: {exc}") from None
    with archive:
        members = archive.infolist()
        total = sum(member.file_size for member in members)
        if total > limit:
            raise WorkingDirError(f"the working_dir archive unpacks to {total / _MIB:.1f} "
                                  f"MiB, more than {limit / _MIB:.0f} MiB")
        base = target.resolve()
        for member in members:
            if not (base / member.filename).resolve().is_relative_to(base):
                raise WorkingDirError(f"the working_dir archive has a member outside its "
                                      f"directory: {member.filename!r}")
        archive.extractall(base)
