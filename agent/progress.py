"""A rank's progress file, read by the agent: its tail, folded into one ``StepProgress``.

The trainer appends one JSON line per step to ``HULK_PROGRESS_FILE`` (docs/JOBS.md):

    {"step": 12, "time": 1764150000.12, "step_s": 0.231, "compute_s": 0.18, "communication_s": 0.05}

``step`` and ``step_s`` are required. The agent reads only the file's last ``READ_BYTES`` and
first ``HEAD_BYTES`` each time (one opening), so a huge file costs no more than a small one, and
keeps nothing between reads, so a file that shrinks, is replaced or is rewritten is simply read
again. A cut first line, a last line still being written, a line that is not JSON or holds a
value out of bounds are skipped. The medians leave out the warm-up: step 0 and the file's first
line (the launcher starts each run with a fresh file, so a run resumed from a checkpoint warms
up on its first line too).

Beside the medians, the wall clock a step over the whole run: from the first line of the head
that is not warm-up and has a ``time`` to the newest line, when that has one too. A DiLoCo job's
median is an inner step; only this figure includes the outer syncs every H steps.
"""

from __future__ import annotations

import json
import math
import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from hulk.wire.progress import MAX_STEP_S, MAX_STEPS, MAX_UPDATED_MS, WINDOW_STEPS, StepProgress

READ_BYTES = 64 * 1024
MAX_LINE_BYTES = 4096              # a longer line is not one of ours
HEAD_BYTES = 2 * MAX_LINE_BYTES    # holds the warm-up line and the next whole one at least


@dataclass(frozen=True)
class StepLine:
    """One valid line of a progress file."""

    step: int
    step_s: float
    time_s: float | None = None            # unix seconds, when the trainer wrote it
    compute_s: float | None = None
    communication_s: float | None = None
    total_steps: int = 0


def _seconds(value: object, high: float) -> float | None:
    """``value`` as seconds in [0, high], else None (bools, strings, NaN, negatives...)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) and 0 <= value <= high else None


def _count(value: object) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_STEPS:
        return None
    return value


def parse_line(text: str) -> StepLine | None:
    """The line's step, or None for anything else (garbage, a value out of bounds)."""
    if len(text) > MAX_LINE_BYTES:
        return None
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError):   # RecursionError: 4 KiB of brackets
        return None
    if not isinstance(doc, dict):
        return None
    step, step_s = _count(doc.get("step")), _seconds(doc.get("step_s"), MAX_STEP_S)
    if step is None or step_s is None:
        return None
    optional = {}
    for name, high in (("time", MAX_UPDATED_MS / 1000), ("compute_s", MAX_STEP_S),
                       ("communication_s", MAX_STEP_S)):
        if name in doc:
            optional[name] = _seconds(doc[name], high)
            if optional[name] is None:
                return None
    total = _count(doc.get("total_steps", 0))
    if total is None:
        return None
    return StepLine(step, step_s, optional.get("time"), optional.get("compute_s"),
                    optional.get("communication_s"), total)


def _median(values: Sequence[float]) -> float:
    s = sorted(values)
    n = len(s)
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


def _p90(values: Sequence[float]) -> float:
    """Nearest-rank 90th percentile."""
    s = sorted(values)
    return s[max(0, math.ceil(0.9 * len(s)) - 1)]


def first_timed(head: Sequence[str]) -> StepLine | None:
    """The first valid line of the file's head (its whole lines from offset 0) that is not
    warm-up (the file's first line, step 0) and carries a ``time``; None when there is none."""
    for text in head[1:]:
        parsed = parse_line(text)
        if parsed is not None and parsed.step > 0 and parsed.time_s is not None:
            return parsed
    return None


def _wall(first: StepLine | None, last: StepLine) -> tuple[float, int]:
    """(wall seconds a step from ``first`` to ``last``, steps between), or (0, 0) when they do
    not tell: a time missing, no step between, or a clock or file that went back."""
    if first is None or first.time_s is None or last.time_s is None or last.step <= first.step:
        return 0.0, 0
    steps = last.step - first.step
    wall = (last.time_s - first.time_s) / steps
    # A file replaced between two runs' lines or a clock stepped back: no figure, not an error.
    return (wall, steps) if 0 <= wall <= MAX_STEP_S else (0.0, 0)


