"""The GNN ablation's controls and its fair-timing helpers (bench.gnn_ablation).

- The *cluster rule*, "same locality cluster, same job": as a pair rule (its balanced pair
  accuracy, next to the GNN's) and as a start (:func:`cluster_rule_scores`).
- :func:`plan_digest`: whether two decoded plans are the same plan (the GNN's decoded plan
  against the uniform scores' one).
- :func:`reset_run_caches`: what a start may carry over from the start before it in the same
  process: memoised functions (functools caches) of the planner's search, GNN and core modules
  and the GNN's loaded-checkpoint memo. The network's nodes memoise their city and site
  (``cached_property``), so each start also gets a freshly built fleet.
"""

from __future__ import annotations

import hashlib
import json
import sys

import numpy as np

CACHED_PACKAGES = ("planner.search", "planner.gnn", "planner.core")


def cluster_rule_scores(jobs, net, labels: np.ndarray | None = None) -> np.ndarray:
    """One-hot class scores that keep each locality cluster in one job: jobs, most FLOPs first,
    each take the largest cluster left; the clusters left over, largest throughput first, go
    to the job furthest below its FLOP share of the fleet's throughput (ties by job order).
    No learning and no search."""
    from planner.search import network_clusters

    labels = network_clusters(net) if labels is None else labels
    thr = np.asarray(net.thr, dtype=float)
    flops = np.array([j.total_flops for j in jobs], dtype=float)
    target = flops / flops.sum() * thr.sum()
    got = np.zeros(len(jobs))
    cluster_thr = np.bincount(labels, weights=thr)
    scores = np.zeros((net.n, len(jobs) + 1))
    order = sorted(range(cluster_thr.size), key=lambda c: (-cluster_thr[c], c))
    first = sorted(range(len(jobs)), key=lambda j: (-flops[j], j))
    for k, c in enumerate(order):
        j = first[k] if k < len(first) else int(np.argmax(target - got))
        scores[labels == c, j] = 1.0
        got[j] += cluster_thr[c]
    return scores


def cluster_rule_accuracy(labels: np.ndarray, groups: np.ndarray) -> float:
    """Balanced accuracy of "same group?" over node pairs when the answer is "same locality
    cluster" (planner.gnn.train.pair_accuracy's measure: mean hit rate on same-group pairs and
    on the other pairs)."""
    pred = labels[:, None] == labels[None, :]
    true = (groups[:, None] == groups[None, :]) & (groups[:, None] >= 0)
    off = ~np.eye(len(groups), dtype=bool)
    rates = [float((pred == true)[m & off].mean()) for m in (true, ~true) if (m & off).any()]
    return float(np.mean(rates)) if rates else 1.0


def plan_digest(plan) -> str:
    """A digest of a plan's placements (job, phase, micro-batch, stages' layers and nodes)."""
    rows = sorted([p.job.name, p.phase, p.micro_batch,
                   [[s.lo, s.hi, sorted(int(i) for i in s.nodes)] for s in p.stages]]
                  for p in plan.placements)
    return hashlib.sha256(json.dumps(rows).encode()).hexdigest()[:16]


def reset_run_caches() -> list[str]:
    """Clear every per-process memo a start could inherit from the start before it (module
    docstring); returns the names cleared."""
    cleared = []
    for name, module in list(sys.modules.items()):
        if module is None or not name.startswith(CACHED_PACKAGES):
            continue
        for attr, value in list(vars(module).items()):
            if callable(getattr(value, "cache_clear", None)) and hasattr(value, "cache_info"):
                value.cache_clear()
                cleared.append(f"{name}.{attr}")
    infer = sys.modules.get("planner.gnn.infer")
    if infer is not None:
        with infer._cache_lock:
            if infer._cache:
                cleared.append("planner.gnn.infer._cache")
            infer._cache.clear()
    return cleared
