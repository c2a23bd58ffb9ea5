"""Reading a file a user names (a fleet file, jobs.yaml, a plan): a regular file of bounded size.

A device such as ``/dev/zero`` would be read until memory runs out, and a FIFO would block the
command for ever; both are refused before a byte is read. The file is opened without blocking
and checked on the open descriptor, so nothing swapped in after a check gets through. The size
is checked before reading and again while reading (a file that grows).

Standard library and :mod:`hulk.errors` only: the agent may use it too.
"""

from __future__ import annotations

import os
import stat

from hulk.errors import InputError


def read_user_file(path: str | os.PathLike, what: str, max_bytes: int) -> bytes:
    """The bytes of the regular file ``path``, at most ``max_bytes`` of them; otherwise a
    one-line InputError naming the file and ``what`` was expected ("a fleet file")."""
    where = os.fspath(path)
    try:
        fd = os.open(where, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise InputError(f"no such file (expected {what})", path=where) from None
    except OSError as exc:
        raise InputError(f"cannot read: {exc.strerror or exc}", path=where) from None
    try:
        mode, size = (info := os.fstat(fd)).st_mode, info.st_size
        if stat.S_ISDIR(mode):
            raise InputError(f"is a directory; expected {what}", path=where)
        if not stat.S_ISREG(mode):
            raise InputError(f"not a regular file (a device, FIFO or socket); expected {what}",
                             path=where)
        if size > max_bytes:
            raise too_large(where, what, max_bytes, f"{size:,} bytes")
        chunks, total, want = [], 0, size + 1   # one read takes a regular file whole
        while total <= max_bytes:
            chunk = os.read(fd, min(want, max_bytes + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
            want = 1 << 20
    except OSError as exc:
        raise InputError(f"cannot read: {exc.strerror or exc}", path=where) from None
    finally:
        os.close(fd)
    if total > max_bytes:
        raise too_large(where, what, max_bytes, "more (it grew while read)")
    return b"".join(chunks)


def too_large(where: str, what: str, max_bytes: int, size: str) -> InputError:
    mib = f" ({max_bytes >> 20:,} MiB)" if max_bytes >= 1 << 20 else ""
    return InputError(f"expected {what} of at most {max_bytes:,} bytes{mib}, got {size}",
                      path=where)
