"""Training data: generated fleets and job sets labelled by the best of several refined starts.

Instance ``i`` of a data set with seed ``S`` is a pure function of ``(S, i)``: fleet size
log-uniform in [min_nodes, max_nodes], a missing-link fraction, and 1..MAX_TRAIN_JOBS catalog
jobs that fit the fleet's memory. Its label is the plan of least makespan (cost model) among the
search's refinement started from the hand heuristic and from ``RANDOM_STARTS`` seeded random
groupings (planner.gnn.starts): each node's *group* (the job it serves in its earliest phase,
-1 idle) and each job's share of the fleet's throughput. The training loss only asks which nodes
share a group, which are idle and how much throughput each job gets, so it does not depend on
how jobs or equal nodes are numbered (see planner.gnn.train). Labels are the expensive part, so
they are cached on disk, one file per instance, keyed by (data version, seed, index, budget).
"""

from __future__ import annotations

import logging
import math
import os
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from hulk.atomic import atomic_file
from planner.core.fleet import Network
from planner.core.jobs import Job
from planner.core.plan import Plan
from planner.gnn import features as F

log = logging.getLogger(__name__)

DATA_VERSION = 2
DEFAULT_TEACHER_BUDGET_S = 20.0
RANDOM_STARTS = 2
MAX_TRAIN_JOBS = 12

Teacher = Callable[[list[Job], Network, int, float], Plan]


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "hulk" / "gnn-labels"


@dataclass(frozen=True)
class InstanceSpec:
    seed: int
    index: int
    nodes: int
    fleet_seed: int
    missing_fraction: float
    n_jobs: int
    jobs_seed: int


