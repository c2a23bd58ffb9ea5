"""Checks the search's tests share: a plan is valid, two plans are the same placement."""

from __future__ import annotations

import math

from planner.core.costmodel import estimate, problems


def assert_valid(plan, net, jobs):
    """Memory, disjoint nodes per phase, contiguous layers, equal replicas, every job once."""
    assert sorted(p.job.name for p in plan.placements) == sorted(j.name for j in jobs)
    by_phase: dict[int, list[int]] = {}
    for p in plan.placements:
        assert problems(p, net) == [], problems(p, net)
        assert p.stages[0].lo == 0 and p.stages[-1].hi == p.job.layers
        assert all(a.hi == b.lo for a, b in zip(p.stages, p.stages[1:]))
        assert len({len(st.nodes) for st in p.stages}) == 1
        by_phase.setdefault(p.phase, []).extend(p.nodes)
        assert math.isfinite(estimate(p, net).job_s)
    for phase, nodes in by_phase.items():
        assert len(nodes) == len(set(nodes)), f"phase {phase} reuses a node"
    assert sorted(by_phase) == list(range(len(by_phase)))


def same_plan(a, b) -> bool:
    """The same jobs on the same phases, micro-batches and stages (nodes and layer ranges)."""
    key = lambda plan: [(p.job.name, p.phase, p.micro_batch, p.stages) for p in plan.placements]
    return key(a) == key(b)
