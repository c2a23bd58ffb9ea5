"""The spool the running agent uses: agent/spool.py's SQLite spool, with the same methods, kept
working when its file or its directory is not (the agent never exits for its spool).

- A file that is not a usable spool (not SQLite, truncated, malformed, another schema, a
  directory in its place) is moved aside to ``<name>.corrupt-<UTC time>`` (its -wal and -shm
  beside it; the newest ``KEEP_ASIDE`` are kept) and a fresh spool starts at the path. What the
  file held is lost: one ERROR line says so and names both paths.
- No spool file can be opened (the state directory read-only, full, or not creatable): records
  wait in a spool in memory, bounded as the file spool bounds what it keeps in memory
  (``memory_max``), and are reported as usual; the file is tried again every ``retry_s`` and,
  once it opens, what memory holds moves there. One ERROR line when this starts, one WARNING
  when it ends.
- The file deleted or replaced while the agent runs (the path no longer names the open file,
  checked before every save and batch): the spool at the path is opened again (a fresh one if
  none is there), logged once; what only the old file held is lost, counted as dropped.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import time
from collections.abc import Callable, Iterable
from datetime import datetime, timezone
from pathlib import Path
from typing import TypeVar

from agent.spool import (CHUNK_ROWS, Batch, Record, Spool, SpoolCorruptError, SpoolFullError,
                         memory_bound)
from hulk.errors import StoreError
from hulk.plural import count as plural

log = logging.getLogger(__name__)

RETRY_S = 60.0            # between tries of the file while records wait in memory
KEEP_ASIDE = 3            # corrupt spool files kept for a post-mortem
SIDE_FILES = ("", "-wal", "-shm")
RESTART_REASONS = ("corrupt", "deleted")
T = TypeVar("T")


class MemorySpool(Spool):
    """A Spool in an in-memory SQLite database: the same batches, acks and bounds, no file."""

    def _connect(self) -> sqlite3.Connection:
        return sqlite3.connect(":memory:", isolation_level=None)

    def _room_for(self, rows: int) -> bool:
        return True


def _identity(path: Path) -> tuple[int, int] | None:
    try:
        stat = os.stat(path)
    except OSError:
        return None
    return stat.st_dev, stat.st_ino


class SpoolStore:
    """The Spool interface over a file spool, or a memory spool while no file can be used."""

    def __init__(self, path: Path, max_samples: int, *, memory_max: int | None = None,
                 retry_s: float = RETRY_S, monotonic: Callable[[], float] = time.monotonic,
                 **spool_options):
        if max_samples < 1:
            raise ValueError("max_samples must be at least 1")
        self.path = Path(path)
        self.memory_max = memory_bound(max_samples, memory_max)
        self._max_samples = max_samples
        self._options = dict(spool_options, memory_max=memory_max)
        self.retry_s = retry_s
        self._monotonic = monotonic
        self.restarts = dict.fromkeys(RESTART_REASONS, 0)   # fresh spools started, by reason
        self._identity: tuple[int, int] | None = None       # (st_dev, st_ino) of the open file
        self._retry_at = monotonic() + retry_s
        self._carried = 0
        try:
            self._spool: Spool = self._open_file()
        except StoreError as err:
            self._spool = self._memory(err)

    # ------------------------------------------------------------------ the Spool interface
    def hold(self, samples: Iterable[Record]) -> int:
        return self._spool.hold(samples)

    def save(self) -> int:
        self._check_file()
        if self.in_memory:
            self._retry_file()
        return self._guard(lambda spool: spool.save())

    def append(self, samples: Iterable[Record]) -> int:
        return self.hold(samples) + self.save()

    def take_batch(self, max_samples: int) -> Batch | None:
        self._check_file()
        return self._guard(lambda spool: spool.take_batch(max_samples))

    def ack(self, batch_id: str) -> int:
        return self._guard(lambda spool: spool.ack(batch_id))

    def discard(self, batch_id: str) -> int:
        return self._guard(lambda spool: spool.discard(batch_id))

    def held_batch(self, max_samples: int) -> tuple[Record, ...]:
        return self._spool.held_batch(max_samples)

    def forget_held(self, count: int) -> None:
        self._spool.forget_held(count)

    @property
    def depth(self) -> int:
        return self._spool.depth

    @property
    def stored(self) -> int:
        return self._spool.stored

    @property
    def held(self) -> int:
        return self._spool.held

    @property
    def dropped(self) -> int:
        return self._spool.dropped

    @property
    def max_samples(self) -> int:
        """The bound in force: the file spool's, or the memory spool's while in memory."""
        return self._spool.max_samples

    @property
    def pending(self) -> str | None:
        return self._spool.pending

    @property
    def in_memory(self) -> bool:
        """No spool file can be used now: records wait in memory (lost if the agent stops)."""
        return isinstance(self._spool, MemorySpool)

    def close(self) -> None:
        if self.in_memory and self._spool.depth:
            log.error("spool: %s still cannot be written: lost %s kept in memory and not "
                      "reported", self.path, plural(self._spool.depth, "sample"))
        self._spool.close()

    # ------------------------------------------------------------------ keeping it working
    def _guard(self, call: Callable[[Spool], T]) -> T:
        """``call`` on the spool; if the file turns out corrupt, or unusable for another reason
        than room, once more on a fresh spool or on one in memory."""
        try:
            return call(self._spool)
        except SpoolFullError:
            raise   # room comes back: the callers wait and retry
        except SpoolCorruptError as err:
            self._restart("corrupt", str(err))
        except StoreError as err:
            if self.in_memory:
                raise
            self._to_memory(err)
        return call(self._spool)

    def _open_file(self) -> Spool:
        """The spool file; one SQLite cannot use is moved aside (logged) and a fresh one
        started. Raises StoreError when no file can be used now."""
        try:
            spool = Spool(self.path, self._max_samples, **self._options)
        except SpoolCorruptError as err:
            aside = self._move_aside()
            self.restarts["corrupt"] += 1
            log.error("spool: %s; moved it to %s (the newest %d such files are kept) and started "
                      "a fresh spool: the samples it held are lost", err, aside, KEEP_ASIDE)
            spool = Spool(self.path, self._max_samples, **self._options)
        self._identity = _identity(self.path)
        return spool

    def _memory(self, why: StoreError) -> MemorySpool:
        self._identity = None
        self._carried = 0   # of the memory spool's dropped count, what the file counts too
        self._retry_at = self._monotonic() + self.retry_s
        log.error("spool: %s; keeping up to %d samples in memory instead (reported as usual, "
                  "lost if the agent stops first) and trying the file again every %.0f s",
                  why, self.memory_max, self.retry_s)
        return MemorySpool(self.path, self.memory_max, memory_max=self.memory_max)

    def _to_memory(self, why: StoreError) -> None:
        """The file fails (not for room): its records stay in it for later, new ones wait in
        memory meanwhile."""
        old = self._spool
        memory = self._memory(why)
        memory.add_dropped(old.dropped)
        self._carried = old.dropped
        memory.hold(old.held_batch(old.held))
        old.abandon()
        self._spool = memory

    def _check_file(self) -> None:
        if self._identity is None or self.in_memory or _identity(self.path) == self._identity:
            return
        self._restart("deleted", f"{self.path} was deleted or replaced while the agent ran")

    def _restart(self, reason: str, why: str) -> None:
        """A fresh spool in place of one whose file is corrupt or gone: what memory held and
        the dropped count carry over; what only the file held is lost, counted as dropped."""
        old = self._spool
        held, lost, dropped = old.held_batch(old.held), old.stored, old.dropped
        old.abandon()
        self.restarts[reason] += 1
        if reason == "deleted":
            # SQLite leaves the log of a file that moved when closing it: applied to whatever
            # file is at the path now, it would bring the old pages back into it.
            for side in SIDE_FILES[1:]:
                try:
                    os.remove(f"{self.path}{side}")
                except OSError:
                    pass
        try:
            aside = self._move_aside() if reason == "corrupt" else None
            spool = self._open_file()
        except StoreError as err:
            spool = self._memory(err)
        else:
            log.error("spool: %s; %s: lost %s it held (counted as dropped)", why,
                      f"moved it to {aside} and started a fresh spool" if aside else
                      f"opened {self.path} again (fresh if none was there)",
                      plural(lost, "sample"))
        spool.add_dropped(dropped + lost)
        spool.hold(held)
        self._spool = spool

    def _retry_file(self) -> None:
        """In memory: now and then, try the file; once it opens, what memory holds moves there
        (only between batches, so no batch in flight is sent twice under two ids)."""
        memory = self._spool
        if self._monotonic() < self._retry_at or memory.pending is not None:
            return
        self._retry_at = self._monotonic() + self.retry_s
        spool = None
        try:
            spool = self._open_file()
            records = memory.peek(memory.stored) + memory.held_batch(memory.held)
            for start in range(0, len(records), CHUNK_ROWS):
                spool.hold(records[start:start + CHUNK_ROWS])
                spool.save()
        except StoreError as err:   # opens but cannot be written: memory still has them all
            if spool is not None:
                spool.abandon()
            self._identity = None
            log.debug("spool: still in memory: %s", err)
            return
        spool.add_dropped(memory.dropped - self._carried)
        memory.abandon()
        self._spool = spool
        log.warning("spool: %s is usable again; the %d samples kept in memory moved there",
                    self.path, len(records))

    def _move_aside(self) -> Path:
        """Renames the file (and its -wal and -shm) to ``<name>.corrupt-<UTC time>``; keeps the
        newest KEEP_ASIDE. Raises StoreError if it cannot."""
        # Fixed width, to the microsecond: the names sort by age, which pruning relies on.
        stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S.%fZ")
        aside = self.path.with_name(f"{self.path.name}.corrupt-{stamp}")
        n = 0
        while any(Path(f"{aside}{side}").exists() for side in SIDE_FILES):
            n += 1
            aside = self.path.with_name(f"{self.path.name}.corrupt-{stamp}-{n}")
        try:
            for side in SIDE_FILES:
                if os.path.lexists(f"{self.path}{side}"):
                    os.replace(f"{self.path}{side}", f"{aside}{side}")
        except OSError as err:
            raise StoreError(f"{self.path}: the spool is corrupt and cannot be moved aside: "
                             f"{err}") from None
        self._prune()
        return aside

    def _prune(self) -> None:
        prefix = f"{self.path.name}.corrupt-"
        kept = sorted(p.name for p in self.path.parent.iterdir() if p.name.startswith(prefix)
                      and not p.name.endswith(("-wal", "-shm")))
        for name in kept[:-KEEP_ASIDE]:
            for side in SIDE_FILES:
                try:
                    os.remove(self.path.parent / f"{name}{side}")
                except FileNotFoundError:
                    pass
                except OSError as err:   # a directory someone put there: left alone
                    log.debug("spool: not removing %s%s: %s", name, side, err)
