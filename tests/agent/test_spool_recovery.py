"""The running agent's spool (agent/spool_store.py) when its file or directory fails, on real
SQLite files: a file SQLite cannot use is moved aside and a fresh spool started; a state
directory that is full or read-only keeps records in memory (bounded) until the file works
again; a file deleted or replaced while the agent runs is noticed and a fresh one started."""

from __future__ import annotations

import logging
import os
import sqlite3
from pathlib import Path

import pytest
from prometheus_client import generate_latest

from agent.metrics import AgentMetrics
from agent.spool import Spool, SpoolCorruptError
from agent.spool_store import KEEP_ASIDE, MemorySpool, SpoolStore
from hulk.errors import StoreError
from hulk.wire.records import ProbeKind, ProbeSample
from tests.helpers.mounts import tmpfs_mounts

T0 = 1_700_000_000_000


def samples(n: int, start: int = 0) -> list[ProbeSample]:
    return [ProbeSample(peer_id=f"peer-{i % 7}", sent_at_ms=T0 + i, kind=ProbeKind.ICMP,
                        payload_bytes=56, lost=False, rtt_ms=1.5, timeout_ms=2000.0)
            for i in range(start, start + n)]


def sent_at(spool, limit: int = 100_000) -> list[int]:
    """Every record's offset from T0, in order, through a batch that is then acknowledged."""
    batch = spool.take_batch(limit)
    if batch is None:
        return []
    spool.ack(batch.batch_id)
    return [s.sent_at_ms - T0 for s in batch.samples]


def real_spool(path: Path, n: int) -> None:
    spool = Spool(path, 1_000_000)
    spool.append(samples(n))
    spool.close()


def garbage(path: Path) -> None:
    path.write_bytes(b"not an SQLite database at all\n" * 100)


