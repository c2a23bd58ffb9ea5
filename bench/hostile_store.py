"""The hostile round's store class: `hulk-planner` commands and `serve` on stores that are not
what they claim, cannot be written, are locked by another writer, or sit on a full disk.

A probe is held when the program ends within its limit (the store's 30 s busy timeout plus a
margin for a locked store) with one clear line naming the store (exit 2, or exit 1 for a store
that cannot be written: a full disk, docs/JOBS.md), no traceback and no "internal error"; a
command that only reads may also succeed. Nothing stored may be lost: a refused file is left
byte for byte as it was, and a real store keeps every row it held (its jobs, nodes and links,
compared before and after) and passes `PRAGMA integrity_check`.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bench.hostile_common import FLEET, ROOT, Outcome, digest, refused_cleanly, run_cli
from bench.planner_process import free_port

WHERE = "planner/service/database.py (Store.__init__), planner/commands/"
LOCK_S = 45.0                     # how long the other writer holds its lock
BUSY_LIMIT_S = 40.0               # the store's 30 s busy timeout and a margin
JOB = 'jobs:\n  - name: {name}\n    model: gpt2-xl\n    command: "python train.py"\n'


def commands(tmp: Path) -> dict[str, Callable[[Path], list[str]]]:
    job = tmp / "job.yaml"
    job.write_text(JOB.format(name=f"hostile-{os.getpid()}"))
    return {"fleet show": lambda db: ["fleet", "show", "--db", str(db)],
            "jobs list": lambda db: ["jobs", "list", "--db", str(db)],
            "jobs submit": lambda db: ["jobs", "submit", str(job), "--db", str(db)],
            "fleet import": lambda db: ["fleet", "import", str(FLEET), "--db", str(db)],
            "serve": lambda db: ["serve", "--db", str(db), "--listen",
                                 f"127.0.0.1:{free_port()}", "--insecure"]}


READERS = ("fleet show", "jobs list")


def rows(db: Path) -> dict | None:
    """What a real store holds (jobs, nodes, links, credentials), or None when it cannot be read.
    Read through a normal connection (a WAL store opened read-only needs its -shm file), or as
    immutable where the file system is read-only."""
    for uri in (f"file:{db}", f"file:{db}?immutable=1"):
        try:
            conn = sqlite3.connect(uri, uri=True, timeout=5)
            try:
                names = {r[0] for r in conn.execute(
                    "SELECT name FROM sqlite_master WHERE type = 'table'")}
                out = {t: sorted(map(repr, conn.execute(f"SELECT {key} FROM {t}").fetchall()))
                       if t in names else [] for t, key in TABLES.items()}
                out["integrity"] = conn.execute("PRAGMA integrity_check").fetchone()[0]
                return out
            finally:
                conn.close()
        except sqlite3.Error:
            continue
    return None


# What must never be lost, by its key (an import may update a row's other columns).
TABLES = {"jobs": "id, name, spec_json", "nodes": "idx, id", "imported_links": "src, dst",
          "hulk_credentials": "token_id, node_id"}
SQL_WORDS = ("no such column", "no such table", "syntax error")


def make_real(db: Path, tmp: Path) -> None:
    job = tmp / "first.yaml"
    job.write_text(JOB.format(name="kept-job"))
    for args in (["fleet", "import", str(FLEET), "--db", str(db)],
                 ["jobs", "submit", str(job), "--db", str(db)]):
        code, out, _ = run_cli(args)
        if code != 0:
            raise RuntimeError(f"could not make a store: {out[-300:]}")


def judge(name: str, command: str, db: Path, code, out: str, secs: float, before: str,
          before_rows: dict | None, codes=(2,), names: str | None = None,
          accept: bool = False) -> Outcome:
    """``accept``: success (a serve that starts) holds too, where nothing stored is lost."""
    may = accept or command in READERS
    if command == "serve" and code is None:
        held, detail = may, "serve started on the store" + ("" if may else " (ran to the limit)")
    else:
        held, detail = refused_cleanly(code, out, names or db.name, codes=codes, may_accept=may)
    if held and any(w in detail for w in SQL_WORDS):
        held, detail = False, f"SQLite's own words, not what was expected: {detail}"
    if before_rows is not None:
        after = rows(db)
        lost = [t for t in TABLES if after is None or not set(before_rows[t]) <= set(after[t])]
        if lost:
            held, detail = False, f"rows lost from {lost}; {detail}"
        elif after["integrity"] != "ok":
            held, detail = False, f"integrity_check: {after['integrity']}; {detail}"
    elif code not in (0, None) and digest(db) != before:
        held, detail = False, f"the refused file was changed (written into); {detail}"
    return Outcome(f"{name} ({command})", held, code, secs, detail,
                   expected=f"exit {'/'.join(map(str, codes))} naming the store"
                            + (" (or success, nothing lost)" if may else ""),
                   where="" if held else WHERE)


def cli(args: list[str], accept: bool) -> tuple:
    """A command; serve given 6 s where starting is acceptable (it runs until stopped)."""
    return run_cli(args, limit_s=6 if accept and args[0] == "serve" else 20)


def _foreign(path: Path) -> None:
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE nodes (x TEXT)")
    db.execute("INSERT INTO nodes VALUES ('hostile')")
    db.commit()
    db.close()


def bad_files(tmp: Path) -> Iterator[Outcome]:
    """Files that are no store of Hulk's: every command refuses them, leaving them as they were."""
    cases: dict[str, Callable[[Path], None]] = {
        "not sqlite": lambda p: p.write_bytes(b"this is not a database\n" * 100),
        "truncated header": lambda p: p.write_bytes(b"SQLite format 3\x00" + b"\x00" * 50),
        "foreign schema": _foreign,
        "a directory": lambda p: p.mkdir(),
        "empty file": lambda p: p.write_bytes(b""),
    }
    cmds = commands(tmp)
    for name, make in cases.items():
        for command, args in cmds.items():
            path = tmp / f"{name.replace(' ', '-')}-{command.replace(' ', '-')}.sqlite"
            make(path)
            before = digest(path)
            # An empty file is an empty SQLite database: a writer may make it a new store.
            accept = name == "empty file" and command not in READERS
            code, out, secs = cli(args(path), accept)
            yield judge(f"store {name}", command, path, code, out, secs, before, None,
                        codes=(2,) if command in READERS else (1, 2), accept=accept)


