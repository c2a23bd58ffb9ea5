"""bench.issue_day: the search of issue 14's day, run from its own commit in a child process."""

from __future__ import annotations

import subprocess

import pytest

from bench.issue_day import ISSUE_DAY_COMMIT, Unavailable, export_tree, measure_fleets
from bench.portfolio_bench import Fleet, load, measure

pytestmark = pytest.mark.process


def _have_commit() -> bool:
    proc = subprocess.run(["git", "cat-file", "-e", f"{ISSUE_DAY_COMMIT}^{{commit}}"],
                          capture_output=True)
    return proc.returncode == 0


@pytest.mark.skipif(not _have_commit(), reason="a clone without the issue-day commit")
def test_the_issue_day_search_equals_the_stand_in_makespan(shared_dir):
    # The 90-server real-region fleet with the paper's 4 jobs: the old tree's plan, judged by
    # today's cost model, has the makespan of today's search without stage ordering (the
    # portfolio bench's stand-in), so the stand-in's makespans are the issue's.
    jobs, net = load(Fleet("regions", "regions", 90, 45, "paper-4", 1), shared_dir)
    old = measure_fleets([("regions", jobs, net)], repeat_below_s=0.0, log=lambda *a, **k: None)
    stand_in = measure("search", jobs, net, stage_order=False)
    assert old["regions"]["complete"]
    assert old["regions"]["makespan_s"] == pytest.approx(stand_in["makespan_s"], rel=1e-9)
    assert old["regions"]["planning_s"] > 0


def test_a_commit_the_clone_lacks_is_unavailable(tmp_path):
    with pytest.raises(Unavailable, match="is not in this clone"):
        export_tree(tmp_path, "0" * 40)


def test_a_plan_with_an_unplaced_job_has_no_makespan(shared_dir):
    from bench.issue_day import _judge

    jobs, net = load(Fleet("paper", "paper", 47, jobs="paper-4"), shared_dir)
    # The old search placed nothing: the report is incomplete, so no makespan is compared.
    doc = {"placements": [], "unplaced": [j.name for j in jobs]}
    report = _judge(doc, jobs, net)
    assert not report.complete
    assert [u.name for u in report.unplaced] == [j.name for j in jobs]
