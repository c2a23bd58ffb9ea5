"""serve's lock on a full disk (planner/service/serve_lock.py): the pid it writes into
``<db>.serve.lock`` finds no room, which is one line naming the lock file and the cause (a
StoreError, exit 1), never an internal error, and holds nothing: once there is room the next
serve takes the lock. The tmpfs needs root; elsewhere the test is skipped."""

from __future__ import annotations

import os

import pytest

from hulk.errors import StoreError
from planner.service.serve_lock import ServeLock, lock_path
from tests.helpers.mounts import fill, tmpfs_mounts


@pytest.mark.process   # mount, umount
@pytest.mark.root
def test_a_full_disk_is_one_line_naming_the_lock_file_and_leaves_no_lock_held(tmp_path):
    with tmpfs_mounts(tmp_path) as mounts:
        where = mounts.mount("64k")
        db = where / "planner.sqlite"
        filler = fill(where)
        with pytest.raises(StoreError) as refused:
            ServeLock(db).acquire()
        message = str(refused.value)
        assert message.startswith(f"{lock_path(db)}: ") and "No space left on device" in message
        assert "\n" not in message and refused.value.exit_code == 1
        filler.unlink()                  # room again: the failed acquire held nothing
        with ServeLock(db):
            assert lock_path(db).read_text().strip() == str(os.getpid())
        assert lock_path(db).read_text() == ""
