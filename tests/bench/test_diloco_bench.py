"""bench.diloco_bench on a tiny case: both job sets planned, every plan checked, the figures
written with the date and the command."""

from __future__ import annotations

import json

import pytest

import bench.diloco_bench as B


@pytest.mark.slow   # plans two jobs on a 24-server fleet twice
def test_the_benchmark_writes_both_runs_and_auto_is_never_longer(tmp_path):
    tiny = B.Fleet("regions 24 servers / 6 regions, 2 jobs", "regions", 24, 6, 2, 21)
    doc = B.run(tmp_path, fleets=[tiny], log=lambda *a, **k: None, workers=1,
                command="pytest")
    written = json.loads((tmp_path / "diloco.json").read_text())
    assert written["command"] == "pytest" and written["date"]
    (row,) = written["results"]
    assert row["step"]["valid"] and row["auto"]["valid"], (row["step"]["problems"],
                                                            row["auto"]["problems"])
    assert row["step"]["island_jobs"] == 0
    assert all(v == "step" for v in row["step"]["sync"].values())
    assert row["auto"]["makespan_s"] <= row["step"]["makespan_s"] * (1 + 1e-9)
    assert row["makespan_ratio"] == pytest.approx(row["auto"]["makespan_s"]
                                                  / row["step"]["makespan_s"])
    assert doc["summary"]["all_valid"]
    assert "| regions 24 servers" in B.summarize(doc)


def test_check_names_what_makes_a_plan_invalid():
    import dataclasses

    from planner.core.plan import Plan

    jobs, _, net = B.load(B.Fleet("t", "regions", 24, 6, 2, 21))
    from planner.search import plan_search

    plan = plan_search(jobs, net)
    assert B.check(plan, net, jobs) == []
    doubled = Plan("x", [plan.placements[0], dataclasses.replace(plan.placements[0])])
    assert any("once" in p for p in B.check(doubled, net, jobs))


def test_repeated_runs_keep_every_time_and_report_medians():
    runs = [{"makespan_s": 10.0, "planning_s": t, "cpu_s": 2 * t, "valid": True, "sync": {}}
            for t in (3.0, 1.0, 2.0)]
    out = B.repeated(runs)
    assert out["planning_s"] == 2.0 and out["cpu_s"] == 4.0
    assert out["planning_runs_s"] == [3.0, 1.0, 2.0] and out["cpu_runs_s"] == [6.0, 2.0, 4.0]
    assert out["makespans_agree"] and out["valid"]
    runs[1] = {**runs[1], "makespan_s": 11.0, "valid": False}
    out = B.repeated(runs)
    assert not out["makespans_agree"] and not out["valid"]


def test_repeats_below_one_are_refused(capsys):
    with pytest.raises(SystemExit) as exit_:
        B.main(["--repeats", "0", "--quick"])
    assert exit_.value.code == 2
    assert "--repeats" in capsys.readouterr().err