def corrupted(tmp: Path) -> Iterator[Outcome]:
    """A real store (a fleet, a job), damaged: truncated, a page overwritten, its header broken."""
    real = tmp / "real.sqlite"
    make_real(real, tmp)
    real_rows = rows(real)
    size = real.stat().st_size

    def truncate(p: Path) -> None:
        with p.open("r+b") as f:
            f.truncate(size // 2)

    def page(p: Path) -> None:
        with p.open("r+b") as f:
            f.seek(4096 * 3)
            f.write(os.urandom(4096))

    def header(p: Path) -> None:
        with p.open("r+b") as f:
            f.seek(16)
            f.write(b"\xff" * 16)

    def wal(p: Path) -> None:
        Path(f"{p}-wal").write_bytes(b"\x37\x7f\x06\x82" + os.urandom(8000))

    cmds = commands(tmp)
    for name, damage in (("truncated to half", truncate), ("a page of random bytes", page),
                         ("its header overwritten", header), ("a WAL file of garbage", wal)):
        for command, args in cmds.items():
            path = tmp / f"damaged-{name[:6].strip()}-{command.replace(' ', '-')}.sqlite"
            shutil.copy(real, path)
            damage(path)
            before = digest(path)
            # SQLite ignores a WAL whose header is wrong: the store is whole, writers may write.
            accept = damage is wal
            code, out, secs = cli(args(path), accept)
            yield judge(f"store {name}", command, path, code, out, secs, before,
                        real_rows if accept else None, codes=(1, 2), accept=accept)


def read_only(tmp: Path) -> Iterator[Outcome]:
    """A real store on a file system mounted read-only (root ignores file modes)."""
    mnt = tmp / "ro"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(mnt)]).returncode:
        yield Outcome("store read-only: mount", False, None, 0.0, "cannot mount a tmpfs (root?)")
        return
    try:
        db = mnt / "planner.sqlite"
        make_real(db, tmp)
        before = rows(db)
        subprocess.run(["mount", "-o", "remount,ro", str(mnt)], check=True)
        for command, args in commands(tmp).items():
            code, out, secs = run_cli(args(db), limit_s=20)
            yield judge("store read-only", command, db, code, out, secs, "", before, codes=(1, 2))
    finally:
        subprocess.run(["umount", "-l", str(mnt)])