def truncated(path: Path) -> None:
    real_spool(path, 20_000)
    size = path.stat().st_size
    with open(path, "r+b") as f:
        f.truncate(size // 2)


def malformed(path: Path) -> None:
    """A real spool with pages in its middle overwritten: 'database disk image is malformed'."""
    real_spool(path, 20_000)
    with open(path, "r+b") as f:
        f.seek(path.stat().st_size // 2)
        f.write(b"\xa5" * 16384)


def other_schema(path: Path) -> None:
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE samples (x INTEGER, y TEXT)")
        db.execute("INSERT INTO samples VALUES (1, 'not ours')")
    db.close()


def directory(path: Path) -> None:
    path.mkdir()
    (path / "something").write_text("someone's file")


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def messages(caplog, level: int) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == level]


def aside_files(state: Path) -> list[Path]:
    return sorted(p for p in state.iterdir() if p.name.startswith("spool.sqlite.corrupt-")
                  and not p.name.endswith(("-wal", "-shm")))


@pytest.mark.parametrize("spoil", [garbage, truncated, malformed, other_schema, directory])
def test_an_unusable_spool_file_is_moved_aside_and_a_fresh_one_started(tmp_path, caplog, spoil):
    path = tmp_path / "spool.sqlite"
    spoil(path)
    with pytest.raises(StoreError):   # what the agent used to exit 1 for
        Spool(path, 1000)
    kept = path.read_bytes() if path.is_file() else None
    caplog.set_level(logging.INFO)
    store = SpoolStore(path, 1000)
    try:
        assert not store.in_memory and store.restarts == {"corrupt": 1, "deleted": 0}
        store.append(samples(10))
        assert sent_at(store) == list(range(10))     # the fresh spool works
    finally:
        store.close()
    [aside] = aside_files(tmp_path)
    if kept is not None:
        assert aside.read_bytes() == kept           # moved, not rewritten
    else:
        assert (aside / "something").read_text() == "someone's file"
    [error] = messages(caplog, logging.ERROR)
    assert str(path) in error and str(aside) in error and "lost" in error
    with sqlite3.connect(path) as db:               # a fresh spool at the path
        assert db.execute("SELECT count(*) FROM samples").fetchone()[0] == 0
    db.close()


def test_a_usable_spool_keeps_its_records(tmp_path, caplog):
    path = tmp_path / "spool.sqlite"
    real_spool(path, 50)
    caplog.set_level(logging.WARNING)
    store = SpoolStore(path, 1000)
    try:
        assert sent_at(store) == list(range(50)) and store.restarts["corrupt"] == 0
    finally:
        store.close()
    assert aside_files(tmp_path) == [] and messages(caplog, logging.ERROR) == []


def test_only_the_newest_corrupt_files_are_kept(tmp_path):
    path = tmp_path / "spool.sqlite"
    for round_ in range(KEEP_ASIDE + 3):
        path.write_bytes(f"garbage {round_}\n".encode() * 50)
        SpoolStore(path, 1000).close()
    kept = aside_files(tmp_path)
    assert len(kept) == KEEP_ASIDE
    assert {p.read_bytes().split(b"\n")[0] for p in kept} == \
        {f"garbage {r}".encode() for r in range(3, KEEP_ASIDE + 3)}    # the newest


@pytest.mark.parametrize("removed", [("",), ("", "-wal", "-shm")])   # its log left, or not
def test_a_spool_deleted_between_two_writes_is_noticed_and_started_afresh(tmp_path, caplog,
                                                                         removed):
    path = tmp_path / "spool.sqlite"
    caplog.set_level(logging.INFO)
    store = SpoolStore(path, 1000)
    try:
        store.append(samples(10))
        for side in removed:
            Path(f"{path}{side}").unlink()
        store.append(samples(5, start=10))
        assert path.is_file() and store.restarts == {"corrupt": 0, "deleted": 1}
        store.append(samples(5, start=15))
        assert sent_at(store) == list(range(10, 20))
        assert store.dropped == 10                  # only the deleted file had them
    finally:
        store.close()
    [error] = messages(caplog, logging.ERROR)       # once, not at every write
    assert str(path) in error and "deleted" in error and "10 samples" in error
    reopened = Spool(path, 1000)                    # the new file holds the count
    try:
        assert reopened.dropped == 10 and reopened.depth == 0
    finally:
        reopened.close()


def test_a_spool_replaced_by_garbage_while_running_is_moved_aside(tmp_path, caplog):
    path = tmp_path / "spool.sqlite"
    store = SpoolStore(path, 1000)
    try:
        store.append(samples(3))
        replacement = tmp_path / "other"
        garbage(replacement)
        os.replace(replacement, path)
        store.append(samples(4, start=3))
        assert sent_at(store) == [3, 4, 5, 6]          # nothing of the old file comes back
        assert store.restarts == {"corrupt": 1, "deleted": 1}
    finally:
        store.close()
    [aside] = aside_files(tmp_path)
    assert aside.read_bytes().startswith(b"not an SQLite database")


def test_a_spool_found_malformed_while_running_is_moved_aside(tmp_path, monkeypatch, caplog):
    path = tmp_path / "spool.sqlite"
    store = SpoolStore(path, 1000)
    try:
        store.append(samples(5))
        store.hold(samples(2, start=5))
        found = []

        def malformed(self, max_samples, take=Spool.take_batch):   # as SQLite reports it
            if self.path == path and not found:
                found.append(self)
                raise SpoolCorruptError(f"{path}: spool take_batch failed: database disk image "
                                        "is malformed")
            return take(self, max_samples)

        monkeypatch.setattr(Spool, "take_batch", malformed)
        assert store.take_batch(100) is None         # a fresh spool: nothing on disk yet
        store.save()
        assert sent_at(store) == [5, 6]              # what memory held carried over
        assert store.dropped == 5 and store.restarts == {"corrupt": 1, "deleted": 0}
    finally:
        store.close()
    [aside] = aside_files(tmp_path)
    [error] = messages(caplog, logging.ERROR)
    assert "malformed" in error and str(aside) in error and "5 samples" in error


def test_a_file_that_fails_to_write_keeps_its_records_for_when_it_works_again(
        tmp_path, monkeypatch, caplog):
    path = tmp_path / "spool.sqlite"
    clock = Clock()
    store = SpoolStore(path, 1000, memory_max=10, retry_s=60, monotonic=clock)
    try:
        store.append(samples(12))                        # 2 dropped past the memory bound
        assert store.dropped == 2

        def fails(self, chunk, insert=Spool._insert):   # the file's writes, not memory's
            if isinstance(self, MemorySpool):
                return insert(self, chunk)
            raise StoreError(f"{self.path}: spool append failed: disk I/O error")

        with monkeypatch.context() as patch:
            patch.setattr(Spool, "_insert", fails)
            store.append(samples(3, start=100))
            assert store.in_memory and store.depth == 3 and store.dropped == 2
            clock.now += 61
            store.append(samples(1, start=103))         # still failing: stays in memory
            assert store.in_memory and store.depth == 4
        clock.now += 61
        store.save()
        assert not store.in_memory and store.dropped == 2    # counted once
        assert sent_at(store) == [*range(2, 12), 100, 101, 102, 103]
    finally:
        store.close()
    assert len(messages(caplog, logging.ERROR)) == 1


def test_the_metrics_say_in_memory_and_count_restarts(tmp_path):
    path = tmp_path / "spool.sqlite"
    garbage(path)
    store = SpoolStore(path, 1000)

    class Runtime:
        spool = store
        registration = None

    metrics = AgentMetrics("n1")
    metrics.watch(Runtime())
    try:
        text = generate_latest(metrics.registry).decode()
    finally:
        store.close()
    assert 'hulk_agent_spool_restarts_total{reason="corrupt"} 1.0' in text
    assert 'hulk_agent_spool_restarts_total{reason="deleted"} 0.0' in text
    assert "hulk_agent_spool_in_memory 0.0" in text


# ---------------------------------------------------------------- full or read-only state dirs

@pytest.fixture
def tmpfs(tmp_path: Path):
    """mount(size) -> a fresh tmpfs; remount(where, 'ro' or 'rw'); all unmounted afterwards."""
    with tmpfs_mounts(tmp_path) as mounts:
        yield mounts.mount, mounts.remount


def fill(directory: Path) -> Path:
    """Another program takes every free byte."""
    filler = directory / "filler"
    with open(filler, "wb", buffering=0) as out:
        try:
            while out.write(b"x" * 4096):
                pass
        except OSError:
            pass
    return filler


@pytest.mark.root
@pytest.mark.process
def test_a_full_state_dir_at_start_keeps_records_in_memory_until_the_disk_has_room(
        tmpfs, caplog):
    mount, _ = tmpfs
    where = mount("1m")
    filler = fill(where)
    caplog.set_level(logging.INFO)
    clock = Clock()
    store = SpoolStore(where / "spool.sqlite", 1000, memory_max=100, retry_s=60,
                       monotonic=clock)
    try:
        assert store.in_memory and store.max_samples == 100
        store.append(samples(30))
        assert sent_at(store) == list(range(30))        # reports go on from memory
        store.append(samples(150, start=30))            # bounded as memory is: oldest dropped
        assert store.depth == 100 and store.dropped == 50
        clock.now += 30
        filler.unlink()
        store.save()
        assert store.in_memory                          # not tried again yet
        clock.now += 31
        store.save()
        assert not store.in_memory and store.depth == 100
    finally:
        store.close()
    [error] = messages(caplog, logging.ERROR)
    assert "spool.sqlite" in error and "in memory" in error and "full" in error
    assert any("usable again" in m for m in messages(caplog, logging.WARNING))
    on_disk = Spool(where / "spool.sqlite", 1000)
    try:
        assert sent_at(on_disk) == list(range(80, 180)) and on_disk.dropped == 50
    finally:
        on_disk.close()


@pytest.mark.root
@pytest.mark.process
def test_a_read_only_state_dir_keeps_records_in_memory_and_its_spool_for_later(tmpfs, caplog):
    mount, remount = tmpfs
    where = mount("1m")
    real_spool(where / "spool.sqlite", 5)           # what an earlier run left unsent
    remount(where, "ro")
    caplog.set_level(logging.INFO)
    clock = Clock()
    store = SpoolStore(where / "spool.sqlite", 1000, retry_s=60, monotonic=clock)
    try:
        assert store.in_memory
        store.append(samples(3, start=100))
        clock.now += 61
        store.save()                                    # still read-only: stays in memory
        assert store.in_memory and store.depth == 3
        remount(where, "rw")
        clock.now += 61
        store.save()
        assert not store.in_memory
        assert sent_at(store) == [0, 1, 2, 3, 4, 100, 101, 102]    # nothing lost, in order
    finally:
        store.close()
    [error] = messages(caplog, logging.ERROR)           # once, not at every try
    assert "spool.sqlite" in error and "in memory" in error
    assert aside_files(where) == []                     # a read-only spool is not corrupt
