"""bench.linkpred_bench --quick on a tiny case: the output's structure, every model on the same
splits; and the splits themselves (bench.linkpred_splits)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from bench.linkpred_bench import main
from bench.linkpred_data import generated_dataset
from bench.linkpred_regret import regret_cases
from bench.linkpred_splits import cold_provider_splits, cold_region_splits, hide_splits
from planner.linkpred.graph import LinkPrediction, Source

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
        cases = d["regret_70"]["cases"]
        assert [c["case_seed"] for c in cases] == d["regret_70"]["case_seeds"]
        assert len(cases) == 2
        for model, r in regret.items():      # the headline is the worst case, beside the mean
            assert r["regret"] == max(c["models"][model]["regret"] for c in cases)
            assert r["regret_mean"] <= r["regret"] and r["point_regret"] is not None
        assert {"2 starts, seed 1", "noise 1%", "noise 5%"} == set(d["regret_70"]["floor"])
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


def _truth_as_prediction(graph, model: str) -> LinkPrediction:
    square = {}
    for key, values in (("rtt", graph.rtt_ms), ("gbps", graph.gbps)):
        m = np.full((graph.n_sites,) * 2, np.nan)
        m[graph.i, graph.j] = m[graph.j, graph.i] = values
        square[key] = m
    sources = np.full(square["rtt"].shape, Source.MEASURED, dtype=np.uint8)
    return LinkPrediction(model, tuple(graph.sites), square["rtt"], square["rtt"],
                          square["gbps"], square["gbps"], sources, sources)


@pytest.mark.slow
def test_regret_of_the_true_links_is_one_on_every_case_and_the_worst_is_the_headline(shared_dir):
    dataset = generated_dataset(12, 0)
    truth = _truth_as_prediction(dataset.truth, "truth")
    # A run to the end (no time budget) so that equal links give the same plan.
    quartered = LinkPrediction("quartered", truth.sites, truth.rtt_ms * 4, truth.rtt_hi_ms * 4,
                               truth.gbps / 4, truth.gbps_lo / 4, truth.rtt_source,
                               truth.gbps_source)
    doc = regret_cases(dataset, {"truth": truth, "quartered": quartered}, shared_dir, sites=3,
                       jobs_named=("bert-large",), setting={"starts": 1}, case_seeds=(5, 1, 2))
    assert [c["case_seed"] for c in doc["cases"]] == [5, 1, 2]
    assert len({tuple(c["sites"]) for c in doc["cases"]}) == 3      # the cases differ
    for case in doc["cases"]:
        assert case["models"]["truth"]["regret"] == 1.0
        assert case["models"]["truth"]["point_regret"] == 1.0
        assert case["floor"]["noise 1%"] is not None
        assert 0 < case["best_found_regret"] <= 1.0
    got = doc["models"]["quartered"]
    per_case = [c["models"]["quartered"]["regret"] for c in doc["cases"]]
    assert got["regret"] == max(per_case)
    assert got["regret_mean"] == pytest.approx(sum(per_case) / 3, abs=1e-4)
    assert doc["models"]["truth"] == {"regret": 1.0, "regret_mean": 1.0, "point_regret": 1.0,
                                      "point_regret_mean": 1.0}
