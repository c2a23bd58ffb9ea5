"""Planning with the GNN: node-job probabilities -> groups -> Algorithm 1 -> (optionally) search
refinement.

The GNN's probabilities as a start of the search, for the benchmarks (``--method gnn`` is the
portfolio with this start added, planner.gnn.starts.plan_with_gnn_start: the GNN never replaces
the search there). ``plan_gnn(..., refine=False)`` is the diagnostic ``gnn-raw``, that start
decoded without refinement: groups read off the GNN's scores
(:func:`best_grouping_plan`: cluster-coherent groups, :func:`coherent_scores`, or the balanced
arg-max, whichever the cost model rates best), made feasible by Algorithm 1, each group placed
on its own by the search planner's ``best_placement``, with no moves of nodes between groups.
``refine=True`` hands that grouping to ``plan_search`` as its only starting point.
A checkpoint that is missing or damaged never stops planning: the search planner plans alone,
with a logged warning and a note in the plan.
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import replace
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from planner.core.costmodel import estimate_plan
from planner.core.fleet import Network
from planner.core.jobs import Job
from planner.core.plan import Plan
from planner.gnn import checkpoint as ckpt
from planner.gnn import features as F
from planner.search import Effort, best_placement, network_clusters, plan_search
from planner.search.groups import GridCache
from planner.search.algorithm1 import (Grouping, algorithm1, component_labels, fits,
                                       memory_threshold, take_until_fit)

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
    """(n, len(jobs) + 1) probabilities in the order of ``jobs``, last column idle; each row
    sums to 1. Any number of jobs."""
    if not jobs:
        return np.ones((net.n, 1))
    feats = F.featurize(jobs, net)
    data = F.to_data(feats, model.stats)
    pair_p, idle_p = model.model.forward_data(data)
    scores = np.zeros((net.n, len(jobs) + 1))
    node, job = data.pair_index.numpy()
    scores[node, job] = pair_p.numpy()
    scores[:, -1] = idle_p.numpy()
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


def _cluster_rtt(net: Network, labels: np.ndarray) -> np.ndarray:
    """(clusters, clusters) mean RTT over the links between two clusters (inf: no link)."""
    k = int(labels.max()) + 1
    onehot = np.zeros((net.n, k))
    onehot[np.arange(net.n), labels] = 1.0
    finite = np.isfinite(net.rtt_ms)
    rtt = np.where(finite, net.rtt_ms, 0.0)
    total = onehot.T @ rtt @ onehot
    count = onehot.T @ finite.astype(float) @ onehot
    out = np.where(count > 0, total / np.maximum(count, 1.0), np.inf)
    np.fill_diagonal(out, 0.0)
    return out


def _grow(job: Job, net: Network, home: int, target: float, labels, crtt, comps, free, free_thr,
          score, thr, widen: float = 1.0) -> tuple[np.ndarray, float]:
    """Free nodes for ``job`` from cluster ``home`` outwards (best score first within a cluster)
    until it fits and has ``target`` throughput; returns the nodes and the largest RTT between the
    clusters it needed to fit. Further clusters are added by least farthest-RTT to those taken; once the group
    fits, only clusters within ``widen`` times its current span are added (a group inside one
    cluster stays there: cross-cluster data parallelism rarely pays)."""
    comp = comps[np.flatnonzero(labels == home)[0]]
    chosen, taken, got, span, c = [home], [], 0.0, 0.0, home
    fit_span = None
    while True:
        cand = np.flatnonzero((labels == c) & free & (comps == comp))
        cand = cand[np.lexsort((cand, -score[cand]))]
        k = min(int(np.searchsorted(np.cumsum(thr[cand]), target - got)) + 1, cand.size)
        group = np.concatenate(taken) if taken else cand[:0]
        if not fits(job, net, np.concatenate([group, cand[:k]])):
            k = max(k, take_until_fit(job, net, group, cand).size)
        taken.append(cand[:k])
        got += float(thr[cand[:k]].sum())
        group = np.concatenate(taken)
        ok = fits(job, net, group)
        if ok and fit_span is None:
            fit_span = span
        if ok and got >= target:
            return group, fit_span
        far = crtt[chosen].max(axis=0)
        far[chosen] = np.inf
        far[free_thr <= 0] = np.inf
        nxt = int(np.argmin(far))
        if not np.isfinite(far[nxt]) or (ok and far[nxt] > widen * span):
            return group, (fit_span if ok else span)
        span = max(span, float(far[nxt]))
        chosen.append(nxt)
        c = nxt


def coherent_scores(jobs: list[Job], net: Network, scores: np.ndarray,
                    labels: np.ndarray | None = None, widen: float = 1.0) -> np.ndarray:
    """One-hot class scores that keep every job inside few nearby locality clusters.

    The GNN's scores say *where* each job belongs; arg-max over them scatters a job over cities
    (and leaves big jobs with nothing when their probability is spread thinly). Here each job, in
    order of FLOPs, gets a target throughput (its FLOP share of the fleet, at least what its
    memory threshold needs on average nodes) and a home cluster: the free cluster where its mean
    score times the throughput it can get there is largest. It takes the home's best-scoring
    free nodes up to the target; a job that does not fit in one cluster grows into the clusters
    nearest (by farthest RTT) to those taken, and among the 8 best homes the one whose group fits
    within the least RTT span wins (see :func:`_grow` for ``widen``). Leftover nodes of a cluster
    go to the job in that cluster with the longest estimated time (FLOPs / throughput); clusters
    no job uses stay idle. Algorithm 1 then makes the result feasible exactly as for raw scores.
    """
    n, num = net.n, len(jobs)
    out = np.zeros((n, num + 1))
    out[:, -1] = 1.0
    if num == 0 or n == 0:
        return out
    labels = network_clusters(net) if labels is None else labels
    crtt = _cluster_rtt(net, labels)
    comps = component_labels(net)
    thr = np.asarray(net.thr, dtype=float)
    mean_mem, mean_thr = float(net.mem.mean()), float(thr.mean())
    flops = np.array([j.total_flops for j in jobs], dtype=float)
    target = flops / flops.sum() * thr.sum()
    need = np.array([memory_threshold(j, min(j.layers, 16)) / mean_mem * mean_thr for j in jobs])
    target = np.maximum(target, need)
    owner = np.full(n, -1, dtype=np.int64)
    for j in sorted(range(num), key=lambda j: (-flops[j], j)):
        free = owner < 0
        if not free.any():
            break
        free_thr = np.bincount(labels[free], weights=thr[free], minlength=crtt.shape[0])
        mass = np.bincount(labels[free], weights=scores[free, j] * thr[free],
                           minlength=crtt.shape[0])
        # Home: where the job scores well per unit of throughput and can get its share. A job
        # too big for one cluster instead starts where its grown group spans the least RTT.
        density = mass / np.maximum(free_thr, 1e-30)
        key = density * np.minimum(free_thr, target[j])
        homes = [int(c) for c in np.argsort(-key)[:8] if free_thr[c] > 0]
        best = None
        for home in homes:
            group, span = _grow(jobs[j], net, home, target[j], labels, crtt, comps, free,
                                free_thr, scores[:, j], thr, widen)
            ok = group.size > 0 and fits(jobs[j], net, group)
            rank = (not ok, span if ok else 0.0, -float((scores[group, j] * thr[group]).sum()))
            if best is None or rank < best[0]:
                best = (rank, group)
            if ok and span == 0.0:
                break                     # one cluster holds it: the best-scoring such home
        if best is not None:
            owner[best[1]] = j
    # Leftovers of used clusters: to the slowest job already in that cluster.
    est = np.array([flops[j] / max(thr[owner == j].sum(), 1e-9) for j in range(num)])
    for c in np.unique(labels[owner < 0]):
        members = np.flatnonzero(labels == c)
        present = np.unique(owner[members][owner[members] >= 0])
        if present.size == 0:
            continue
        for i in members[owner[members] < 0][np.argsort(-thr[members[owner[members] < 0]])]:
            j = int(present[np.argmax(est[present])])
            owner[i] = j
            est[j] = flops[j] / thr[owner == j].sum()
    mine = owner >= 0
    out[mine] = 0.0
    out[np.flatnonzero(mine), owner[mine]] = 1.0
    return out


def grouping_plan(jobs: list[Job], net: Network, scores: np.ndarray,
                  method: str = "gnn-raw", effort: Effort = Effort.NORMAL,
                  grouping: Grouping | None = None, cache: GridCache | None = None
                  ) -> tuple[Plan, Grouping]:
    """Algorithm 1 on ``scores`` (or a ready ``grouping``), then the best placement of each job
    inside its own group at the search planner's ``effort`` (``cache``: the solver's answers,
    planner.search.groups.GridCache, shared between calls on ``net``)."""
    if grouping is None:
        grouping = algorithm1(jobs, net, scores)
    by_name = {j.name: j for j in jobs}
    placements = []
    for name, members in grouping.groups.items():
        placement, _ = best_placement(by_name[name], list(members), net, effort=effort,
                                      cache=cache)
        placements.append(_with_phase(placement, grouping.phase[name]))
    order = {j.name: k for k, j in enumerate(jobs)}
    placements.sort(key=lambda p: (p.phase, order[p.job.name]))
    return Plan(method=method, placements=placements, notes=grouping.remarks()), grouping


def best_grouping_plan(jobs: list[Job], net: Network, probs: np.ndarray,
                       widen: tuple[float, ...] = (1.0, 2.0),
                       full_effort: bool = True) -> tuple[Plan, Grouping]:
    """The grouping of least estimated makespan among the cluster-coherent ones (one per
    ``widen``) and the balanced arg-max of ``probs``; all are read off the GNN's scores, the cost
    model only picks among them. ``full_effort=False`` skips the second, full-effort
    placement of the closest candidates (for ``plan_gnn(refine=True)``, whose search refinement
    starts from the grouping and places every job again anyway)."""
    labels = network_clusters(net)
    cache = GridCache(net)   # the candidates share many groups
    candidates = [coherent_scores(jobs, net, probs, labels, widen=w) for w in widen]
    candidates.append(balance_scores(probs, net.thr))
    tried = []
    for scores in candidates:
        plan, grouping = grouping_plan(jobs, net, scores, method="gnn-raw", cache=cache)
        tried.append((estimate_plan(plan.placements, net).makespan_s, plan, grouping))
    tried.sort(key=lambda t: t[0])
    # The groupings close to the best once more, each job placed with the search's full effort
    # (normal effort can misjudge a big job's group; full effort on all is slow at scale).
    best = tried[0]
    for makespan, _, grouping in (tried if full_effort else []):
        if makespan > 1.5 * tried[0][0]:
            break
        plan, _ = grouping_plan(jobs, net, None, method="gnn-raw", effort=Effort.FULL,
                                grouping=grouping, cache=cache)
        full = estimate_plan(plan.placements, net).makespan_s
        if full < best[0]:
            best = (full, plan, grouping)
    return best[1], best[2]


def _with_phase(placement, phase: int):
    return replace(placement, phase=phase) if placement.phase != phase else placement


def _search(jobs, net, *, progress, initial=None, **kwargs) -> Plan:
    extra = {"initial": initial} if initial is not None else {}
    if progress is not None:
        extra["progress"] = progress
    return plan_search(jobs, net, **extra, **kwargs)


def plan_gnn(jobs: list[Job], net: Network, *,
             checkpoint: str | os.PathLike | None = None, refine: bool = True,
             progress: Callable | None = None, **search_kwargs) -> Plan:
    """Plan ``jobs`` on ``net`` with the GNN (see module docstring). ``checkpoint`` defaults to
    HULK_MODEL, else the shipped model. Extra keyword arguments go to ``plan_search``. It takes
    no seed: the GNN and the search are deterministic."""
    try:
        model = load_cached(checkpoint)
    except ckpt.CheckpointError as exc:
        log.warning("GNN unavailable, planning with search instead: %s", exc)
        plan = _search(jobs, net, progress=progress, **search_kwargs)
        plan.notes.append(f"GNN checkpoint unavailable ({exc}); planned by search instead")
        return plan
    raw, grouping = best_grouping_plan(jobs, net, node_scores(jobs, net, model),
                                       full_effort=not refine)
    if not refine:
        return raw
    plan = _search(jobs, net, progress=progress, initial=grouping, **search_kwargs)
    plan.method = "gnn"
    plan.notes = raw.notes + [n for n in plan.notes if n not in raw.notes]
    return plan