def summarize(lines: Sequence[StepLine], *, first_is_warmup: bool, updated_ms: int = 0,
              window: int = WINDOW_STEPS, first: StepLine | None = None
              ) -> StepProgress | None:
    """The summary of a file's valid lines in file order (None when there are none).

    ``first_is_warmup``: ``lines[0]`` is the file's first line (the read started at offset 0),
    left out of the medians like step 0. ``updated_ms``: the newest line's time when the lines
    carry none (the file's modification time). ``first``: the run's first timed step after
    warm-up (``first_timed``), for the wall-clock figure."""
    if not lines:
        return None
    timed = [s.time_s for s in lines if s.time_s is not None]
    if timed:
        updated_ms = int(max(timed) * 1000)
    measured = [s for i, s in enumerate(lines) if s.step > 0 and not (i == 0 and first_is_warmup)]
    recent = measured[-window:]
    walls = [s.step_s for s in recent]
    compute = [s.compute_s for s in recent if s.compute_s is not None]
    communication = [s.communication_s for s in recent if s.communication_s is not None]
    last = lines[-1]
    wall_s, wall_steps = _wall(first, last)
    return StepProgress(
        steps=last.step, total_steps=max((s.total_steps for s in lines), default=0),
        iteration_s=_median(walls) if walls else 0.0,
        iteration_p90_s=_p90(walls) if walls else 0.0,
        compute_s=_median(compute) if compute else 0.0,
        communication_s=_median(communication) if communication else 0.0,
        samples=len(walls), updated_ms=min(max(updated_ms, 0), MAX_UPDATED_MS),
        wall_iteration_s=wall_s, wall_steps=wall_steps).check()


def _lines(data: bytes, cut_first: bool) -> list[str]:
    """The whole non-blank lines of ``data``: the last part is a line still being written (or
    "" after the last newline), the first one is cut by the seek when ``cut_first``."""
    parts = data.split(b"\n")
    parts.pop()
    if cut_first and parts:
        parts.pop(0)
    return [p.decode("utf-8", "replace") for p in parts if p.strip()]


def _read(path: str | os.PathLike, max_bytes: int, head_bytes: int
          ) -> tuple[list[str], bool, int, list[str]] | None:
    """(tail lines, whether they start at the file's start, modification time in unix ms, the
    whole lines among the file's first ``head_bytes``), from one opening (the head and tail of
    one file), or None when there is no regular file to read."""
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return None
        start = max(0, info.st_size - max_bytes)
        data = os.pread(fd, max_bytes, start)
        # A file the tail already covers from its start is not read twice.
        head = data if start == 0 else os.pread(fd, head_bytes, 0) if head_bytes > 0 else b""
    except OSError:
        return None
    finally:
        os.close(fd)
    return (_lines(data, start > 0), start == 0, info.st_mtime_ns // 1_000_000,
            _lines(head[:head_bytes], False) if head_bytes > 0 else [])


def read_tail(path: str | os.PathLike, max_bytes: int = READ_BYTES
              ) -> tuple[list[str], bool, int] | None:
    """(the whole lines among the file's last ``max_bytes``, whether they start at the file's
    start, its modification time in unix ms), or None when there is no regular file to read.

    A symbolic link, FIFO or device is not read (the job could plant one to make the agent block
    or read another file); the file is opened without blocking."""
    read = _read(path, max_bytes, 0)
    return None if read is None else read[:3]


def read_progress(path: str | os.PathLike | None, max_bytes: int = READ_BYTES,
                  window: int = WINDOW_STEPS, head_bytes: int = HEAD_BYTES
                  ) -> StepProgress | None:
    """The summary of the progress file at ``path`` (None: no file, or no valid line yet)."""
    if path is None:
        return None
    read = _read(Path(path), max_bytes, head_bytes)
    if read is None:
        return None
    texts, from_start, mtime_ms, head = read
    # Newest first, only as far back as the window needs (one more: it may be the warm-up).
    lines: list[StepLine] = []
    first_is_warmup = False
    for i in range(len(texts) - 1, -1, -1):
        parsed = parse_line(texts[i])
        if parsed is not None:
            lines.append(parsed)
            first_is_warmup = from_start and i == 0
            if len(lines) > window:
                break
    lines.reverse()
    return summarize(lines, first_is_warmup=first_is_warmup, updated_ms=mtime_ms, window=window,
                     first=first_timed(head))