def locked(tmp: Path) -> Iterator[Outcome]:
    """Another writer holds the store's write lock (BEGIN EXCLUSIVE) for LOCK_S; every command
    runs meanwhile, at once."""
    db = tmp / "locked.sqlite"
    make_real(db, tmp)
    before = rows(db)
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sqlite3, sys, time\n"
        f"c = sqlite3.connect({str(db)!r}, isolation_level=None)\n"
        "c.execute('BEGIN EXCLUSIVE')\n"
        "c.execute(\"INSERT INTO meta VALUES ('hostile-lock', 'held')\")\n"
        "print('locked', flush=True)\n"
        f"time.sleep({LOCK_S})\n"
        "c.execute('ROLLBACK')\n")], stdout=subprocess.PIPE, text=True)
    holder.stdout.readline()
    try:
        with ThreadPoolExecutor(5) as pool:
            runs = {c: pool.submit(run_cli, a(db), BUSY_LIMIT_S) for c, a in commands(tmp).items()}
            results = {c: f.result() for c, f in runs.items()}
    finally:
        holder.wait(LOCK_S + 10)
    for command, (code, out, secs) in results.items():
        if command == "serve" and code is None:   # it waited for the lock: did it start after?
            out += "\nserve was still running at the limit"
        yield judge("store locked by another writer", command, db, code, out, secs, "", before,
                    codes=(1, 2))


def full_disk(tmp: Path) -> Iterator[Outcome]:
    """A real store on a 4 MiB tmpfs filled to the last byte: writers fail in one line (exit 1,
    docs/JOBS.md), and once space is freed the store holds all it held."""
    mnt = tmp / "full"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mnt)]).returncode:
        yield Outcome("store on a full disk: mount", False, None, 0.0, "cannot mount a tmpfs")
        return
    try:
        db = mnt / "planner.sqlite"
        make_real(db, tmp)
        before = rows(db)
        filler = mnt / "filler"
        fd = os.open(filler, os.O_WRONLY | os.O_CREAT)
        try:
            for size in (65536, 512, 1):       # to the last byte
                try:
                    while True:
                        os.write(fd, b"\0" * size)
                except OSError:
                    pass
        finally:
            os.close(fd)
        cmds = commands(tmp)
        cmds["fleet import"] = lambda d: ["fleet", "import", str(ROOT / "examples" / "fleets"
                                                                 / "world-48.json"), "--db", str(d)]
        for command, args in cmds.items():
            code, out, secs = run_cli(args(db), limit_s=20)
            outcome = judge("store on a full disk", command, db, code, out, secs, "", before,
                            codes=(1, 2), names=db.name)
            if command == "serve" and "internal error" in out:
                outcome.where = "planner/service/serve_lock.py (ServeLock.acquire: os.pwrite)"
            yield outcome
        filler.unlink()
        after = rows(db)
        lost = [t for t in before if t != "integrity" and (
            after is None or not set(before[t]) <= set(after[t]))]
        ok = not lost and after is not None and after["integrity"] == "ok"
        yield Outcome("store on a full disk: after space is freed", ok, None, 0.0,
                      "every row kept, integrity ok" if ok
                      else f"lost {lost} / {after and after['integrity']}",
                      expected="nothing lost", where="" if ok else WHERE)
    finally:
        subprocess.run(["umount", "-l", str(mnt)])


def second_serve(tmp: Path) -> Iterator[Outcome]:
    from bench.planner_process import start_planner, stop_planner

    db = tmp / "served.sqlite"
    make_real(db, tmp)
    proc, _ = start_planner(db, tmp / "serve-one.log", ["--insecure"])
    try:
        code, out, secs = run_cli(commands(tmp)["serve"](db), limit_s=20)
        yield judge("store served already: a second serve", "serve", db, code, out, secs, "",
                    rows(db), names=db.name)
    finally:
        stop_planner(proc)


def store_round(tmp: Path, progress=None) -> Iterator[Outcome]:
    tmp.mkdir(parents=True, exist_ok=True)
    for part in (bad_files, corrupted, read_only, locked, full_disk, second_serve):
        sub = tmp / part.__name__
        sub.mkdir()
        started = time.monotonic()
        try:
            yield from part(sub)
        except Exception as err:   # noqa: BLE001 - a broken part is a failure, shown
            yield Outcome(f"store {part.__name__}", False, None, time.monotonic() - started,
                          f"the probe broke: {type(err).__name__}: {err}")
