"""The commands that write the store, run as an operator runs them: another program's SQLite
file given as --db (tables named like the planner's without its columns) is refused by
`jobs submit`, `fleet import` and `serve` in one line naming the file and what was expected,
exit 2, and is left byte for byte as it was; `serve` on a full disk is one line naming its lock
file and the cause, exit 1, no internal error, and the store keeps what it held. The tmpfs
needs root; elsewhere that test is skipped."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from tests.helpers.examples import EXAMPLES
from tests.helpers.mounts import fill, tmpfs_mounts
from tests.helpers.ports import free_port
from tests.helpers.processes import run_cli

pytestmark = pytest.mark.process

FLEET = EXAMPLES / "fleets" / "lab-5.json"
JOBS = "jobs:\n  - {name: bert, model: bert-large, steps: 10, command: 'python train.py'}\n"

COMMANDS = {
    "jobs submit": lambda db, d: ["jobs", "submit", d / "jobs.yaml", "--db", db],
    "fleet import": lambda db, d: ["fleet", "import", FLEET, "--db", db],
    "serve": lambda db, d: ["serve", "--db", db, "--listen", f"127.0.0.1:{free_port()}",
                            "--insecure"],
}


def files(folder: Path) -> dict[str, tuple[bytes, int]]:
    """The folder's files (bytes, mode) but serve's lock file, which names no store."""
    return {p.name: (p.read_bytes(), p.stat().st_mode) for p in sorted(folder.iterdir())
            if p.is_file() and not p.name.endswith(".serve.lock")}


@pytest.mark.parametrize("command", COMMANDS)
def test_another_programs_sqlite_file_is_one_line_exit_2_and_left_byte_for_byte(
        tmp_path, command):
    (tmp_path / "jobs.yaml").write_text(JOBS)
    db = tmp_path / "planner.sqlite"
    conn = sqlite3.connect(db)
    conn.executescript("CREATE TABLE nodes (x TEXT); INSERT INTO nodes VALUES ('hostile');")
    conn.close()
    db.chmod(0o644)
    before = files(tmp_path)
    done = run_cli(*COMMANDS[command](db, tmp_path))
    err = done.stderr.strip()
    assert done.returncode == 2 and len(err.splitlines()) == 1, err
    assert err.startswith(f"hulk-planner: {db}: not a Hulk store: table nodes has no columns "
                          "idx, id"), err
    assert "expected the SQLite file `serve --db` writes" in err and "no such" not in err
    assert files(tmp_path) == before


@pytest.mark.root   # a tmpfs
def test_serve_on_a_full_disk_is_one_line_naming_the_lock_file_and_the_store_keeps_its_rows(
        tmp_path):
    with tmpfs_mounts(tmp_path) as mounts:
        where = mounts.mount("1m")
        db = where / "planner.sqlite"
        assert run_cli("fleet", "import", FLEET, "--db", db).returncode == 0
        filler = fill(where)
        done = run_cli(*COMMANDS["serve"](db, tmp_path))
        err = done.stderr.strip()
        assert done.returncode == 1 and len(err.splitlines()) == 1, err
        assert err.startswith(f"hulk-planner: {db}.serve.lock: ") and \
            "No space left on device" in err, err
        assert "internal error" not in err
        filler.unlink()
        shown = run_cli("fleet", "show", "--db", db)
        assert shown.returncode == 0 and "5 nodes" in shown.stdout, shown.stdout + shown.stderr
