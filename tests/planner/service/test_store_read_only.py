"""The store opened read-only (what `fleet show`, `jobs list`, `plan --db` and the other commands
that only read use): the file is never written, chmod-ed, given a schema or migrated; what
serve has not yet folded is still read; files that are not stores are one-line InputErrors.
And jobs are submitted all or none."""

from __future__ import annotations

import random
import shutil
import sqlite3
from pathlib import Path

import pytest

from hulk.errors import InputError, StoreError
from planner.service.graph import fleet_from_store
from planner.service.store import DAY_MS, Store
from tests.helpers.site_rollups import (NODES, NOT_A_STORE, T0, assert_same_rollup,
                                        downgrade_to_schema_2, fill, make_store,
                                        write_not_a_store)


def snapshot(folder: Path) -> dict[str, tuple[bytes, int]]:
    """Every file of ``folder``: its bytes and mode."""
    return {p.name: (p.read_bytes(), p.stat().st_mode) for p in sorted(folder.iterdir())
            if p.is_file()}


def unchanged_but_empty_sidecars(before: dict, after: dict) -> None:
    """The files are as they were; a WAL reader may leave an empty -wal and its -shm beside a
    store (SQLite's own), never anything written."""
    extra = set(after) - set(before)
    assert extra <= {n + s for n in before for s in ("-wal", "-shm")}, extra
    assert all(after[n][0] == b"" for n in extra if n.endswith("-wal"))
    assert {n: after[n] for n in before} == before


def measurements(seed: int, count: int) -> list:
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        i, j = rng.sample(range(len(NODES)), 2)
        values = [None if rng.random() < 0.1 else rng.uniform(1.0, 300.0)
                  for _ in range(rng.randint(1, 5))]
        out.append((i, j, rng.randint(0, 2), rng.random() < 0.5, values))
    return out


@pytest.mark.parametrize("per_pair_up_to", [3, 1000])   # 6 nodes: site pairs folded, or not
def test_a_read_only_opening_reads_what_serve_has_not_folded_and_writes_nothing(
        tmp_path, per_pair_up_to):
    path = tmp_path / "planner.db"
    store, refs = make_store(path, per_pair_up_to)
    fill(store, refs, measurements(1, 30))
    store.rollup_pending()
    fill(store, refs, measurements(2, 30))   # left for serve's next fold
    store.close()
    copy = tmp_path / "copy" / "planner.db"
    copy.parent.mkdir()
    shutil.copy(path, copy)
    before = snapshot(tmp_path)

    def reads(s: Store) -> tuple:
        fleet = fleet_from_store(s, 3, site_links=True)
        return (s.window_rollups(3), s.site_window_rollups(3), sorted(s.window_totals(90)),
                sorted(s.site_window_totals(90)), s.daily_rollups("par-1", "rom-1"),
                fleet.links, [(k.src, k.dst, k.samples) for k in fleet.site_links])

    clock = lambda: T0 + 2 * DAY_MS  # noqa: E731
    with Store(path, clock=clock, per_pair_up_to=per_pair_up_to, read_only=True) as ro:
        got = reads(ro)
        assert ro.database.overlaid   # samples were pending: read through the TEMP views
    with Store(copy, clock=clock, per_pair_up_to=per_pair_up_to) as rw:
        assert rw.rollup_pending() > 0
        want = reads(rw)
    for g, w in zip(got[:2], want[:2]):
        assert [(p.src, p.dst) for p in g] == [(p.src, p.dst) for p in w]
        for a, b in zip(g, w):
            assert_same_rollup(a.rollup, b.rollup)
    assert [t[:4] for t in got[2]] == [t[:4] for t in want[2]]
    assert [t[:4] for t in got[3]] == [t[:4] for t in want[3]]
    assert [t[4] for t in got[2] + got[3]] == pytest.approx([t[4] for t in want[2] + want[3]])
    assert sorted(got[4]) == sorted(want[4])
    assert got[5:] == want[5:] and got[5]
    unchanged_but_empty_sidecars(before, snapshot(tmp_path))


