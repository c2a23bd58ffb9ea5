"""`hulk-planner fleet complete` leaves the objects a fit made to the OS at exit: it freezes
them for the interpreter's last garbage collections (which otherwise sweep all of torch's),
only at exit, so a caller in the same process keeps collecting as before."""

import subprocess
import sys

import pytest

from tests.helpers.paths import REPO
from tests.helpers.processes import worktree_env

pytestmark = pytest.mark.process

EXAMPLE = REPO / "examples" / "fleets" / "asia-24.json"

# Registered first, so run last of the exit handlers (they run in reverse order).
COMPLETE_THEN_REPORT = """
import atexit, gc, sys
from planner import cli
atexit.register(lambda: print("frozen at exit:", gc.get_freeze_count() > 0))
code = cli.main(["fleet", "complete", sys.argv[1], "--out", sys.argv[2]])
print("frozen on return:", gc.get_freeze_count() > 0)
sys.exit(code)
"""


def test_fleet_complete_freezes_the_heap_at_exit_not_before(tmp_path):
    done = subprocess.run([sys.executable, "-c", COMPLETE_THEN_REPORT, str(EXAMPLE),
                           str(tmp_path / "completed.json")], cwd=REPO, env=worktree_env(),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    assert lines[-2:] == ["frozen on return: False", "frozen at exit: True"]
