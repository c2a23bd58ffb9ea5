"""Recovery decisions: a node that goes silent loses its role; only its jobs are re-planned.

Plain values in, plain values out (the serve process's Replanner, planner/service/recovery.py,
does the reading and pushing):

- :func:`down_nodes`: nodes whose last heartbeat is older than the timeout.
- :func:`jobs_using`: the jobs of a plan that have a role on any of those nodes.
- :func:`replan_jobs`: keep every other job's placement as it is; plan the affected jobs with the
  given planner (a ``planner.methods.Planner``) on a sub-network of the *free* nodes (neither down nor used by a kept job), and
  map the result back to the full network's indices. Serve's recovery first tries the
  warm-started repair (planner/search/repair.py, ``repair_jobs``: same inputs, same result
  type) and uses this only for the jobs it cannot repair.
- :func:`free_nodes` and :func:`plan_on`: the nodes a re-plan may use, and jobs planned on them
  (the job lifecycle places queued jobs with them too).

Growth: a node that registers joins the store's fleet and is used by the next plan (``plan
--push`` or the next recovery's free nodes); a running plan is not reshuffled for a newcomer,
since that would restart jobs that are fine.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from hulk.errors import PlanningError
from planner.core.costmodel import Placement, Stage
from planner.core.fleet import Network
from planner.core.jobs import Job
from planner.core.plan import Plan, Unplaced

if TYPE_CHECKING:
    from planner.methods import Planner


def down_nodes(last_seen_ms: Mapping[str, int | None], now_ms: int, timeout_s: float) -> set[str]:
    """Nodes not heard from for longer than ``timeout_s`` (never heard from counts as down)."""
    limit = now_ms - timeout_s * 1000.0
    return {node for node, seen in last_seen_ms.items() if seen is None or seen < limit}


def jobs_using(plan: Plan, net: Network, node_ids: Iterable[str]) -> set[str]:
    """Names of the plan's jobs with a role on any of ``node_ids``."""
    wanted = {net.index[n] for n in node_ids if n in net.index}
    return {p.job.name for p in plan.placements if wanted.intersection(p.nodes)}


def sub_network(net: Network, keep: list[int]) -> Network:
    """The network restricted to node indices ``keep`` (in that order)."""
    return net.subset(keep)


@dataclass
class Replan:
    plan: Plan                     # over the full network's indices
    replanned: list[str]           # jobs placed again (new roles)
    kept: list[str]                # jobs whose placement did not change
    lost: list[str]                # affected jobs that could not be placed again


def replan_jobs(plan: Plan, net: Network, affected: Iterable[Job], down: Iterable[str], *,
                search: Planner, seed: int = 0) -> Replan:
    """Re-plan ``affected`` jobs with ``search`` on the nodes neither ``down`` nor used by the
    others.

    ``plan`` holds the placements to keep (affected jobs in it are dropped first); its unplaced
    jobs stay unplaced.
    """
    affected = list(affected)
    names = {j.name for j in affected}
    kept = [p for p in plan.placements if p.job.name not in names]
    free = free_nodes(kept, net, down)
    unplaced = list(plan.unplaced)
    placed: list[Placement] = []
    if affected:
        if not free:
            unplaced += [Unplaced(j.name, "no free nodes left after a node failure")
                         for j in affected]
        else:
            try:
                got, left = plan_on(free, net, affected, search=search, seed=seed)
            except PlanningError as exc:
                unplaced += [Unplaced(j.name, f"re-plan after a node failure: {exc}")
                             for j in affected]
            else:
                placed += got
                unplaced += left
    new_plan = Plan(method=plan.method, placements=kept + placed, unplaced=unplaced,
                    notes=plan.notes + [f"re-planned {sorted(names)} without {sorted(set(down))}"])
    placed_names = {p.job.name for p in placed}
    return Replan(plan=new_plan, replanned=sorted(placed_names),
                  kept=sorted(p.job.name for p in kept), lost=sorted(names - placed_names))


def free_nodes(kept: Iterable[Placement], net: Network, down: Iterable[str]) -> list[int]:
    """Indices of the nodes neither ``down`` nor used by a ``kept`` placement, in order."""
    used = {i for p in kept for i in p.nodes}
    down_idx = {net.index[n] for n in down if n in net.index}
    return [i for i in range(net.n) if i not in used and i not in down_idx]


def plan_on(free: list[int], net: Network, jobs: list[Job], *, search: Planner,
            seed: int = 0) -> tuple[list[Placement], list[Unplaced]]:
    """``jobs`` planned by ``search`` on the sub-network of the ``free`` node indices, mapped
    back to ``net``'s indices; whatever the planner raises (a PlanningError) goes to the caller."""
    sub_plan = search(jobs, sub_network(net, free), seed=seed)
    placed = [Placement(job=p.job, stages=tuple(Stage(st.lo, st.hi, tuple(free[i] for i in st.nodes))
                                                for st in p.stages),
                        micro_batch=p.micro_batch, phase=p.phase, islands=p.islands,
                        outer=p.outer)
              for p in sub_plan.placements]
    return placed, list(sub_plan.unplaced)
