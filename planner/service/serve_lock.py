"""One `hulk-planner serve` per store: an exclusive lock on a file beside the database.

Two serve processes on one store would both run the job lifecycle and place the same job twice,
so serve takes ``<db>.serve.lock`` with ``flock`` at start and holds it for its whole life. The
kernel drops the lock when the process ends, however it ends, so a file left by a process that
died never blocks the next serve; the file only names the holder's pid for the refusal message.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from hulk.errors import ConfigError, StoreError

LOCK_SUFFIX = ".serve.lock"


def lock_path(db: str | os.PathLike) -> Path:
    return Path(f"{os.fspath(db)}{LOCK_SUFFIX}")


class ServeLock:
    """``acquire()`` takes the lock or raises ConfigError naming the store and the holder's pid;
    ``release()`` (or leaving the ``with`` block) gives it back."""

    def __init__(self, db: str | os.PathLike):
        self.db = os.fspath(db)
        self.path = lock_path(db)
        self._fd: int | None = None

    def acquire(self) -> ServeLock:
        if self._fd is not None:
            return self
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            raise StoreError(f"{self.path}: cannot open the serve lock: "
                             f"{exc.strerror or exc}") from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(fd)
            os.close(fd)
            raise ConfigError(f"{self.db}: another `hulk-planner serve` (pid {holder}) already "
                              "serves this store; stop it first, or give this one another --db",
                              field="--db") from None
        except OSError as exc:
            os.close(fd)
            raise StoreError(f"{self.path}: cannot lock: {exc.strerror or exc}") from exc
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        except OSError as exc:   # a full disk (ENOSPC, EDQUOT), an I/O error
            os.close(fd)         # gives the lock back: serve does not start
            raise StoreError(f"{self.path}: cannot write the serve lock (serve's pid): "
                             f"{exc.strerror or exc}") from exc
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        # Emptied before unlocking: a later reader never names a process that no longer holds it.
        try:
            os.ftruncate(fd, 0)
        except OSError:   # the pid stays; the next serve takes the lock all the same
            pass
        finally:
            os.close(fd)

    def __enter__(self) -> ServeLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def _holder(fd: int) -> str:
    """The pid the holder wrote ("unknown" while it has not written it yet)."""
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    except OSError:
        return "unknown"
    return text if text.isdigit() else "unknown"