@pytest.mark.parametrize("content, words", NOT_A_STORE)
def test_a_file_that_is_not_a_store_is_one_line_and_left_as_it_was(tmp_path, content, words):
    path = tmp_path / "planner.db"
    write_not_a_store(path, content)
    before = snapshot(tmp_path)
    with pytest.raises(InputError) as exc:
        Store(path, read_only=True)
    message = str(exc.value)
    assert message.startswith(f"{path}: ") and words in message and "expected" in message
    assert "\n" not in message
    assert snapshot(tmp_path) == before   # byte for byte and mode: no chmod, no schema


def test_an_older_store_is_read_where_the_reads_work_and_never_migrated(tmp_path):
    path = tmp_path / "planner.db"
    store, refs = make_store(path, 1000)
    fill(store, refs, measurements(3, 10))
    store.submit_job("train", {"model": "gpt2-xl"})
    store.close()
    downgrade_to_schema_2(path)
    before = snapshot(tmp_path)
    with Store(path, read_only=True) as ro:
        assert [r.name for r in ro.job_records()] == ["train"]   # jobs read as they are
        with pytest.raises(StoreError) as exc:
            fleet_from_store(ro, 3)                               # sites are schema 3's
    message = str(exc.value)
    assert "schema version 2" in message and f"serve --db {path}" in message
    assert "\n" not in message
    unchanged_but_empty_sidecars(before, snapshot(tmp_path))
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as conn:
        assert conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone() \
            == ("2",)
    conn.close()
    with Store(path) as rw:   # a writing opening migrates it, as it always did
        assert rw.database.meta("schema_version") == "3"


def test_a_store_lacking_a_column_of_this_planner_names_the_command_that_migrates_it(tmp_path):
    path = tmp_path / "planner.db"
    with Store(path) as store:
        store.submit_job("train", {"model": "gpt2-xl"})
    with sqlite3.connect(path) as conn:
        conn.execute("ALTER TABLE jobs DROP COLUMN failures")
    conn.close()
    with Store(path, read_only=True) as ro:
        assert ro.database.behind == "no jobs.failures column"
        with pytest.raises(StoreError, match=r"no jobs.failures column.*serve --db"):
            ro.job_records()
    with Store(path) as rw:
        assert rw.job_records()[0].failures == 0


def test_a_read_only_opening_refuses_to_write(tmp_path):
    path = tmp_path / "planner.db"
    Store(path).close()
    with Store(path, read_only=True) as ro, pytest.raises(StoreError, match="read-only"):
        ro.submit_job("train", {"model": "gpt2-xl"})


def test_jobs_are_submitted_all_or_none_and_the_retry_works_once_there_is_room(tmp_path):
    path = tmp_path / "planner.db"
    jobs = [(f"job-{k:03}", {"model": "gpt2-xl", "command": ["python", "train.py", "x" * 400]})
            for k in range(200)]
    with Store(path) as store:
        store.submit_job("earlier", {"model": "gpt2-xl"})
        pages = store.conn.execute("PRAGMA page_count").fetchone()[0]
        # SQLite's own limit on the file's size: the same "database or disk is full" as a disk
        store.conn.execute(f"PRAGMA max_page_count = {pages + 4}")
        with pytest.raises(StoreError, match="full") as exc:
            store.submit_jobs(jobs)
        assert "\n" not in str(exc.value)
        assert [r.name for r in store.job_records()] == ["earlier"]
        store.conn.execute("PRAGMA max_page_count = 1073741823")
        assert [r.name for r in store.submit_jobs(jobs)] == [n for n, _ in jobs]
        # A name still active refuses the whole set: nothing of it is stored.
        with pytest.raises(InputError, match="job-199"):
            store.submit_jobs([("new", {"model": "gpt2-xl"}), ("job-199", {})])
        assert len(store.job_records()) == 201
