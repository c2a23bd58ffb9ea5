"""`python -m lab.run`: broker, planner and agents in the lab; the planner learns the matrix."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys

import pytest

from lab import netns
from lab.wan import REPO

pytestmark = [pytest.mark.root, pytest.mark.process]


def test_the_planner_learns_the_configured_rtts_and_plans(lab_available, tmp_path):
    if shutil.which("mosquitto") is None:
        pytest.skip("mosquitto is not installed")
    work = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "lab.run", "--hosts", "3", "--scale", "1", "--interval", "1",
         "--measure-timeout", "60", "--placement-timeout", "10", "--work-dir", str(work)],
        capture_output=True, text=True, timeout=170, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = json.loads((work / "rtts.json").read_text())
    assert len(rows) == 3
    for row in rows:
        assert row["learned_ms"] is not None, row
        assert abs(row["learned_ms"] - row["configured_ms"]) <= max(1.0, 0.05 * row["configured_ms"]), row
    plan = json.loads((work / "plan.json").read_text())
    assert plan["jobs"], plan
    assert "lab: torn down" in proc.stdout
    built = re.findall(r"(hulk-lab-\S+)", proc.stdout)
    assert len(built) == 3
    assert not set(built) & set(netns.list_namespaces())
