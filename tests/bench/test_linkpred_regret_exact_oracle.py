"""The generated networks' oracle in bench.linkpred_regret_exact: its links, where it runs, and
``--models``."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from bench.linkpred_data import Dataset, generated_dataset, generated_truth
from bench.linkpred_floor import oracle_log_gbps
from bench.linkpred_regret_exact import (NO_ORACLE, ORACLE, ORACLE_DRAWS, TARGET_REGRET,
                                         _spread, choose_models, main, network_models,
                                         oracle_for)
from bench.linkpred_splits import hide_splits
from hulk.errors import InputError
from planner.linkpred.graph import Source


@pytest.fixture(autouse=True)
def _openmp_threads(monkeypatch):
    # scikit-learn otherwise runs lscpu once to count physical cores (a process).
    monkeypatch.setenv("OMP_NUM_THREADS", "1")


def test_oracle_links_are_the_true_rtt_the_oracle_throughput_and_measured_pairs_as_measured():
    dataset = generated_dataset(24, 0)
    truth = generated_truth(24, 0)
    g = truth.graph
    split = hide_splits(g, [0], (0.7,))[0]
    train = g.masked(split.keep)
    oracle = oracle_for(dataset)
    assert oracle is not None
    p = oracle.fit(train, seed=3).predict(train)
    i, j = g.i, g.j
    # every pair's RTT is the truth's, measured or not
    assert np.array_equal(p.rtt_ms[i, j], g.rtt_ms) and np.array_equal(p.rtt_ms[j, i], g.rtt_ms)
    expected = np.exp(oracle_log_gbps(truth, ORACLE_DRAWS))
    hidden, kept = ~split.keep, split.keep
    assert hidden.sum() > 0 and kept.sum() > 0
    assert np.allclose(p.gbps[i, j][hidden], expected[hidden], rtol=1e-12)
    # the oracle's median is not the pair's own draw: measured pairs must show the difference
    assert not np.allclose(expected[kept], g.gbps[kept])
    assert np.array_equal(p.gbps[i, j][kept], g.gbps[kept])
    assert np.array_equal(p.gbps_source[i, j][kept], np.full(kept.sum(), Source.MEASURED))
    assert np.array_equal(p.gbps_source[i, j][hidden], np.full(hidden.sum(), Source.PREDICTED))
    # no spread: the conservative links are the point links
    assert np.array_equal(p.rtt_hi_ms, p.rtt_ms, equal_nan=True)
    assert np.array_equal(p.gbps_lo, p.gbps, equal_nan=True)


def test_only_a_generated_network_whose_truth_regenerates_has_an_oracle():
    dataset = generated_dataset(24, 0)
    other = Dataset("skyplane", dataset.truth, "measured")
    tampered = replace(dataset, truth=replace(dataset.truth, gbps=dataset.truth.gbps * 1.01))
    assert oracle_for(other) is None and oracle_for(tampered) is None
    assert list(network_models(dataset, {}, oracle=True)) == [ORACLE]
    assert network_models(dataset, {}, oracle=False) == {}
    assert network_models(other, {}, oracle=True) == {}
    with pytest.raises(ValueError):
        oracle_for(dataset).fit(generated_dataset(25, 0).truth)


def test_models_option_picks_models_and_the_oracle():
    available = {"formula": object(), "boosted": object()}
    assert choose_models("oracle", available) == ({}, True)
    models, oracle = choose_models("boosted, oracle", available)
    assert list(models) == ["boosted"] and oracle
    assert choose_models("formula", available) == ({"formula": available["formula"]}, False)
    for bad in ("gnn", "", "oracle,nope"):
        with pytest.raises(InputError, match="--models"):
            choose_models(bad, available)


def test_above_target_counts_regrets_over_the_issue_target():
    row = _spread([1.0, TARGET_REGRET, TARGET_REGRET + 0.001, 1.5, None])
    assert row["above_target"] == 2 and row["missing"] == 1 and row["worst"] == 1.5


@pytest.mark.slow
def test_oracle_only_run_skips_skyplane_and_plans_once_per_case(shared_dir, tmp_path):
    assert main(["--quick", "--models", "oracle", "--shared", str(shared_dir),
                 "--out", str(tmp_path)]) == 0
    assert not (tmp_path / "linkpred_regret_exact.json").exists()
    doc = json.loads((tmp_path / "linkpred_regret_exact_oracle.json").read_text())
    assert doc["command"].endswith("--quick --models oracle") and doc["models"] == []
    assert doc["oracle"]["draws"] == ORACLE_DRAWS
    sky = doc["datasets"]["skyplane"]
    assert sky["oracle"] == NO_ORACLE and "skipped" in sky
    gen = doc["datasets"]["generated-24-s0"]
    assert gen["oracle"] is True and list(gen["models"]) == [ORACLE]
    for split in gen["splits"]:
        assert set(split["errors"]) == {ORACLE}
        for case in split["cases"]:
            plans = case["models"][ORACLE]
            assert plans["point"]["same_links_as"] == "conservative"
            assert plans["point"]["regret"] == plans["conservative"]["regret"]
    summary = gen["models"][ORACLE]
    assert summary["conservative"]["worst"] == summary["point"]["worst"]
    # one search per case and split for the oracle, beside the reference and floor draws
    cases, floor = len(gen["cases"]), sum(len(d) for d in gen["cases"][0]["floor"].values())
    assert gen["proved"]["searches"] == cases * (1 + floor) + cases * len(gen["splits"])
