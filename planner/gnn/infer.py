"""Planning with the GNN: class scores -> Algorithm 1 -> (optionally) search refinement.

``plan_gnn(..., refine=False)`` is ``--method gnn-raw``: the GNN's grouping made feasible by
Algorithm 1, each group placed on its own by the search planner's ``best_placement``, with no
moves of nodes between groups. ``refine=True`` (``--method gnn``) hands that plan to
``plan_search`` as its starting point. A checkpoint that is missing or damaged never stops
planning: the search planner plans alone, with a logged warning and a note in the plan.
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from planner.core.fleet import Network
from planner.core.jobs import Job
from planner.core.plan import Plan
from planner.gnn import checkpoint as ckpt
from planner.gnn import features as F

log = logging.getLogger(__name__)

_cache: dict[tuple[str, float], ckpt.Checkpoint] = {}
_cache_lock = threading.Lock()


def load_cached(path: str | os.PathLike | None = None) -> ckpt.Checkpoint:
    """:func:`checkpoint.load`, memoised by path and modification time (plans in serve reuse it)."""
    p = Path(path) if path is not None else ckpt.default_path()
    key = (str(p.resolve()), p.stat().st_mtime if p.is_file() else -1.0)
    with _cache_lock:
        if key not in _cache:
            _cache.clear()
            _cache[key] = ckpt.load(p)
        return _cache[key]


@torch.no_grad()
def node_scores(jobs: list[Job], net: Network, model: ckpt.Checkpoint) -> np.ndarray:
    """(n, len(jobs) + 1) class probabilities in the order of ``jobs``, last column idle.

    Jobs beyond the model's slots get score 0 everywhere (Algorithm 1 then grows them from idle
    nodes or lets them wait)."""
    feats = F.featurize(jobs, net)
    data = F.to_data(feats, model.stats)
    probs = torch.softmax(model.model.forward_data(data), dim=-1).numpy().astype(float)
    scores = np.zeros((net.n, len(jobs) + 1))
    for slot, ji in enumerate(feats.slot_jobs):
        scores[:, ji] = probs[:, slot]
    scores[:, -1] = probs[:, F.MAX_SLOTS]
    return scores


def balance_scores(scores: np.ndarray, thr: np.ndarray, iterations: int = 30) -> np.ndarray:
    """Rescale score columns so that the arg-max assignment gives each class about the
    throughput the soft scores give it (sum_i thr_i p_ij).

    Arg-max over probabilities starves classes whose probability is spread thinly (a job that is
    second choice on many nodes gets almost none of them); the GNN's soft outputs carry the
    proportions it learned from the teacher, so the hard assignment is nudged towards them.
    Only the GNN's own outputs and node throughputs are used.
    """
    scores = np.asarray(scores, dtype=float)
    thr = np.asarray(thr, dtype=float)
    soft = thr @ scores                                   # (classes,)
    active = soft > 0
    weights = np.ones(scores.shape[1])
    best, best_err = scores, np.inf
    for _ in range(iterations):
        scaled = scores * weights
        choice = scaled.argmax(axis=1)
        hard = np.bincount(choice, weights=thr, minlength=scores.shape[1])
        err = float(np.abs(hard - soft)[active].sum())
        if err < best_err:
            best, best_err = scaled, err
        ratio = np.where(active, (soft + 1e-9) / (hard + 1e-9 * soft.max()), 1.0)
        weights *= np.clip(ratio, 0.5, 2.0) ** 0.5
    return best / best.sum(axis=1, keepdims=True).clip(min=1e-12)


def grouping_plan(jobs: list[Job], net: Network, scores: np.ndarray,
                  method: str = "gnn-raw") -> tuple[Plan, "object"]:
    """Algorithm 1 on ``scores``, then the best placement of each job inside its own group."""
    from planner.core.algorithm1 import algorithm1
    from planner.core.search import best_placement

    grouping = algorithm1(jobs, net, scores)
    by_name = {j.name: j for j in jobs}
    placements = []
    for name, members in grouping.groups.items():
        placement, _ = best_placement(by_name[name], list(members), net)
        placements.append(_with_phase(placement, grouping.phase[name]))
    order = {j.name: k for k, j in enumerate(jobs)}
    placements.sort(key=lambda p: (p.phase, order[p.job.name]))
    return Plan(method=method, placements=placements, notes=list(grouping.notes)), grouping


def _with_phase(placement, phase: int):
    from dataclasses import replace

    return replace(placement, phase=phase) if placement.phase != phase else placement


def _search(jobs, net, *, seed, progress, initial=None, **kwargs) -> Plan:
    from planner.core.search import plan_search

    extra = {"initial": initial} if initial is not None else {}
    if progress is not None:
        extra["progress"] = progress
    return plan_search(jobs, net, seed=seed, **extra, **kwargs)


def plan_gnn(jobs: list[Job], net: Network, *, seed: int = 0,
             checkpoint: str | os.PathLike | None = None, refine: bool = True,
             progress: Callable | None = None, **search_kwargs) -> Plan:
    """Plan ``jobs`` on ``net`` with the GNN (see module docstring). ``checkpoint`` defaults to
    HULK_MODEL, else the shipped model. Extra keyword arguments go to ``plan_search``."""
    try:
        model = load_cached(checkpoint)
    except ckpt.CheckpointError as exc:
        log.warning("GNN unavailable, planning with search instead: %s", exc)
        plan = _search(jobs, net, seed=seed, progress=progress, **search_kwargs)
        plan.notes.append(f"GNN checkpoint unavailable ({exc}); planned by search instead")
        return plan
    scores = balance_scores(node_scores(jobs, net, model), net.thr)
    raw, grouping = grouping_plan(jobs, net, scores, method="gnn-raw")
    if len(jobs) > F.MAX_SLOTS:
        raw.notes.append(f"the GNN scores the {F.MAX_SLOTS} largest jobs; "
                         f"{len(jobs) - F.MAX_SLOTS} smaller ones were grouped from idle nodes")
    if not refine:
        return raw
    plan = _search(jobs, net, seed=seed, progress=progress, initial=grouping, **search_kwargs)
    plan.method = "gnn"
    plan.notes = raw.notes + [n for n in plan.notes if n not in raw.notes]
    return plan
