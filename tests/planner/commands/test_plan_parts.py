"""Pieces of `hulk-planner plan` that a subprocess run cannot pin down: the delayed progress bar,
the pre-planning checks, formatting, and the benchmark runner's handling of missing modules."""

from __future__ import annotations

import io
import subprocess
import sys

import numpy as np
import pytest
from rich.console import Console

from hulk.errors import PlanningError
from planner.commands.plan import LazyProgress, check_plannable, fmt_s
from planner.core.jobs import Job
from tests.helpers.plans import make_net


class FakeClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_progress_bar_appears_only_after_a_second():
    clock = FakeClock()
    bar = LazyProgress(Console(file=io.StringIO(), force_terminal=True), delay=1.0, clock=clock)
    bar.begin("planning")
    bar(1, 10)
    assert bar.progress is None
    clock.now += 1.5
    bar(5, 10)
    assert bar.progress is not None
    assert bar.progress.tasks[0].completed == 5 and bar.progress.tasks[0].total == 10
    bar(0.75)   # a fraction is accepted too
    assert bar.progress.tasks[0].completed == 0.75
    bar.end()
    assert bar.progress is None


def test_check_plannable():
    job = Job(name="j", params=1e9, layers=4, hidden=1000, seq_len=100, global_batch=8)  # 16 GB
    fine = make_net([("A100", 1, 10), ("A100", 1, 10)], [[0, 5], [5, 0]])
    check_plannable([job], fine)
    too_small = make_net([("A100", 1, 5), ("A100", 1, 5)], [[0, 5], [5, 0]])
    with pytest.raises(PlanningError, match="whole fleet has 10 GB"):
        check_plannable([job], too_small)
    split = make_net([("A100", 1, 10), ("A100", 1, 10), ("A100", 1, 10)],
                     [[0, 5, np.inf], [5, 0, np.inf], [np.inf, np.inf, 0]])
    big = Job(name="big", params=1.5e9, layers=4, hidden=1000, seq_len=100, global_batch=8)  # 24 GB
    with pytest.raises(PlanningError, match="largest connected part has only 20 GB"):
        check_plannable([big], split)
    apart = make_net([("A100", 1, 10)] * 2, [[0, np.inf], [np.inf, 0]])
    with pytest.raises(PlanningError, match="no two nodes can communicate"):
        check_plannable([job], apart)


def test_durations():
    assert fmt_s(0.0123) == "12.3 ms" and fmt_s(42) == "42.00 s" and fmt_s(600) == "10.0 min"
    assert fmt_s(4.2e-5) == "42.0 us" and fmt_s(0.001) == "1.0 ms"   # never "0.0 ms"
    assert fmt_s(3 * 3600) == "3.0 h" and fmt_s(5 * 86400) == "5.0 d" and fmt_s(float("inf")) == "inf"


@pytest.mark.process
def test_bench_runner_reports_a_missing_module(tmp_path, repo_dir):
    result = subprocess.run([sys.executable, "-m", "bench.run", "--only", "no_such_bench",
                             "--out", str(tmp_path)], cwd=repo_dir, capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    summary = (tmp_path / "SUMMARY.md").read_text()
    assert "## no_such_bench" in summary and "not present" in summary
