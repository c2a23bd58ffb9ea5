"""What ended a failed job, read from its log: the exception line of the last Python traceback.

A trainer's traceback names its cause on its last line (``ValueError: Invalid learning rate``),
after frames that can run to dozens of lines; torchrun then prints a traceback of its own that
ends in ``ChildFailedError`` and names no cause. So the cause is the exception line of the last
traceback whose exception is not torchrun's report of a failed child (that one only when no
other traceback is in the log). torchrun's ``--tee``/``--local-ranks-filter`` prefixes
(``[default0]:``, ``[rank0]:``) are read through. Only the standard library: the agent imports
no torch.
"""

from __future__ import annotations

import re
from pathlib import Path

_PREFIX = re.compile(rb"^(?:\[[^\]\n]{1,40}\]:?\s?)?")
_TRACEBACK = b"Traceback (most recent call last):"
_CHAINED = (b"During handling of the above exception", b"The above exception was the direct cause")
_CHILD_FAILED = b"ChildFailedError"
MAX_LINE_BYTES = 65536


def _body(line: bytes) -> bytes:
    """The line without torchrun's rank prefix and its line end."""
    return line[_PREFIX.match(line).end():].rstrip(b"\r\n")


def root_cause(path: Path | None) -> tuple[int, str] | None:
    """(line number, text) of the exception line that ended the last traceback in the log (see
    the module's docstring); None when the log has no traceback or cannot be read. One pass, a
    line (at most 64 KiB of one) at a time."""
    if path is None:
        return None
    found: tuple[int, bytes] | None = None
    child: tuple[int, bytes] | None = None
    in_traceback = False
    try:
        with open(path, "rb") as f:
            for number, line in enumerate(iter(lambda: f.readline(MAX_LINE_BYTES), b""), 1):
                body = _body(line)
                if body.startswith(_TRACEBACK):
                    in_traceback = True
                    continue
                if not in_traceback or not body.strip() or body[:1] in (b" ", b"\t"):
                    continue     # a frame ("  File ...") or its code, or no traceback yet
                if body.startswith(_CHAINED):
                    continue
                in_traceback = False
                if _CHILD_FAILED in body:
                    child = (number, body)
                else:
                    found = (number, body)
    except OSError:
        return None
    pick = found or child
    if pick is None:
        return None
    return pick[0], pick[1].decode("utf-8", "replace")
