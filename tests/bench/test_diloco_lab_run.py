"""bench/diloco_lab_bench.py --quick for real: two lab continents, sync: step against sync: diloco.

Root (network namespaces) and a few minutes; skipped where the lab cannot run. Its speed and
loss figures are the benchmark's (docs/BENCHMARKS.md), not asserted here."""

from __future__ import annotations

import json

import pytest

import bench.diloco_lab_bench as B
from lab.netns import LabError, require_root

pytestmark = [pytest.mark.root, pytest.mark.process]


@pytest.fixture
def lab_available() -> None:
    try:
        require_root()
    except LabError as err:
        pytest.skip(str(err))


@pytest.mark.timeout(600)   # six calibration runs and three judged ones, two over the slow link
def test_the_quick_benchmark_trains_both_and_writes_its_figures(lab_available, tmp_path):
    result = B.bench(tmp_path, quick=True, log=lambda s: None)
    written = json.loads((tmp_path / "diloco_lab.json").read_text())
    assert written["command"] == "python -m bench.diloco_lab_bench --quick"
    assert (tmp_path / "diloco_lab.png").stat().st_size > 0
    step, diloco = result["runs"]["step"], result["runs"]["diloco"]
    assert len(step["loss"]) == len(diloco["loss"]) == 60
    assert diloco["outer_syncs"] == 3 and step["outer_syncs"] == 0
    assert diloco["loss"][-1] < diloco["loss"][0] and step["loss"][-1] < step["loss"][0]
    assert set(diloco["hosts"]) == {"east-1", "east-2", "west-1", "west-2"}
    # Every outer step split into the leaders' wait, the exchange and the island broadcast.
    assert [ph["round"] for ph in diloco["outer_phases"]] == [1, 2, 3]
    assert all(ph["exchange_s"] > 0 and ph["total_s"] >= ph["exchange_s"]
               for ph in diloco["outer_phases"])
    # The step job over both continents pays the slow link at every step.
    wide = result["runs"]["step_every_host"]
    assert len(wide["loss"]) == B.EVERY_HOST_QUICK and wide["outer_syncs"] == 0
    assert wide["iteration_s"] > 2 * step["iteration_s"]
    assert result["tokens_per_s_ratio_vs_step_every_host"] > result["tokens_per_s_ratio"]
    assert set(result["estimates"]["calibrated"]) == {"step", "diloco", "step_every_host"}
    # The calibration run over the slow link lets the fit tell communication apart.
    [wide_cal] = [r for r in result["calibration"]["runs"]
                  if r["placement"]["outer"] is None and len(r["placement"]["stages"][0]["hosts"]) == 4]
    assert wide_cal["steps"] == B.QUICK_CALIBRATION_EVERY_HOST_STEPS
    assert result["calibration"]["fitted"]["communication"]["fitted"]
    # The DiLoCo runs at small H price the outer sync.
    outer_cal = [r for r in result["calibration"]["runs"] if r["placement"]["outer"]]
    assert [r["placement"]["outer"]["inner_steps"] for r in outer_cal] == list(B.QUICK_DILOCO_CALIBRATION_H)
    assert result["calibration"]["fitted"]["outer_sync"]["fitted"]
    assert "calibrated_without_diloco_runs" in result["estimates"]
