"""A small real store with nodes in Paris, Rome and Tokyo, filled with raw samples or per-round
summaries: shared by the site-rollup and read-only store tests."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from hulk.wire import histogram
from hulk.wire.records import NodeLocation, RegisterRequest
from planner.core.rollup import DailyRollup, bucket_index
from planner.service.store import DAY_MS, Store

T0 = 20_000 * DAY_MS + 3_600_000
NODES = [("par-1", "Paris"), ("par-2", "Paris"), ("rom-1", "Rome"), ("rom-2", "Rome"),
         ("tok-1", "Tokyo"), ("nowhere", "")]
SITE_OF = {"par-1": "Paris", "par-2": "Paris", "rom-1": "Rome", "rom-2": "Rome",
           "tok-1": "Tokyo", "nowhere": None}


def make_store(path, per_pair_up_to: int) -> tuple[Store, dict]:
    store = Store(path, clock=lambda: T0 + 2 * DAY_MS, per_pair_up_to=per_pair_up_to)
    refs = {}
    for node_id, city in NODES:
        refs[node_id], _ = store.register(RegisterRequest(node_id, location=NodeLocation(city)))
    return store, refs


def fill(store: Store, refs: dict, batch: list) -> None:
    """Store each measurement as raw samples (summary False) or one per-round summary."""
    for k, (i, j, day, summary, values) in enumerate(batch):
        a, b = refs[NODES[i][0]], refs[NODES[j][0]]
        t = T0 + day * DAY_MS + k
        if summary:
            r = DailyRollup.from_values(values)
            received = r.count > r.lost
            row = (a.idx, b.idx, t, 1, r.count, r.lost, r.sum, r.sumsq,
                   round(r.min * 1000) if received else None,
                   round(r.max * 1000) if received else None,
                   histogram.encode(r.buckets) if r.buckets else None)
            store.store_batch(a, f"b{k}", [], None, 0, [row])
        else:
            rows = [(a.idx, b.idx, t + n, 1, 56, int(v is None), v,
                     None if v is None else bucket_index(v)) for n, v in enumerate(values)]
            store.store_batch(a, f"b{k}", rows)


def assert_same_rollup(got: DailyRollup, want: DailyRollup) -> None:
    assert (got.count, got.lost, got.buckets) == (want.count, want.lost, want.buckets)
    assert got.sum == pytest.approx(want.sum, rel=1e-9, abs=1e-9)
    assert got.sumsq == pytest.approx(want.sumsq, rel=1e-9, abs=1e-9)
    # min and max are kept in whole microseconds by both
    assert (got.min, got.max) == (want.min, want.max)


def downgrade_to_schema_2(path: Path) -> None:
    with sqlite3.connect(path) as conn:
        conn.executescript("""
            DROP TABLE site_rollups; DROP TABLE sites;
            ALTER TABLE nodes DROP COLUMN site_idx;
            UPDATE meta SET value = '2' WHERE key = 'schema_version';""")
    conn.close()


NOT_A_STORE = [(None, "no such store"), (b"", "an empty file"),
               (b"hello\n", "not an SQLite file"), ("foreign", "without the planner's tables")]


def write_not_a_store(path: Path, content: bytes | str | None) -> None:
    """Leave at ``path`` what a read-only opening must refuse: nothing (None), bytes, or another
    program's SQLite file ("foreign"); readable by all, so a changed mode shows."""
    if content == "foreign":
        with sqlite3.connect(path) as conn:
            conn.execute("CREATE TABLE notes (text)")
        conn.close()
    elif content is not None:
        path.write_bytes(content)
    if path.exists():
        path.chmod(0o644)
