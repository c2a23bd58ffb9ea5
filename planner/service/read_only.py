"""Opening the planner's SQLite file read-only, for the commands that only read (a live store,
a backup, a copy on a read-only mount): SQLite's mode=ro, so nothing is created, chmod-ed or
migrated, and a file that is not a store is a one-line InputError that leaves it as it was."""

from __future__ import annotations

import sqlite3
import urllib.parse
from pathlib import Path

from hulk.errors import InputError, StoreError

EXPECTED = "expected the SQLite file `serve --db` writes"
_SQLITE_HEADER = b"SQLite format 3\x00"


def read_uri(path: str) -> str:
    """The URI another connection opens ``path`` with to read beside a writer."""
    return f"file:{urllib.parse.quote(path)}?mode=ro"


def connect_read_only(path: str, busy_timeout_s: float) -> tuple[sqlite3.Connection, str]:
    """(connection, the URI it used). A WAL file in a read-only folder with no -shm file beside
    it cannot be read with mode=ro (SQLite needs to create the -shm), so it is opened immutable
    there, which is right only when no -wal file holds changes the file lacks."""
    try:
        with open(path, "rb") as f:
            header = f.read(len(_SQLITE_HEADER))
    except FileNotFoundError:
        raise InputError(f"no such store ({EXPECTED})", path=path) from None
    except OSError as exc:
        raise InputError(f"cannot read it ({exc.strerror}; {EXPECTED})", path=path) from None
    if header != _SQLITE_HEADER:
        what = "an empty file" if not header else "not an SQLite file"
        raise InputError(f"not a Hulk store: {what} ({EXPECTED})", path=path)
    wal = Path(path + "-wal")
    for uri in (read_uri(path), read_uri(path) + "&immutable=1"):
        conn = sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False,
                               timeout=busy_timeout_s)
        try:
            conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
        except sqlite3.OperationalError as exc:
            conn.close()
            if uri.endswith("immutable=1") or (wal.exists() and wal.stat().st_size > 0):
                raise StoreError(f"{path}: cannot open it read-only ({exc}); a -wal file with "
                                 "changes in a read-only folder needs its -shm file beside it, "
                                 "or a copy of both in a writable folder") from None
            continue
        except sqlite3.DatabaseError as exc:
            conn.close()
            raise InputError(f"not a Hulk store: {exc} ({EXPECTED})", path=path) from None
        return conn, uri
    raise AssertionError("unreachable")


def columns(conn: sqlite3.Connection) -> dict[str, set[str]]:
    """{table: its column names} of the connection's main schema."""
    names = [r[0] for r in conn.execute("SELECT name FROM main.sqlite_master WHERE type = "
                                        "'table' AND name NOT LIKE 'sqlite_%'")]
    return {name: {c[1] for c in conn.execute(f"PRAGMA main.table_info({name!r})")}
            for name in names}


def schema_gap(have: dict[str, set[str]], want: dict[str, set[str]]) -> str | None:
    """What ``have`` lacks of ``want`` (tables and columns), in words; None when nothing."""
    for table, wanted in want.items():
        if table not in have:
            return f"no {table} table"
        missing = sorted(wanted - have[table])
        if missing:
            return f"no {table}.{missing[0]} column"
    return None
