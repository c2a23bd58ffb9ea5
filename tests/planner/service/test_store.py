"""The SQLite store on a real file: idempotent batches, incremental rollups equal to the pure
rollup maths, pruning, the fleet graph built from it, and errors as StoreError."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import numpy as np
import pytest

from hulk.errors import NotFoundError, StoreError
from hulk.wire.records import (GpuInfo, Inventory, LaunchState, LaunchStatus, NodeLocation, Peer,
                               RegisterRequest)
from planner.core.lifecycle import RankState
from planner.core.rollup import DailyRollup, bucket_index
from planner.service.graph import fleet_from_store, store_graph
from planner.service.store import DAY_MS, Store
from tests.helpers.clock import ManualClock


T0 = 1_700_000_000_000 - 1_700_000_000_000 % DAY_MS + 3_600_000  # 01:00 UTC on some day


def rows(src, dst, values, sent):
    return [(src.idx, dst.idx, sent + k, 1, 56, int(v is None), v,
             None if v is None else bucket_index(v)) for k, v in enumerate(values)]


def test_incremental_rollups_equal_pure_maths(tmp_path: Path):
    clock = ManualClock(T0)
    store = Store(tmp_path / "s.db", clock=clock)
    a100 = GpuInfo("NVIDIA A100-SXM4-40GB", "u1", 8.0, 40 * 10**9)
    a, _ = store.register(RegisterRequest("a", location=NodeLocation(" Paris "),
                                          inventory=Inventory(gpus=(a100,) * 2)))
    b, _ = store.register(RegisterRequest("b", location=NodeLocation("Rome", (41.9, 12.5))))
    assert (a.city, a.latitude, b.city, b.latitude) == ("Paris", None, "Rome", 41.9)
    rng = np.random.default_rng(3)
    expected: dict[int, DailyRollup] = {}
    for k in range(12):  # batches over three days, some arriving late, rolled up in between
        day = k % 3
        values = [None if rng.random() < 0.05 else float(v)
                  for v in rng.uniform(15, 40, int(rng.integers(5, 60)))]
        store.store_batch(a, f"batch-{k}", rows(a, b, values, T0 - day * DAY_MS))
        expected.setdefault(day, DailyRollup())
        for v in values:
            expected[day].add(v, lost=v is None)
        if k % 4 == 3:
            store.rollup_pending()
    # A retried batch changes nothing.
    assert store.store_batch(a, "batch-0", rows(a, b, [99.0], T0))[2] is True
    daily = store.daily_rollups("a", "b")
    today = T0 // DAY_MS
    assert sorted(daily) == [today - 2, today - 1, today]
    for day, want in expected.items():
        got = daily[today - day]
        assert (got.count, got.lost, got.buckets) == (want.count, want.lost, want.buckets)
        assert got.sum == pytest.approx(want.sum) and got.sumsq == pytest.approx(want.sumsq)
        # min and max are kept to the microsecond (schema 2: 3-4 bytes instead of 8)
        assert got.min == pytest.approx(want.min, abs=5e-4) and got.max == pytest.approx(
            want.max, abs=5e-4)
    window = {(p.src, p.dst): p.rollup for p in store.window_rollups(2)}[("a", "b")]
    two_days = DailyRollup().merge(expected[0]).merge(expected[1])
    assert window.count == two_days.count and window.buckets == two_days.buckets
    assert window.stats().mean_ms == pytest.approx(two_days.stats().mean_ms)

    fleet = fleet_from_store(store, 90)
    node = {n.id: n for n in fleet.nodes}
    assert node["a"].gpus == 2 and node["a"].memory_gb == 80 and node["b"].gpus == 0
    graph = store_graph(store, 90)
    edge = graph.edges["a", "b"]
    assert not edge["imputed"] and edge["p50_ms"] is not None and edge["jitter_ms"] > 0
    assert graph.nodes["a"]["throughput"] == pytest.approx(2 * 312e12 * 0.4)

    # Prune: raw samples leave after raw_days (their rollups stay), rollups after 90 days.
    assert store.sample_count() > 0
    clock.now = T0 + 8 * DAY_MS
    result = store.prune()
    assert store.sample_count() == 0 and result["samples"] > 0
    assert store.daily_rollups("a", "b")[today].count == expected[0].count
    clock.now = T0 + 95 * DAY_MS
    store.prune()
    assert store.daily_rollups("a", "b") == {}
    store.close()


def test_heartbeat_unknown_node_and_launch_state(tmp_path: Path):
    with Store(tmp_path / "s.db") as store:
        with pytest.raises(NotFoundError):
            store.heartbeat("ghost")
        store.register(RegisterRequest("a", address="10.0.0.1"))
        assert store.heartbeat("a") is False
        store.register(RegisterRequest("b", address="10.0.0.2", probe_port=7))
        assert store.heartbeat("a") is True  # b joined after a registered
        assert store.peers("a") == (Peer("b", "10.0.0.2", 7),)
        running = LaunchStatus(LaunchState.RUNNING, plan_id="p1", job="gpt", changed_at_ms=5)
        store.heartbeat("a", launch=running)
        store.heartbeat("a", launch=LaunchStatus(LaunchState.UNSPECIFIED))  # keeps the last one
        row = {r["id"]: r for r in store.nodes()}["a"]
        assert (row["launch_state"], row["launch_plan_id"], row["launch_job"],
                row["launch_changed_ms"]) == ("running", "p1", "gpt", 5)
        records = {r.id: r for r in store.node_records()}
        assert records["a"].launch == RankState("running", job="gpt", plan_id="p1")
        assert records["b"].launch is None and records["b"].address == "10.0.0.2"
        assert records["a"].monitored and records["a"].last_seen_ms == row["last_seen_ms"]


def test_the_store_is_composed_of_parts_built_on_one_database(tmp_path: Path):
    """Each part is given the database and clock it uses; the Store offers their methods."""
    clock = ManualClock(T0)
    with Store(tmp_path / "s.db", clock=clock, per_pair_up_to=3) as store:
        assert store.database.per_pair_up_to == 3
        for part in (store.node_rows, store.jobs, store.rollups):
            assert part.database is store.database and part.clock is clock
        job = store.submit_job("a", {"model": "gpt2-xl"})
        assert store.jobs.job_record(job.id).submitted_ms == T0


def test_sqlite_errors_become_store_errors(tmp_path: Path):
    path = tmp_path / "s.db"
    with Store(path) as store:
        store.register(RegisterRequest("a"))
    # Another writer holds the lock past the busy timeout: "database is locked".
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        with pytest.raises(StoreError, match="s.db: store failed during"):
            Store(path, busy_timeout_s=0.1)
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    with Store(path, busy_timeout_s=0.1) as store:
        a = store.node_refs()["a"]
        holder = sqlite3.connect(path, isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")
        try:
            with pytest.raises(StoreError, match="store failed during store batch"):
                store.store_batch(a, "x", [(a.idx, a.idx, 1, 1, 56, 0, 1.0, 10)])
        finally:
            holder.execute("ROLLBACK")
            holder.close()
        assert store.sample_count() == 0
    (tmp_path / "junk.db").write_bytes(b"this is not a database" * 100)
    with pytest.raises(StoreError, match="junk.db"):
        Store(tmp_path / "junk.db")


def test_the_store_file_is_private_even_when_it_existed_with_a_loose_mode(tmp_path):
    import stat

    from planner.security.credentials import CredentialStore

    fresh = tmp_path / "fresh.sqlite"
    with Store(fresh):
        pass
    assert stat.S_IMODE(fresh.stat().st_mode) == 0o600
    loose = tmp_path / "loose.sqlite"
    loose.touch(mode=0o644)
    loose.chmod(0o644)
    CredentialStore(loose).close()                # `hulk-planner enroll` opens it first
    assert stat.S_IMODE(loose.stat().st_mode) == 0o600
