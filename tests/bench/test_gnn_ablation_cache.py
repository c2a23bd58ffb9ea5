"""bench.gnn_ablation's cache of non-learned starts is keyed by the code they depend on, and no
start inherits a per-process memo from the start before it."""

from __future__ import annotations

import functools
import shutil
import sys
import types
from pathlib import Path

import numpy as np

from bench import gnn_ablation
from bench.gnn_ablation import REPO, code_key
from bench.gnn_ablation_controls import cluster_rule_accuracy, cluster_rule_scores, reset_run_caches


def _copy(root):
    for folder in ("planner/search", "planner/core"):
        shutil.copytree(REPO / folder, root / folder)
    for path in ("planner/gnn/starts.py", "bench/gnn_ablation.py",
                 "bench/gnn_ablation_controls.py"):
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / path, root / path)


def test_the_key_follows_the_search_code(tmp_path):
    _copy(tmp_path)
    assert code_key(tmp_path) == code_key(REPO)
    chain = tmp_path / "planner" / "search" / "chain.py"
    chain.write_text(chain.read_text() + "\n# changed\n")
    assert code_key(tmp_path) != code_key(REPO)


def test_the_key_ignores_code_the_starts_do_not_use(tmp_path):
    _copy(tmp_path)
    (tmp_path / "planner" / "service").mkdir(parents=True)
    (tmp_path / "planner" / "service" / "server.py").write_text("# not read\n")
    assert code_key(tmp_path) == code_key(REPO)


def _memo_module(monkeypatch, name: str = "planner.search._memo_for_test"):
    """A module of the search holding an lru_cache'd function, as a future memo would."""
    module = types.ModuleType(name)

    @functools.lru_cache(maxsize=None)
    def memo(x):
        return x * 2

    module.memo = memo
    monkeypatch.setitem(sys.modules, name, module)
    return memo


def test_the_reset_clears_the_planners_memos(monkeypatch):
    from planner.gnn import infer

    memo = _memo_module(monkeypatch)
    memo(3)
    monkeypatch.setitem(infer._cache, ("model.pt", 1.0), object())
    cleared = reset_run_caches()
    assert memo.cache_info().currsize == 0
    assert not infer._cache
    assert {"planner.search._memo_for_test.memo", "planner.gnn.infer._cache"} <= set(cleared)


def test_each_start_gets_a_fresh_fleet_and_no_memo_of_the_start_before(monkeypatch):
    """fleet_row: before every start the memos are empty and the fleet (whose nodes memoise
    their city) is built anew."""
    from planner.core.fleet import complete
    from planner.core.generate import generate_fleet, generate_jobs
    from planner.gnn import checkpoint as ckpt

    memo = _memo_module(monkeypatch)

    def build(spec, shared):
        net = complete(generate_fleet(8, seed=1, n_cities=2))
        return generate_jobs(2, seed=1, max_params=float(net.mem.sum()) / 48), net

    seen = []
    real_run_start = gnn_ablation.run_start

    def run_start(name, jobs, net, model):
        # The objects themselves, not their ids: a freed object's id may be reused.
        seen.append((name, memo.cache_info().currsize, net, net.nodes[0]))
        memo(len(seen))   # what a start could leave behind for the next one
        net.nodes[0].city_key   # noqa: B018 (a memoised property)
        return real_run_start(name, jobs, net, model)

    monkeypatch.setattr(gnn_ablation, "build", build)
    monkeypatch.setattr(gnn_ablation, "run_start", run_start)
    row = gnn_ablation.fleet_row({"key": "gen-test"}, Path("."), ckpt.load(), log=lambda _: None)
    assert [name for name, *_ in seen] == ["gnn", *gnn_ablation.NON_LEARNED]
    assert all(size == 0 for _, size, *_ in seen)
    assert len({id(net) for *_, net, _ in seen}) == len(seen)
    assert len({id(node) for *_, node in seen}) == len(seen)
    assert set(row["starts"]) == {"gnn", *gnn_ablation.NON_LEARNED}
    assert 0.0 <= row["cluster_rule_pair_accuracy"] <= 1.0


def test_the_cluster_rule_keeps_each_cluster_in_one_job():
    from planner.core.fleet import complete
    from planner.core.generate import generate_fleet, generate_jobs
    from planner.search import network_clusters

    net = complete(generate_fleet(24, seed=2, n_cities=4))
    jobs = generate_jobs(3, seed=2, max_params=float(net.mem.sum()) / 48)
    labels = network_clusters(net)
    scores = cluster_rule_scores(jobs, net, labels)
    choice = scores.argmax(axis=1)
    for c in np.unique(labels):
        assert len(set(choice[labels == c])) == 1
    assert np.unique(labels).size >= len(jobs) and set(choice) == set(range(len(jobs)))
    # one group per cluster: the rule is right on every pair; one group for all: it is wrong
    # on every pair across clusters
    assert cluster_rule_accuracy(labels, labels.copy()) == 1.0
    assert cluster_rule_accuracy(labels, np.zeros_like(labels)) < 1.0
