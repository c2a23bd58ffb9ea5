"""Starts for the search's refinement: class-score arrays (n x (jobs + 1), last column idle).

The non-learned starts the GNN is measured against, and that label the training data:

- :func:`uniform_scores`: every class alike (Algorithm 1 then breaks ties by column order);
- :func:`random_scores`: a seeded random grouping: each locality cluster goes to one job drawn
  with probability proportional to its FLOPs (or stays idle with probability 1/(jobs + 1)),
  plus small per-node noise;
- the hand heuristic, :func:`planner.search.heuristic_scores`.

:func:`decode` turns any of them, or the GNN's probabilities, into a grouping and a plan the same
way (``gnn-raw``'s decoder), so that starts are compared on equal terms.

:func:`plan_with_gnn_start` is ``--method gnn``: the default portfolio with the GNN's scores as
one more start after the built-in ones, so it only adds a candidate and its plan is never longer
than the portfolio's.
"""

from __future__ import annotations

import os

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


def plan_with_gnn_start(jobs: list[Job], net: Network, *,
                        checkpoint: str | os.PathLike | None = None, **portfolio_options):
    """The portfolio's plan (planner.search.portfolio.plan_portfolio with ``portfolio_options``)
    with the GNN's scores added as one more start (``checkpoint``: HULK_MODEL, else the shipped
    model); an unusable checkpoint leaves the start out with a warning."""
    from planner.gnn import checkpoint as ckpt
    from planner.methods import gnn_starts
    from planner.search.portfolio import plan_portfolio

    path = checkpoint if checkpoint is not None else ckpt.default_path()
    plan = plan_portfolio(jobs, net, extra_starts=gnn_starts(list(jobs), net, path),
                          **portfolio_options)
    plan.method = "gnn"
    return plan
