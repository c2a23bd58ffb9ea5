"""serve's single-instance lock (planner/service/serve_lock.py): a second holder of one store is
refused with the first one's pid; a lock left by a process that died blocks nothing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hulk.errors import ConfigError
from planner.service.serve_lock import ServeLock, lock_path

ROOT = Path(__file__).resolve().parents[3]

HOLD = """
import sys
from planner.service.serve_lock import ServeLock
lock = ServeLock(sys.argv[1]).acquire()
print("locked", flush=True)
sys.stdin.read()
"""


def test_a_second_lock_on_one_store_names_the_store_and_the_holders_pid(tmp_path):
    db = tmp_path / "planner.sqlite"
    with ServeLock(db):
        with pytest.raises(ConfigError) as refused:
            ServeLock(db).acquire()
        message = str(refused.value)
        assert str(db) in message and f"pid {os.getpid()}" in message
        assert "\n" not in message and refused.value.exit_code == 2
        # Another store is not affected.
        with ServeLock(tmp_path / "other.sqlite"):
            pass
    with ServeLock(db):   # released on exit: the next serve takes it
        assert lock_path(db).read_text().strip() == str(os.getpid())


@pytest.mark.process
def test_a_lock_file_left_by_a_killed_holder_does_not_block(tmp_path):
    db = tmp_path / "planner.sqlite"
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(db)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(ConfigError, match=f"pid {holder.pid}"):
            ServeLock(db).acquire()
    finally:
        holder.kill()
        holder.wait(timeout=30)
    assert lock_path(db).read_text().strip() == str(holder.pid)   # the stale file stays
    with ServeLock(db):
        assert lock_path(db).read_text().strip() == str(os.getpid())
