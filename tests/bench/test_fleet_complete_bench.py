"""bench.fleet_complete_bench: repeated runs give the medians beside every run, and a failed run
is reported as it is (the fresh processes themselves are the benchmark's, not a test's)."""

from __future__ import annotations

from pathlib import Path

import bench.fleet_complete_bench as b


def test_repeated_reports_medians_and_every_run(monkeypatch):
    seconds = iter([(4.0, 5.0), (2.0, 3.0), (3.0, 9.0)])

    def fake_run(fleet, out, model, timeout_s):
        command, wall = next(seconds)
        return {"model": model or "(default)", "used": "gnn", "command_s": command,
                "wall_s": wall, "summary": ["wrote"]}

    monkeypatch.setattr(b, "run_once", fake_run)
    row = b.repeated(Path("f.json"), Path("o.json"), None, 10.0, 3)
    assert row["command_s"] == 3.0 and row["wall_s"] == 5.0
    assert row["command_runs_s"] == [4.0, 2.0, 3.0] and row["wall_runs_s"] == [5.0, 3.0, 9.0]


def test_repeated_stops_at_the_first_failure(monkeypatch):
    calls = []

    def failing(fleet, out, model, timeout_s):
        calls.append(model)
        return {"model": model, "error": "stopped after 10 s"}

    monkeypatch.setattr(b, "run_once", failing)
    assert b.repeated(Path("f.json"), Path("o.json"), "gnn", 10.0, 3) == {
        "model": "gnn", "error": "stopped after 10 s"}
    assert calls == ["gnn"]
