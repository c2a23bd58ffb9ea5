"""The island search keeps pure answers in the run's GridCache (planner.search.islands): the
pairing of a cluster's stage groups, the mildest outer setting of a layout and the anchor's
one-island estimate are worked out once per run, and the plans are the same as without."""

from __future__ import annotations

import dataclasses

import numpy as np

from planner.core.generate import generate_jobs, generate_network
from planner.core.jobs import Sync
from planner.search import islands, plan_search
from planner.search.groups import GridCache
from planner.search.islands import _Best, fastest_setting, stage_groups

AUTO = Sync("auto", 500, ("none", "bf16", "int8"))
ISLAND_TABLES = ("island_pairs", "mildest", "islands_single")


def _fingerprint(plan):
    return [(p.job.name, p.phase, p.stages, p.micro_batch, p.islands, p.outer)
            for p in plan.placements]


def _counted(monkeypatch, name: str) -> list[int]:
    calls: list[int] = []
    real = getattr(islands, name)

    def counting(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(islands, name, counting)
    return calls


def test_kept_pairings_and_settings_give_the_same_plans_for_less_work(monkeypatch):
    net = generate_network(48, seed=3, n_cities=8)
    jobs = [dataclasses.replace(j, sync=AUTO) for j in generate_jobs(3, seed=3)]
    pairings = _counted(monkeypatch, "match_rows")
    settings = _counted(monkeypatch, "mildest")
    kept = plan_search(jobs, net)
    kept_counts = (len(pairings), len(settings))

    remember = GridCache.remember

    def forgetful(self, table, key, fn):
        return fn() if table in ISLAND_TABLES else remember(self, table, key, fn)

    monkeypatch.setattr(GridCache, "remember", forgetful)
    pairings.clear()
    settings.clear()
    fresh = plan_search(jobs, net)
    assert _fingerprint(kept) == _fingerprint(fresh)
    assert any(p.outer is not None for p in kept.placements)   # islands were placed
    assert kept_counts[0] < len(pairings)
    assert kept_counts[1] < len(settings)


def test_a_kept_pairing_is_read_only():
    net = generate_network(24, seed=1, n_cities=2)
    job = generate_jobs(1, seed=1)[0]
    cache = GridCache(net)
    grid = stage_groups(net, np.arange(8), 2)
    first = islands._paired(net, grid, job.activation_bytes(1), cache)
    again = islands._paired(net, grid.copy(), job.activation_bytes(1), cache)
    assert again is first and not first.flags.writeable


def test_a_layout_whose_floor_the_caller_checked_is_judged_without_the_floor(monkeypatch):
    net = generate_network(24, seed=1, n_cities=2)
    job = dataclasses.replace(generate_jobs(1, seed=1)[0], sync=AUTO)
    best = _Best(job, net, fastest_setting(AUTO), None)
    best.key = (1e-9, 1)          # a best so fast that the floor skips every layout
    grids = [stage_groups(net, np.arange(4), 1), stage_groups(net, np.arange(4, 8), 1)]
    judged: list[int] = []
    judge = _Best._judge
    monkeypatch.setattr(_Best, "_judge", lambda self, g, b: judged.append(1) or judge(self, g, b))
    assert not best.offer(grids, 1)
    assert judged == []
    best.offer(grids, 1, floor_checked=True)
    assert judged == [1]
