"""bench.child_usage: a command's own peak RSS, not the benchmark's that started it."""

from __future__ import annotations

import sys

import pytest

from bench.child_usage import run_measured

pytestmark = pytest.mark.process

TOUCH_MB = r"""
import sys
block = bytearray(int(sys.argv[1]) * 2 ** 20)
block[::4096] = b"\x01" * len(block[::4096])   # touch every page, so it is resident
print("touched", len(block) // 2 ** 20)
"""


def test_peak_rss_is_the_commands_own_even_from_a_large_parent():
    held = bytearray(400 * 2 ** 20)
    held[::4096] = b"\x01" * len(held[::4096])   # this process now holds 400 MB more
    usage = run_measured([sys.executable, "-c", TOUCH_MB, "120"], timeout_s=60)
    assert usage.exit_code == 0 and not usage.timed_out
    assert "touched 120" in usage.output
    assert 120 * 2 ** 20 <= usage.peak_rss_bytes < 300 * 2 ** 20
    assert usage.cpu_s >= 0 and usage.wall_s > 0
    del held


def test_a_command_past_its_deadline_is_killed_and_said_so():
    usage = run_measured([sys.executable, "-c", "import time; time.sleep(30)"], timeout_s=0.5)
    assert usage.timed_out and usage.exit_code != 0 and usage.wall_s < 10


def test_a_failing_command_gives_its_exit_code_and_output():
    usage = run_measured([sys.executable, "-c", "import sys; print('no'); sys.exit(3)"],
                         timeout_s=60)
    assert usage.exit_code == 3 and "no" in usage.output and not usage.timed_out
