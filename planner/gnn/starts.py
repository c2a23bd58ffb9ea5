"""Starts for the search's refinement: class-score arrays (n x (jobs + 1), last column idle).

The non-learned starts the GNN is measured against, and that label the training data:

- :func:`uniform_scores`: every class alike (Algorithm 1 then breaks ties by column order);
- :func:`random_scores`: a seeded random grouping: each locality cluster goes to one job drawn
  with probability proportional to its FLOPs (or stays idle with probability 1/(jobs + 1)),
  plus small per-node noise;
- the hand heuristic, :func:`planner.search.heuristic_scores`.

:func:`decode` turns any of them, or the GNN's probabilities, into a grouping and a plan the same
way (``gnn-raw``'s decoder), so that starts are compared on equal terms.
"""

from __future__ import annotations

import numpy as np

from planner.core.fleet import Network
from planner.core.jobs import Job
from planner.search import network_clusters


def uniform_scores(jobs: list[Job], net: Network) -> np.ndarray:
    return np.full((net.n, len(jobs) + 1), 1.0 / (len(jobs) + 1))


def random_scores(jobs: list[Job], net: Network, seed: int,
                  labels: np.ndarray | None = None) -> np.ndarray:
    """A seeded random cluster-coherent grouping as one-hot-ish scores (see module docstring)."""
    rng = np.random.default_rng(seed)
    labels = network_clusters(net) if labels is None else labels
    num = len(jobs)
    flops = np.array([j.total_flops for j in jobs], dtype=float)
    p = np.append(flops / flops.sum() * num / (num + 1), 1.0 / (num + 1))
    p /= p.sum()
    scores = rng.random((net.n, num + 1)) * 0.1
    for c in np.unique(labels):
        scores[labels == c, rng.choice(num + 1, p=p)] += 1.0
    return scores


def decode(jobs: list[Job], net: Network, scores: np.ndarray, *, full_effort: bool = True):
    """(plan, grouping) read off ``scores`` by ``gnn-raw``'s decoder (:func:`infer.best_grouping_plan`)."""
    from planner.gnn.infer import best_grouping_plan

    return best_grouping_plan(jobs, net, scores, full_effort=full_effort)
