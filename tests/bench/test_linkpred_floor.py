"""The oracle floor of the generated fleets (bench/linkpred_floor.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from bench.linkpred_data import THROUGHPUT_NOISE, generated_truth
from bench.linkpred_floor import compared, main, oracle_log_gbps
from bench.linkpred_splits import hide_splits
from planner.linkpred.controls_learned import BoostedModel


@pytest.fixture(autouse=True)
def _openmp_threads(monkeypatch):
    # scikit-learn otherwise runs lscpu once to count physical cores (a process).
    monkeypatch.setenv("OMP_NUM_THREADS", "1")


def test_the_oracle_beats_a_fitted_model_and_not_the_pair_noise():
    truth = generated_truth(40, 3)
    g = truth.graph
    split = hide_splits(g, [0], (0.5,))[0]
    oracle = np.abs(oracle_log_gbps(truth, draws=200) - np.log(g.gbps))[split.judge]
    fitted = BoostedModel().fit(g.masked(split.keep), 0).predict(g.masked(split.keep))
    model = np.abs(np.log(fitted.gbps[g.i, g.j]) - np.log(g.gbps))[split.judge]
    assert np.quantile(oracle, 0.9) < np.quantile(model, 0.9)
    # the pair's own throughput noise alone sits under any prediction's error
    assert np.quantile(oracle, 0.9) > 0.8 * 1.6449 * THROUGHPUT_NOISE
    assert np.array_equal(oracle_log_gbps(truth, draws=50), oracle_log_gbps(truth, draws=50))


def test_a_target_under_the_floor_is_said_to_be_out_of_reach():
    results = {"datasets": {"net": {"summary": {"cold region 3": {
        "formula": {"gbps_p90": 2.0}, "boosted": {"gbps_p90": 0.6}, "matrix": {"gbps_p90": 0.7},
        "gnn": {"gbps_p90": 0.57}}}}}}
    row = compared(0.55, results, "net", "cold region 3")
    assert row["best_control"] == "boosted" and row["target_p90"] == 0.54
    assert row["target_reachable"] is False
    assert row["gnn_share_of_gap_closed"] == 0.6
    assert compared(0.5, results, "net", "cold region 3")["target_reachable"] is True
    assert compared(0.5, results, "other", "cold region 3") == {}
    assert compared(0.5, results, "net", "hide 50%") == {}


def test_main_writes_the_floor_of_every_generated_fleet(tmp_path):
    assert main(["--draws", "20", "--results", str(tmp_path / "none.json"),
                 "--out", str(tmp_path)]) == 0
    doc = json.loads((tmp_path / "linkpred_floor.json").read_text())
    assert set(doc["networks"]) == {"generated-100-s0", "generated-150-s1", "generated-200-s2"}
    for row in doc["networks"].values():
        for kind in ("hide 50%", "cold region 3"):
            assert 0.3 < row["oracle"][kind]["gbps_p90"] < 1.0 and row[kind] == {}
    assert main(["--draws", "5", "--out", str(tmp_path)]) == 2
