"""A writing opening of the store (serve, `jobs submit`, `fleet import`) decides by the file's
tables and columns whether it is a Hulk store before it writes anything: another program's
SQLite file (tables named like the planner's without its columns, or other tables) is a one-line
InputError (exit 2) that leaves it byte for byte and mode as it was, and so is a store of a
newer planner (a StoreError); an empty file, a file of credentials only (`enroll` first) and a
store of any older planner still open, and the older one is migrated."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest

from hulk.errors import InputError, StoreError
from hulk.wire.records import RegisterRequest
from planner.security.credentials import CredentialStore
from planner.service.database import ADDED_COLUMNS, SCHEMA_VERSION, planner_tables
from planner.service.store import Store
from tests.helpers.site_rollups import downgrade_to_schema_2


def snapshot(folder: Path) -> dict[str, tuple[bytes, int]]:
    """Every file of ``folder``: its bytes and mode (a -wal or -shm made beside shows too)."""
    return {p.name: (p.read_bytes(), p.stat().st_mode) for p in sorted(folder.iterdir())
            if p.is_file()}


def sql(path: Path, script: str) -> None:
    conn = sqlite3.connect(path)
    try:
        conn.executescript(script)
        conn.commit()
    finally:
        conn.close()


def real_store(path: Path) -> None:
    with Store(path) as store:
        store.register(RegisterRequest("n1", hostname="n1", address="127.0.0.1"))
        store.submit_job("train", {"model": "gpt2-xl"})


FOREIGN: dict[str, tuple[str, str]] = {
    # name: (what another program made, what the refusal says)
    "a nodes table of another program": (
        "CREATE TABLE nodes (x TEXT); INSERT INTO nodes VALUES ('hostile');",
        "table nodes has no columns idx, id, source"),
    "a nodes table with a few of the planner's columns": (
        "CREATE TABLE nodes (idx INTEGER PRIMARY KEY, id TEXT, hostname TEXT);",
        "table nodes has no columns source, city"),
    "the planner's meta table, another program's nodes": (
        "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT);"
        "INSERT INTO meta VALUES ('schema_version', '3');"
        "CREATE TABLE nodes (name TEXT);",
        "table nodes has no columns idx"),
    "a meta table without the schema version": (
        "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT);"
        "INSERT INTO meta VALUES ('version', '7');",
        "table meta holds no schema_version"),
    "a meta table of other columns": (
        "CREATE TABLE meta (name TEXT, data BLOB);", "table meta has no columns key, value"),
    "a schema version that is no number": (
        "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT);"
        "INSERT INTO meta VALUES ('schema_version', 'banana');",
        "schema version 'banana' in table meta"),
    "tables of another program only": (
        "CREATE TABLE orders (id INTEGER, total REAL); CREATE TABLE customers (name TEXT);",
        "no meta table with the planner's schema version, and another program's tables: "
        "orders, customers"),
    "a view named like the planner's table": (
        "CREATE TABLE t (a); CREATE VIEW nodes AS SELECT a FROM t;",
        "nodes is a view, not the planner's table"),
}


@pytest.mark.parametrize("case", FOREIGN)
def test_another_programs_sqlite_file_is_refused_in_one_line_and_left_as_it_was(tmp_path, case):
    script, words = FOREIGN[case]
    path = tmp_path / "planner.sqlite"
    sql(path, script)
    path.chmod(0o644)                    # a writing opening would make a store 0600
    before = snapshot(tmp_path)
    with pytest.raises(InputError) as refused:
        Store(path)
    message = str(refused.value)
    assert message.startswith(f"{path}: not a Hulk store: ") and words in message, message
    assert "expected the SQLite file `serve --db` writes" in message
    assert "\n" not in message and refused.value.exit_code == 2
    assert "no such" not in message       # not SQLite's own words
    assert snapshot(tmp_path) == before   # byte for byte and mode; no -wal, no -shm


@pytest.mark.parametrize("read_only", [False, True])
def test_a_file_with_the_planners_meta_but_foreign_tables_is_refused_read_only_too(
        tmp_path, read_only):
    path = tmp_path / "planner.sqlite"
    sql(path, FOREIGN["the planner's meta table, another program's nodes"][0])
    before = snapshot(tmp_path)
    with pytest.raises(InputError, match="not a Hulk store: table nodes has no columns idx"):
        Store(path, read_only=read_only)
    assert snapshot(tmp_path) == before


def test_a_store_of_a_newer_planner_is_refused_before_anything_is_written(tmp_path):
    path = tmp_path / "planner.sqlite"
    real_store(path)
    newer = SCHEMA_VERSION + 1           # ... which has done without a table of this one
    sql(path, f"UPDATE meta SET value = '{newer}' WHERE key = 'schema_version';"
              "DROP TABLE placement_seq;")
    before = snapshot(tmp_path)
    with pytest.raises(StoreError) as refused:
        Store(path)
    message = str(refused.value)
    assert message.startswith(f"{path}: schema version {newer}, this planner reads "
                              f"{SCHEMA_VERSION}") and "\n" not in message
    assert snapshot(tmp_path) == before


def enrolled(path: Path) -> None:
    credentials = CredentialStore(path)
    try:
        credentials.issue("n1")
    finally:
        credentials.close()


FILES_THAT_BECOME_STORES: dict[str, Callable[[Path], None]] = {
    "an empty file": lambda p: p.write_bytes(b""),
    "an SQLite file without tables": lambda p: sql(p, "CREATE TABLE t (a); DROP TABLE t;"),
    "credentials only (enroll before the first serve)": enrolled,
}


@pytest.mark.parametrize("case", FILES_THAT_BECOME_STORES)
def test_a_file_with_nothing_of_another_program_becomes_a_store(tmp_path, case):
    path = tmp_path / "planner.sqlite"
    FILES_THAT_BECOME_STORES[case](path)
    with Store(path) as store:
        store.submit_job("train", {"model": "gpt2-xl"})
        assert store.database.meta("schema_version") == str(SCHEMA_VERSION)
    with Store(path) as store:
        assert [r.name for r in store.job_records()] == ["train"]


def test_a_store_with_an_operators_own_table_and_view_still_opens(tmp_path):
    path = tmp_path / "planner.sqlite"
    real_store(path)
    sql(path, "CREATE TABLE notes (text TEXT); CREATE VIEW hosts AS SELECT id FROM nodes;")
    with Store(path) as store:
        assert [r.name for r in store.job_records()] == ["train"]


def test_a_store_lacking_every_column_added_since_is_migrated_not_refused(tmp_path):
    path = tmp_path / "planner.sqlite"
    real_store(path)
    sql(path, "".join(f"ALTER TABLE {table} DROP COLUMN {column};"
                      for table, column, _ in ADDED_COLUMNS))
    with Store(path) as store:
        assert [r.name for r in store.job_records()] == ["train"]
        assert [n.id for n in store.node_records()] == ["n1"]
    conn = sqlite3.connect(path)
    try:
        for table, column, _ in ADDED_COLUMNS:
            have = {row[1] for row in conn.execute(f"PRAGMA table_info({table})")}
            assert column in have, (table, column)
    finally:
        conn.close()


def test_a_schema_2_store_is_still_migrated(tmp_path):
    path = tmp_path / "planner.sqlite"
    real_store(path)
    downgrade_to_schema_2(path)
    with Store(path) as store:
        assert store.database.meta("schema_version") == str(SCHEMA_VERSION)
        assert [n.id for n in store.node_records()] == ["n1"]
    assert "sites" in planner_tables()