def instance_spec(seed: int, index: int, min_nodes: int = 8, max_nodes: int = 64) -> InstanceSpec:
    rng = np.random.default_rng([seed, index, DATA_VERSION])
    n = int(round(math.exp(rng.uniform(math.log(min_nodes), math.log(max_nodes + 0.49)))))
    n = max(min_nodes, min(max_nodes, n))
    return InstanceSpec(seed, index, n, int(rng.integers(2**31)), float(rng.uniform(0.0, 0.5)),
                        int(rng.integers(1, min(MAX_TRAIN_JOBS, max(2, n // 3)) + 1)),
                        int(rng.integers(2**31)))


def build_instance(spec: InstanceSpec) -> tuple[list[Job], Network]:
    from planner.core.generate import generate_jobs, generate_network

    net = generate_network(spec.nodes, seed=spec.fleet_seed, missing_fraction=spec.missing_fraction)
    # Jobs that fit: a job whose state needs more than a third of the fleet's memory is left out,
    # so small fleets get small jobs and the teacher always has a plan.
    max_params = float(net.mem.sum()) / 16.0 / 3.0
    jobs = generate_jobs(spec.n_jobs, seed=spec.jobs_seed, max_params=max_params)
    return jobs, net


def labels_from_plan(plan: Plan, jobs: list[Job], net: Network) -> tuple[np.ndarray, np.ndarray]:
    """(group per node: index of the job it serves in its earliest phase, -1 idle;
    share per job: its nodes' share of the fleet's throughput). Jobs with equal features (equal
    up to their names) get the mean of their shares, so the label does not depend on which of
    two identical jobs got which group."""
    index = {j.name: k for k, j in enumerate(jobs)}
    groups = np.full(net.n, -1, dtype=np.int64)
    shares = np.zeros(len(jobs))
    total = max(float(net.thr.sum()), 1e-30)
    for placement in sorted(plan.placements, key=lambda p: p.phase):
        k = index.get(placement.job.name)
        if k is None:
            continue
        nodes = np.asarray(list(placement.nodes), dtype=np.int64)
        shares[k] += float(net.thr[nodes].sum()) / total
        fresh = nodes[groups[nodes] < 0]
        groups[fresh] = k
    signature: dict[tuple, list[int]] = {}
    for k, j in enumerate(jobs):
        key = (j.params, j.layers, j.total_flops, j.state_bytes, j.global_batch, j.micro_batch)
        signature.setdefault(key, []).append(k)
    for members in signature.values():
        shares[members] = shares[members].mean()
    return groups, shares


def best_of_starts(jobs: list[Job], net: Network, seed: int, budget_s: float,
                   random_starts: int = RANDOM_STARTS) -> tuple[Plan, str]:
    """The teacher: plan_search refined from the heuristic and from ``random_starts`` seeded
    random groupings; the plan of least makespan and the name of its start."""
    from planner.core.costmodel import estimate_plan
    from planner.gnn.starts import random_scores
    from planner.search import SearchOptions, network_clusters, plan_search

    labels = network_clusters(net)
    best = None
    starts = [("heuristic", None)] + [(f"random-{r}", random_scores(jobs, net, seed * 31 + r, labels))
                                      for r in range(random_starts)]
    for name, scores in starts:
        plan = plan_search(jobs, net, options=SearchOptions(budget_s=budget_s), initial=scores)
        makespan = float(estimate_plan(plan.placements, net).makespan_s)
        if best is None or makespan < best[0] * (1 - 1e-9):
            best = (makespan, plan, name)
    return best[1], best[2]


def search_teacher(jobs: list[Job], net: Network, seed: int, budget_s: float) -> Plan:
    """The default teacher: :func:`best_of_starts`."""
    return best_of_starts(jobs, net, seed, budget_s)[0]


def quick_teacher(jobs: list[Job], net: Network, seed: int, budget_s: float) -> Plan:
    """The search from the heuristic start alone (serve's fine-tuning: a third of the cost)."""
    return best_of_starts(jobs, net, seed, budget_s, random_starts=0)[0]


@dataclass
class Example:
    spec: InstanceSpec
    feats: F.Featurized
    groups: np.ndarray
    shares: np.ndarray
    teacher_makespan_s: float


def _cache_path(cache: Path, spec: InstanceSpec, budget_s: float) -> Path:
    return cache / f"v{DATA_VERSION}" / f"s{spec.seed}-i{spec.index:05d}-n{spec.nodes}-b{budget_s:g}.pt"


def _label_one(args: tuple[InstanceSpec, float, Teacher]):
    spec, budget_s, teacher = args
    from planner.core.costmodel import estimate_plan

    jobs, net = build_instance(spec)
    try:
        plan = teacher(jobs, net, spec.index, budget_s)
    except Exception as exc:  # an instance the teacher cannot plan is skipped, not fatal
        log.warning("teacher failed on instance %d (%d nodes): %s", spec.index, spec.nodes, exc)
        return None
    groups, shares = labels_from_plan(plan, jobs, net)
    return groups, shares, float(estimate_plan(plan.placements, net).makespan_s)


def load_examples(seed: int, count: int, *, cache: Path | None = None,
                  budget_s: float = DEFAULT_TEACHER_BUDGET_S, teacher: Teacher = search_teacher,
                  workers: int = 2, start: int = 0, min_nodes: int = 8, max_nodes: int = 64,
                  progress: Callable[[int, int], None] | None = None) -> list[Example]:
    """``count`` labelled instances ``start..start+count-1`` of data set ``seed``; labels from the
    cache where present, else from ``teacher`` (in ``workers`` processes) and written to it."""
    cache = cache or default_cache_dir()
    specs = [instance_spec(seed, i, min_nodes, max_nodes) for i in range(start, start + count)]
    labels: dict[int, tuple | None] = {}
    todo = []
    for spec in specs:
        path = _cache_path(cache, spec, budget_s)
        if path.is_file():
            try:
                stored = torch.load(path, weights_only=True)
                labels[spec.index] = (stored["groups"].numpy(), stored["shares"].numpy(),
                                      float(stored["makespan_s"]))
                continue
            except Exception as exc:  # a damaged cache file is recomputed
                log.warning("ignoring unreadable cache file %s: %s", path, exc)
        todo.append(spec)
    done = len(specs) - len(todo)
    if progress:
        progress(done, len(specs))

    def store(spec: InstanceSpec, result) -> None:
        nonlocal done
        labels[spec.index] = result
        done += 1
        if progress:
            progress(done, len(specs))
        if result is None:
            return
        path = _cache_path(cache, spec, budget_s)
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_file(path, binary=True) as handle:
            torch.save({"groups": torch.from_numpy(result[0]),
                        "shares": torch.from_numpy(result[1]), "makespan_s": result[2],
                        "spec": spec.__dict__}, handle)

    # Largest first so the slow instances do not end up alone at the tail.
    todo.sort(key=lambda s: -s.nodes)
    if workers > 1 and len(todo) > 1:
        import multiprocessing as mp

        with ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn")) as pool:
            for spec, result in zip(todo, pool.map(_label_one, [(s, budget_s, teacher) for s in todo])):
                store(spec, result)
    else:
        for spec in todo:
            store(spec, _label_one((spec, budget_s, teacher)))

    examples = []
    for spec in specs:
        result = labels[spec.index]
        if result is None:
            continue
        jobs, net = build_instance(spec)
        examples.append(Example(spec, F.featurize(jobs, net), *result))
    return examples
