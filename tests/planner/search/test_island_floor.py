"""The island search's cheap bound (planner.search.islands.layout_floor_s): it never exceeds a
layout's job time, so the layouts it skips could not have won, and it does skip some."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from planner.core.costmodel import OuterSync, estimate
from planner.core.generate import generate_jobs, generate_network
from planner.core.jobs import Sync
from planner.search import islands, plan_search
from planner.search.clusters import network_clusters
from planner.search.islands import island_placement, layout_floor_s, stage_groups

AUTO = Sync("auto", 500, ("none", "bf16", "int8"))


@pytest.mark.parametrize("seed", range(4))
def test_the_floor_never_exceeds_a_layouts_job_time(seed):
    rng = np.random.default_rng(seed)
    net = generate_network(40, seed=seed, n_cities=6)
    job = min(generate_jobs(3, seed=seed), key=lambda j: j.params)
    checked = 0
    for _ in range(40):
        k = int(rng.integers(1, 7))
        sizes = rng.integers(1, 4, size=int(rng.integers(1, 4)))
        if k * int(sizes.sum()) > net.n:
            continue
        picked = rng.permutation(net.n)[:k * int(sizes.sum())]
        grids, start = [], 0
        for d in sizes:
            grids.append(stage_groups(net, picked[start:start + k * d], k))
            start += k * d
        b = int(rng.choice([1, 2, 4]))
        for outer in (OuterSync(10, "none", 0), OuterSync(500, "int8", 4)):
            p = island_placement(job, net, grids, b, outer)
            if p is None:
                continue
            est = estimate(p, net)
            assert layout_floor_s(job, net, grids, b) <= est.job_s * (1 + 1e-12)
            checked += 1
    assert checked > 0


def _auto_plan(net, jobs):
    return plan_search([dataclasses.replace(j, sync=AUTO) for j in jobs], net)


def test_skipping_layouts_below_the_floor_changes_no_plan_and_judges_fewer(monkeypatch):
    net = generate_network(48, seed=3, n_cities=8)
    jobs = generate_jobs(3, seed=3)
    judged = []
    judge = islands._Best._judge

    def counting(self, grids, b):
        judged.append(1)
        return judge(self, grids, b)

    monkeypatch.setattr(islands._Best, "_judge", counting)
    pruned = _auto_plan(net, jobs)
    with_floor = len(judged)
    monkeypatch.setattr(islands._Best, "cannot_win", lambda self, grids, b: False)
    judged.clear()
    full = _auto_plan(net, jobs)
    assert len(judged) > with_floor
    assert [(p.job.name, p.stages, p.islands, p.outer, p.micro_batch) for p in pruned.placements] \
        == [(p.job.name, p.stages, p.islands, p.outer, p.micro_batch) for p in full.placements]
    assert network_clusters(net).max() >= 1        # the fleet has several clusters to spread on
