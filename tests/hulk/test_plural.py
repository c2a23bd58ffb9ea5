"""The one plural helper every count a person reads goes through ("1 restarts" and "1 site
pairs" were printed before it; tests/planner/service/test_lifecycle_restarts.py checks "gave up
after 1 restart")."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from hulk.plural import count


def test_count_says_one_noun_for_one_and_the_plural_otherwise():
    assert [count(n, "restart") for n in (0, 1, 2)] == ["0 restarts", "1 restart", "2 restarts"]
    assert count(1, "site pair") == "1 site pair" and count(45, "site pair") == "45 site pairs"
    assert count(3, "replica", "replicas") == "3 replicas"



APP_JS = Path(__file__).resolve().parents[2] / "planner" / "dashboard" / "static" / "app.js"


def _js_helper() -> str:
    found = re.search(r"^function count\(n, one, many\) \{.*\}$", APP_JS.read_text(), re.M)
    assert found, "app.js lost its count helper"
    return found.group(0)


def test_the_dashboard_counts_with_its_copy_of_the_helper():
    """app.js has its own copy of the helper: "1 jobs running" and "1 GPU(s)" were shown before."""
    app = APP_JS.read_text()
    assert not re.search(r"\} [A-Za-z ]+\(s\)", app) and "jobs running`" not in app
    assert '`${count(running, "job")} running`' in app and _js_helper()


@pytest.mark.process
def test_the_dashboards_helper_answers_as_hulk_plural():
    if shutil.which("node") is None:
        pytest.skip("node is not installed")
    cases = [(0, "job", None), (1, "job", None), (2, "GPU", None), (1, "batch", "batches"),
             (3, "batch", "batches")]
    script = _js_helper() + "\n" + "\n".join(
        f"console.log(count({n}, {one!r}, {'undefined' if many is None else repr(many)}));"
        for n, one, many in cases)
    out = subprocess.run(["node", "-e", script], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [count(n, one, many) for n, one, many in cases]
