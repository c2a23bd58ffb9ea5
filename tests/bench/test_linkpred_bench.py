"""bench.linkpred_bench --quick on a tiny case: the output's structure, every model on the same
splits; and the splits themselves (bench.linkpred_splits)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from bench.linkpred_bench import main
from bench.linkpred_data import generated_dataset
from bench.linkpred_splits import cold_provider_splits, cold_region_splits, hide_splits

CONTROLS = {"formula", "provider median", "distance", "vivaldi", "matrix", "boosted"}


@pytest.fixture(autouse=True)
def _openmp_threads(monkeypatch):
    # scikit-learn otherwise runs lscpu once to count physical cores (a process).
    monkeypatch.setenv("OMP_NUM_THREADS", "1")


@pytest.mark.slow
def test_quick_run_writes_every_figure_for_every_model_on_the_same_splits(shared_dir, tmp_path):
    assert main(["--quick", "--shared", str(shared_dir), "--out", str(tmp_path)]) == 0
    doc = json.loads((tmp_path / "linkpred.json").read_text())
    assert (tmp_path / "linkpred.png").stat().st_size > 0
    assert doc["date"] and doc["command"].endswith("--quick")
    models = doc["models"]
    assert CONTROLS <= set(models)
    assert set(doc["datasets"]) == {"skyplane", "generated-24-s0"}
    for name, d in doc["datasets"].items():
        kinds = {row["kind"] for row in d["splits"]}
        assert {"hide 50%", "hide 70%", "cold region 3"} <= kinds
        for row in d["splits"]:
            assert list(row["models"]) == models, (name, row["kind"])
            assert row["judged"] > 0
            for figures in row["models"].values():
                assert "error" not in figures
                assert figures["pairs"] > 0 and figures["gbps_p90"] >= figures["gbps_p50"] >= 0
                assert 0 <= figures["optimistic"] <= 1
        for kind in kinds:
            assert list(d["summary"][kind]) == models
        regret = d["regret_70"]["models"]
        assert list(regret) == models
        assert all(r["regret"] is not None and r["regret"] > 0.5 for r in regret.values())
        assert set(doc["targets"][name]["models"]) == set(models) - {"formula"}


def test_splits_hide_what_they_say():
    graph = generated_dataset(24, 1).truth
    pairs = len(graph.i)
    for split in hide_splits(graph, (0, 1)):
        share = float(split.kind.split()[1].rstrip("%")) / 100
        assert (~split.keep).sum() == round(share * pairs)
        assert np.array_equal(split.judge, ~split.keep)
    for split in cold_region_splits(graph, (0,), (1, 3)):
        k = int(split.kind.split()[-1])
        cold = [graph.sites.index(s) for s in split.detail.split(": ")[1].split(", ")]
        for site in cold:
            own = (graph.i == site) | (graph.j == site)
            assert (own & split.keep).sum() == k
        assert not (split.judge & split.keep).any()
    for split in cold_provider_splits(graph):
        assert not (split.judge & split.keep).any() and split.judge.any()


def test_generated_fleets_are_seeded_and_complete():
    a, b = generated_dataset(20, 3).truth, generated_dataset(20, 3).truth
    assert np.array_equal(a.gbps, b.gbps) and np.array_equal(a.rtt_ms, b.rtt_ms)
    assert len(a.i) == 20 * 19 // 2 and np.all(a.gbps > 0) and np.all(a.rtt_ms > 0)
    assert not np.array_equal(a.gbps, generated_dataset(20, 4).truth.gbps)
