"""Training data: generated fleets and job sets labelled by the search planner (the teacher).

Instance ``i`` of a data set with seed ``S`` is a pure function of ``(S, i)``: fleet size
log-uniform in [min_nodes, max_nodes], a missing-link fraction, and 1..8 catalog jobs that fit the
fleet's memory. Its label is the teacher's plan: each node's class is the slot of the job it
serves in the earliest phase it appears in, else idle. Labels are the expensive part, so they are
cached on disk, one file per instance, keyed by (data version, seed, index, teacher budget);
features are recomputed (milliseconds) from the regenerated network.
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

from planner.core.fleet import Network
from planner.core.jobs import Job
from planner.core.plan import Plan
from planner.gnn import features as F
from planner.search import plan_search

log = logging.getLogger(__name__)

DATA_VERSION = 1
DEFAULT_TEACHER_BUDGET_S = 60.0

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


def instance_spec(seed: int, index: int, min_nodes: int = 8, max_nodes: int = 500) -> InstanceSpec:
    rng = np.random.default_rng([seed, index, DATA_VERSION])
    n = int(round(math.exp(rng.uniform(math.log(min_nodes), math.log(max_nodes + 0.49)))))
    n = max(min_nodes, min(max_nodes, n))
    return InstanceSpec(seed, index, n, int(rng.integers(2**31)), float(rng.uniform(0.0, 0.5)),
                        int(rng.integers(1, F.MAX_SLOTS + 1)), int(rng.integers(2**31)))


def build_instance(spec: InstanceSpec) -> tuple[list[Job], Network]:
    from planner.core.generate import generate_jobs, generate_network

    net = generate_network(spec.nodes, seed=spec.fleet_seed, missing_fraction=spec.missing_fraction)
    # Jobs that fit: a job whose state needs more than a third of the fleet's memory is left out,
    # so small fleets get small jobs and the teacher always has a plan.
    max_params = float(net.mem.sum()) / 16.0 / 3.0
    jobs = generate_jobs(spec.n_jobs, seed=spec.jobs_seed, max_params=max_params)
    return jobs, net


def labels_from_plan(plan: Plan, jobs: list[Job], n: int, slot_jobs: list[int]) -> np.ndarray:
    """Node -> slot of the job it serves in its earliest phase; idle (MAX_SLOTS) otherwise."""
    slot_of_name = {jobs[ji].name: s for s, ji in enumerate(slot_jobs)}
    labels = np.full(n, F.MAX_SLOTS, dtype=np.int64)
    for placement in sorted(plan.placements, key=lambda p: p.phase):
        slot = slot_of_name.get(placement.job.name)
        if slot is None:
            continue
        for i in placement.nodes:
            if labels[i] == F.MAX_SLOTS:
                labels[i] = slot
    return labels


def search_teacher(jobs: list[Job], net: Network, seed: int, budget_s: float) -> Plan:
    """The teacher: the search planner with a wall-clock cap of ``budget_s``."""
    return plan_search(jobs, net, seed=seed, budget_s=budget_s)


@dataclass
class Example:
    spec: InstanceSpec
    feats: F.Featurized
    labels: np.ndarray
    teacher_makespan_s: float


def _cache_path(cache: Path, spec: InstanceSpec, budget_s: float) -> Path:
    return cache / f"v{DATA_VERSION}" / f"s{spec.seed}-i{spec.index:05d}-n{spec.nodes}-b{budget_s:g}.pt"


def _label_one(args: tuple[InstanceSpec, float, Teacher]) -> tuple[np.ndarray, float] | None:
    spec, budget_s, teacher = args
    from planner.core.costmodel import estimate_plan

    jobs, net = build_instance(spec)
    try:
        plan = teacher(jobs, net, spec.index, budget_s)
    except Exception as exc:  # an instance the teacher cannot plan is skipped, not fatal
        log.warning("teacher failed on instance %d (%d nodes): %s", spec.index, spec.nodes, exc)
        return None
    order = F.slot_order(jobs)[: F.MAX_SLOTS]
    labels = labels_from_plan(plan, jobs, net.n, order)
    return labels, float(estimate_plan(plan.placements, net).makespan_s)


def load_examples(seed: int, count: int, *, cache: Path | None = None,
                  budget_s: float = DEFAULT_TEACHER_BUDGET_S, teacher: Teacher = search_teacher,
                  workers: int = 2, start: int = 0, min_nodes: int = 8, max_nodes: int = 500,
                  progress: Callable[[int, int], None] | None = None) -> list[Example]:
    """``count`` labelled instances ``start..start+count-1`` of data set ``seed``; labels from the
    cache where present, else from ``teacher`` (in ``workers`` processes) and written to it."""
    cache = cache or default_cache_dir()
    specs = [instance_spec(seed, i, min_nodes, max_nodes) for i in range(start, start + count)]
    labels: dict[int, tuple[np.ndarray, float] | None] = {}
    todo = []
    for spec in specs:
        path = _cache_path(cache, spec, budget_s)
        if path.is_file():
            try:
                stored = torch.load(path, weights_only=True)
                labels[spec.index] = (stored["labels"].numpy(), float(stored["makespan_s"]))
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
        tmp = path.with_suffix(".tmp")
        torch.save({"labels": torch.from_numpy(result[0]), "makespan_s": result[1],
                    "spec": spec.__dict__}, tmp)
        tmp.replace(path)

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
        examples.append(Example(spec, F.featurize(jobs, net), result[0], result[1]))
    return examples
