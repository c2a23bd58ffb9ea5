"""bench.linkpred_regret_exact --quick: the output's keys, no plan beating a proved optimum of the
same space, the same numbers on a second run; and the case builder it shares with
bench/linkpred_regret.py."""

from __future__ import annotations

import json

import pytest

from bench.linkpred_data import generated_dataset
from bench.linkpred_regret import case_network
from bench.linkpred_regret_exact import NO_ORACLE, NOISE_SIGMAS, ORACLE, QUICK, main, run

# The only figures allowed to differ between two runs: when, and how long things took.
RUN_FACTS = {"date", "seconds", "fit_predict_s"}


@pytest.fixture(autouse=True)
def _openmp_threads(monkeypatch):
    # scikit-learn otherwise runs lscpu once to count physical cores (a process).
    monkeypatch.setenv("OMP_NUM_THREADS", "1")


@pytest.mark.slow
def test_quick_run_keys_no_plan_beats_a_proved_optimum_and_runs_repeat(shared_dir, tmp_path):
    assert main(["--quick", "--shared", str(shared_dir), "--out", str(tmp_path / "a")]) == 0
    doc = json.loads((tmp_path / "a" / "linkpred_regret_exact.json").read_text())
    assert doc["date"] and doc["command"].endswith("--quick") and doc["python"]
    assert doc["seconds"] > 0 and doc["complete"] is True
    assert doc["models"] == list(QUICK["models"])
    assert set(doc["datasets"]) == {"skyplane", "generated-24-s0"}
    regrets = []
    for name, d in doc["datasets"].items():
        assert set(d) >= {"cases", "splits", "models", "floor", "proved"}
        # the oracle by default, on the generated network only
        generated = name.startswith("generated-")
        assert d["oracle"] is True if generated else d["oracle"] == NO_ORACLE
        expected = set(doc["models"]) | ({ORACLE} if generated else set())
        assert set(d["models"]) == expected
        assert set(d["floor"]) == {f"noise {s:.0%}" for s in NOISE_SIGMAS}
        assert [c["case_seed"] for c in d["cases"]] == list(QUICK["case_seeds"])
        proved = {c["case_seed"]: c["reference"]["proved"] for c in d["cases"]}
        for c in d["cases"]:
            assert c["servers"] == 2 * QUICK["sites"]
            for draws in c["floor"].values():
                for draw in draws:
                    assert draw["regret"] is not None
                    if proved[c["case_seed"]]:
                        assert draw["regret"] >= 1 - 1e-9, (name, c["case_seed"], draw)
        for split in d["splits"]:
            assert set(split["errors"]) == expected
            for case in split["cases"]:
                assert set(case["models"]) == expected
                for model, plans in case["models"].items():
                    for kind, plan in plans.items():
                        assert plan["regret"] is not None, (name, model, kind)
                        assert plan["proved"] or plan["gap"] is not None
                        regrets.append(plan["regret"])
                        # An exact optimum cannot be beaten within the same space.
                        if proved[case["case_seed"]]:
                            assert plan["regret"] >= 1 - 1e-9, (name, model, kind, plan)
        for model, r in d["models"].items():
            for kind in ("conservative", "point"):
                assert r[kind]["below_one"] == 0
                assert r[kind]["mean"] <= r[kind]["worst"]
                assert r[kind]["plans"] == len(QUICK["case_seeds"]) * len(QUICK["hide_seeds"])
        assert d["proved"]["references"] == len(QUICK["case_seeds"])
    # The quick case is not trivial: some model's links lead to a longer plan.
    assert max(regrets) > 1.01
    again = run(tmp_path / "b", shared_dir, quick=True)
    assert _without(json.loads(json.dumps(again)), RUN_FACTS) == _without(doc, RUN_FACTS)


def _without(value, keys):
    """``value`` (a JSON document) with every item named in ``keys`` left out, at any depth."""
    if isinstance(value, dict):
        return {k: _without(v, keys) for k, v in value.items() if k not in keys}
    if isinstance(value, list):
        return [_without(v, keys) for v in value]
    return value


def test_case_network_keeps_the_site_choice_and_sets_the_servers_per_site():
    dataset = generated_dataset(24, 0)
    default = case_network(dataset, 6, 5)
    two = case_network(dataset, 6, 5, (2, 3))
    assert two.sites == default.sites and two.chosen == default.chosen
    assert len(two.nodes) == 12
    assert {n.site for n in two.nodes} == set(two.sites)
    truth = two.fleet(two.true_rtt, two.true_bw)
    assert truth.n == 12
