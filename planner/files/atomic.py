"""Writing an output file so that a reader never sees half of it, with one-line errors.

A regular file (or a new one) is written next to itself as ``NAME.tmp`` and renamed over the
target. A target that exists and is not a regular file (``/dev/stdout``, a FIFO) is written in
place: there is no directory entry to rename over, and its folder (``/dev``) may not be writable.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from hulk.errors import InputError


def write_text_atomic(path: str | os.PathLike, text: str, what: str) -> None:
    """Write ``text`` to ``path``; an OSError becomes an InputError naming the file and ``what``
    was being written (e.g. "fleet JSON")."""
    out = Path(path)
    try:
        try:
            mode = out.stat().st_mode
        except FileNotFoundError:
            mode = None
        if mode is not None and not stat.S_ISREG(mode):
            with open(out, "w", encoding="utf-8") as f:
                f.write(text)
            return
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(out.name + ".tmp")
        try:
            tmp.write_text(text, encoding="utf-8")
            os.replace(tmp, out)
        finally:
            if tmp.exists():
                tmp.unlink(missing_ok=True)
    except OSError as exc:
        raise InputError(f"cannot write {what}: {exc.strerror or exc}", path=str(path)) from None
