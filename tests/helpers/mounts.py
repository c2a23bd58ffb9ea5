"""Small file systems for tests of full and read-only disks: tmpfs mounts under a test's
folder, unmounted (lazily, in case a file is still open) when the test ends. Root only."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


class Mounts:
    """``mount(size)`` makes a fresh tmpfs in ``folder``; ``remount(where, 'ro' | 'rw')``."""

    def __init__(self, folder: Path):
        self.folder, self.mounted = folder, []

    def mount(self, size: str) -> Path:
        where = self.folder / f"fs{len(self.mounted)}"
        where.mkdir()
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                       check=True, capture_output=True)
        self.mounted.append(where)
        return where

    def remount(self, where: Path, mode: str) -> None:
        subprocess.run(["mount", "-o", f"remount,{mode}", str(where)], check=True,
                       capture_output=True)


@contextmanager
def tmpfs_mounts(folder: Path) -> Iterator[Mounts]:
    """A :class:`Mounts` in ``folder``; the test is skipped where it does not run as root."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mounts = Mounts(folder)
    try:
        yield mounts
    finally:
        for where in mounts.mounted:
            subprocess.run(["umount", "-l", str(where)], capture_output=True)


def fill(where: Path) -> Path:
    """A file that takes every last byte of ``where``'s file system (a full disk)."""
    filler = where / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        for size in (65536, 512, 1):
            try:
                while True:
                    os.write(fd, b"\0" * size)
            except OSError:
                pass
    finally:
        os.close(fd)
    return filler
