"""The commands that only read the store (`jobs list|show|logs`, `fleet show|export|plot`,
`plan --db`, `calibrate`, `jobs submit --plan-only`) open it read-only: a file that is not a store
is one line and exit 2 and stays byte for byte as it was; a store on a read-only mount (a
backup) can be read. `jobs submit` on a full disk stores nothing and its retry works.

The mounts need root; elsewhere those tests are skipped."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import sqlite3
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from hulk.wire.records import GpuInfo, Inventory, NodeLocation, RegisterRequest
from planner import cli
from planner.service.store import Store
from tests.helpers.site_rollups import NOT_A_STORE, write_not_a_store

A100 = GpuInfo("NVIDIA A100-SXM4-40GB", "", 8.0, 40 * 10**9)
JOBS = "jobs:\n  - {name: bert, model: bert-large, steps: 10, command: 'python train.py'}\n"


def run(capsys, *argv) -> tuple[int, str, str]:
    code = cli.main([str(a) for a in argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def snapshot(folder: Path) -> dict[str, tuple[bytes, int]]:
    return {p.name: (p.read_bytes(), p.stat().st_mode) for p in sorted(folder.iterdir())
            if p.is_file()}


@contextlib.contextmanager
def mounted(args: list[str], target: Path) -> Iterator[Path]:
    """``mount ARGS TARGET`` for the block; skips the test where mounting is not allowed."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting needs root")
    done = subprocess.run(["mount", *args, str(target)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount here: {done.stderr.strip()}")
    try:
        yield target
    finally:
        subprocess.run(["umount", "--lazy", str(target)], check=True)   # even if a file is open


@contextlib.contextmanager
def read_only_view(folder: Path) -> Iterator[Path]:
    """``folder`` through a read-only bind mount: even root cannot write there."""
    view = folder.parent / f"{folder.name}-ro"
    view.mkdir()
    with mounted(["--bind", str(folder)], view):
        subprocess.run(["mount", "-o", "remount,ro,bind", str(view)], check=True)
        with pytest.raises(OSError) as exc:
            (view / "probe").touch()
        assert exc.value.errno == errno.EROFS
        yield view


READ_COMMANDS = {
    "jobs list": lambda db, d: ["jobs", "list", "--db", db],
    "jobs show": lambda db, d: ["jobs", "show", "bert", "--db", db],
    "jobs logs": lambda db, d: ["jobs", "logs", "bert", "--db", db],
    "jobs submit --plan-only": lambda db, d: ["jobs", "submit", d / "jobs.yaml", "--plan-only",
                                              "--db", db],
    "fleet show": lambda db, d: ["fleet", "show", "--db", db],
    "fleet export": lambda db, d: ["fleet", "export", "--db", db, "--out", d / "fleet.json"],
    "fleet plot": lambda db, d: ["fleet", "plot", "--db", db, "--out", d / "fleet.png"],
    "plan --db": lambda db, d: ["plan", d / "jobs.yaml", "--db", db, "--no-compare"],
    "calibrate": lambda db, d: ["calibrate", "--db", db],
}


@pytest.mark.parametrize("command", READ_COMMANDS)
@pytest.mark.parametrize("content, words", NOT_A_STORE)
def test_a_file_that_is_not_a_store_is_one_line_exit_2_and_left_byte_for_byte(
        tmp_path, capsys, command, content, words):
    (tmp_path / "jobs.yaml").write_text(JOBS)
    db = tmp_path / "planner.sqlite"
    write_not_a_store(db, content)   # 0644: a read-only command must not make it 0600
    before = snapshot(tmp_path)
    code, out, err = run(capsys, *READ_COMMANDS[command](db, tmp_path))
    if content is None and command == "jobs submit --plan-only":   # checked without a store
        assert code == 0 and snapshot(tmp_path) == before, err
        return
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert str(db) in err and "expected the SQLite file" in err and words in err, err
    assert snapshot(tmp_path) == before


def make_store(folder: Path) -> Path:
    """Two registered nodes, a job; closed cleanly (nothing left in a -wal)."""
    folder.mkdir()
    db = folder / "planner.sqlite"
    with Store(db) as store:
        for node in ("n1", "n2"):
            store.register(RegisterRequest(node, hostname=node, address="127.0.0.1",
                                           location=NodeLocation("Beijing", None),
                                           inventory=Inventory(gpus=(A100,) * 2)))
        store.submit_job("bert", {"model": "bert-large", "steps": 10,
                                  "command": ["python", "train.py"]})
    assert sorted(p.name for p in folder.iterdir()) == ["planner.sqlite"]
    return db


@pytest.mark.process
@pytest.mark.root
def test_every_read_only_command_works_on_a_read_only_mount(tmp_path, capsys):
    (tmp_path / "jobs.yaml").write_text(JOBS)
    db = make_store(tmp_path / "store")
    with read_only_view(db.parent) as view:
        ro = view / db.name
        code, out, err = run(capsys, "jobs", "list", "--db", ro, "--json")
        assert code == 0 and [j["name"] for j in json.loads(out)["jobs"]] == ["bert"], err
        for command in ("jobs show", "jobs logs", "fleet show", "fleet export",
                        "jobs submit --plan-only"):
            code, out, err = run(capsys, *READ_COMMANDS[command](ro, tmp_path))
            assert code == 0, (command, err)
        assert [n["id"] for n in json.loads((tmp_path / "fleet.json").read_text())["nodes"]] \
            == ["n1", "n2"]
        code, out, err = run(capsys, *READ_COMMANDS["plan --db"](ro, tmp_path), "--method",
                             "system-b")
        assert code == 0, err
        code, out, err = run(capsys, "calibrate", "--db", ro)   # reads, finds nothing measured
        assert code == 2 and "no measured iterations" in err, err
        # A writing command says so in one line.
        code, out, err = run(capsys, "jobs", "cancel", "bert", "--db", ro)
        assert code == 1 and len(err.strip().splitlines()) == 1, err


@pytest.mark.process
@pytest.mark.root
def test_a_live_copy_with_its_wal_is_read_on_a_read_only_mount(tmp_path, capsys):
    db = make_store(tmp_path / "store")
    backup = tmp_path / "backup"
    backup.mkdir()
    with Store(db) as store:   # copied while open: the new job is only in the -wal
        store.submit_job("gpt", {"model": "gpt2-xl"})
        for suffix in ("", "-wal", "-shm"):
            shutil.copy(f"{db}{suffix}", backup / f"{db.name}{suffix}")
    assert (backup / f"{db.name}-wal").stat().st_size > 0
    lone = tmp_path / "lone"      # a -wal copied without its -shm
    lone.mkdir()
    for suffix in ("", "-wal"):
        shutil.copy(backup / f"{db.name}{suffix}", lone / f"{db.name}{suffix}")
    with read_only_view(backup) as view:
        code, out, err = run(capsys, "jobs", "list", "--db", view / db.name, "--json")
        assert code == 0 and [j["name"] for j in json.loads(out)["jobs"]] == ["bert", "gpt"], err
    with read_only_view(lone) as view:
        code, out, err = run(capsys, "jobs", "list", "--db", view / db.name, "--json")
        assert code == 1 and len(err.strip().splitlines()) == 1 and "-shm" in err, err


def test_an_older_store_read_only_names_the_command_that_migrates_it(tmp_path, capsys):
    (tmp_path / "jobs.yaml").write_text(JOBS)
    db = make_store(tmp_path / "store")
    with sqlite3.connect(db) as conn:
        conn.executescript("""DROP TABLE site_rollups; DROP TABLE sites;
            ALTER TABLE nodes DROP COLUMN site_idx;
            UPDATE meta SET value = '2' WHERE key = 'schema_version';""")
    conn.close()
    before = snapshot(db.parent)
    for command in ("jobs list", "fleet show", "plan --db"):   # each reads the nodes' sites
        code, out, err = run(capsys, *READ_COMMANDS[command](db, tmp_path))
        assert code == 1 and len(err.strip().splitlines()) == 1, err
        assert "schema version 2" in err and f"serve --db {db}" in err
    after = snapshot(db.parent)
    assert {n: after[n] for n in before} == before    # not migrated: byte for byte


@pytest.mark.process
@pytest.mark.root
def test_jobs_submit_on_a_full_disk_stores_nothing_and_the_retry_works(tmp_path, capsys):
    disk = tmp_path / "disk"
    disk.mkdir()
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text("jobs:\n" + "".join(
        f"  - {{name: job-{k:03}, model: bert-large, steps: 10, command: 'python train.py "
        f"--run {k} {'x' * 200}'}}\n" for k in range(200)))
    with mounted(["-t", "tmpfs", "-o", "size=1m", "tmpfs"], disk):
        db = disk / "planner.sqlite"
        Store(db).close()
        filler = disk / "filler"
        fd = os.open(filler, os.O_WRONLY | os.O_CREAT)
        try:
            with pytest.raises(OSError) as full:
                while True:
                    os.write(fd, b"\0" * 4096)
        finally:
            os.close(fd)
        assert full.value.errno == errno.ENOSPC
        with open(filler, "r+b") as f:   # room for a few jobs' pages, not for 200
            f.truncate(filler.stat().st_size - 96 * 1024)
        code, out, err = run(capsys, "jobs", "submit", jobs, "--db", db)
        assert code == 1 and len(err.strip().splitlines()) == 1 and "full" in err, err
        filler.unlink()
        code, out, err = run(capsys, "jobs", "list", "--db", db, "--json")
        assert code == 0 and json.loads(out)["jobs"] == [], "a part of the file was stored"
        code, out, err = run(capsys, "jobs", "submit", jobs, "--db", db)
        assert code == 0 and "queued 200 jobs" in out, err
