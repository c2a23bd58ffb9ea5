"""Writing a file so that neither a reader nor a crash ever sees half of it: the one atomic writer.

The data goes to a temporary file in the target's folder (the same file system, so the rename is
atomic), is flushed and fsynced, renamed over the target with ``os.replace``, and the folder is
fsynced so that the rename itself survives a power cut. On any failure the temporary file is
removed and the target is left as it was.

The new file keeps the mode of the file it replaces, takes ``mode`` when one is given (set before
anything is written, so a secret is never readable by others), or else the usual default less
the umask. A target that exists and is not a regular file (``/dev/stdout``, a FIFO) is written
in place by :func:`write_output`: there is no directory entry to rename over, and its folder
(``/dev``) may not be writable.
"""

from __future__ import annotations

import os
import secrets
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

from hulk.errors import InputError


def sync_dir(folder: str | os.PathLike) -> None:
    """fsync a folder, so that a rename or unlink in it is on disk."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextmanager
def atomic_file(path: str | os.PathLike, *, mode: int | None = None,
                binary: bool = False) -> Iterator[IO]:
    """A file to write ``path``'s new content to; it replaces ``path`` when the block ends
    without an exception (flushed, fsynced, renamed, folder fsynced), and is removed otherwise."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    if mode is None:
        try:
            mode = stat.S_IMODE(target.stat().st_mode)
        except FileNotFoundError:
            pass
    tmp = target.with_name(f".{target.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600 if mode is not None else 0o666)
    try:
        with open(fd, "wb" if binary else "w", encoding=None if binary else "utf-8") as handle:
            if mode is not None:
                os.fchmod(handle.fileno(), mode)
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    sync_dir(target.parent)


def write_atomic(path: str | os.PathLike, data: str | bytes, *, mode: int | None = None) -> None:
    """Replace ``path`` with ``data`` (text is written as UTF-8) atomically and durably."""
    with atomic_file(path, mode=mode, binary=isinstance(data, bytes)) as handle:
        handle.write(data)


def write_output(path: str | os.PathLike, text: str, what: str) -> None:
    """A command's output file: written atomically, or in place where it is a device or a FIFO;
    an OSError becomes an InputError naming the file and ``what`` was being written."""
    try:
        try:
            kind = os.stat(path).st_mode
        except FileNotFoundError:
            kind = None
        if kind is not None and not stat.S_ISREG(kind):
            with open(path, "w", encoding="utf-8") as handle:
                handle.write(text)
            return
        write_atomic(path, text)
    except OSError as exc:
        raise InputError(f"cannot write {what}: {exc.strerror or exc}", path=str(path)) from None
