"""Planning on very large fleets: the search on the servers of the best sites only.

The search's work grows with the servers it considers (clusters, growth sets, stage grids over
n x n matrices), while a set of jobs can use only so many of them. Above ``SCALE_NODE_LIMIT``
servers a planner is given a sub-fleet: whole sites, the ones with the most compute first
(a site's servers talk over cheap links, which is what the search looks for), up to the limit;
the plan is then mapped back to the whole fleet's node indices and says so in a note. Fleets up
to the limit are planned exactly as before.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

from planner.core.fleet import Network
from planner.core.plan import Plan

SCALE_NODE_LIMIT = 1500


def site_numbers(net: Network) -> np.ndarray:
    """Each node's site as a number (its site, else its city; a node with neither stands alone)."""
    code: dict[str, int] = {}
    out = np.empty(net.n, dtype=np.int64)
    for i, node in enumerate(net.nodes):
        key = node.site_key
        out[i] = code.setdefault(key, len(code)) if key is not None else -1 - i
    return out


def candidate_nodes(net: Network, limit: int = SCALE_NODE_LIMIT) -> np.ndarray:
    """Sorted indices of at most ``limit`` nodes: whole sites in order of their summed
    throughput (ties by first node), the last one cut to its fastest servers."""
    if net.n <= limit:
        return np.arange(net.n)
    site = site_numbers(net)
    uniq, first, inverse = np.unique(site, return_index=True, return_inverse=True)
    total = np.bincount(inverse, weights=net.thr, minlength=len(uniq))
    order = np.lexsort((first, -total))
    chosen: list[np.ndarray] = []
    room = limit
    for s in order:
        members = np.flatnonzero(inverse == s)
        if len(members) > room:
            members = members[np.argsort(-net.thr[members], kind="stable")[:room]]
        chosen.append(members)
        room -= len(members)
        if room <= 0:
            break
    return np.sort(np.concatenate(chosen))


def sub_network(net: Network, keep: np.ndarray) -> Network:
    """The network of the nodes ``keep`` (indices renumbered 0..len(keep)-1)."""
    grid = np.ix_(keep, keep)
    return Network(tuple(net.nodes[i] for i in keep), net.rtt_ms[grid], net.bw[grid],
                   net.imputed[grid])


def map_plan(plan: Plan, keep: np.ndarray) -> Plan:
    """``plan`` made on ``sub_network(net, keep)`` with the whole network's node indices."""
    back = keep.tolist()
    placements = [dataclasses.replace(p, stages=tuple(
        dataclasses.replace(st, nodes=tuple(back[i] for i in st.nodes)) for st in p.stages))
        for p in plan.placements]
    return dataclasses.replace(plan, placements=placements)


def plan_at_scale(planner: Callable[..., Plan], jobs, net: Network, *,
                  limit: int = SCALE_NODE_LIMIT, **kwargs) -> Plan:
    """``planner(jobs, net, **kwargs)``, on the best sites' servers when the fleet is larger
    than ``limit`` (see the module's docstring)."""
    if net.n <= limit:
        return planner(jobs, net, **kwargs)
    keep = candidate_nodes(net, limit)
    plan = map_plan(planner(jobs, sub_network(net, keep), **kwargs), keep)
    sites = len(set(site_numbers(net)[keep].tolist()))
    plan.notes.append(f"fleet of {net.n} servers: planned on the {len(keep)} servers of the "
                      f"{sites} site(s) with the most compute (limit {limit})")
    return plan
