"""The paper's Algorithm 1: per-node class scores -> feasible node groups, one per job, with phases.

Shared by the search planner (whose heuristic scores feed it) and the GNN (whose softmax outputs
feed it). Scores are an ``(n, num_jobs + 1)`` array: column ``j`` is job slot ``j`` (the order of
the ``jobs`` list), the last column is "idle".

Steps, per phase (phase 0 starts now; phase p+1 starts when phase p's longest job ends and gets the
whole fleet again):

1. every node goes to its highest-scoring class among the jobs still pending (or idle);
2. a job's group is cut down to one connected component (finite RTT): the component holding most
   of its score mass among the components where the job can fit at all;
3. jobs are visited hardest first (largest memory threshold); a group below its job's memory
   threshold first takes idle nodes of its component (best score for the job first), then merges
   the groups of other jobs in that component, one whole group at a time (the easiest job's first);
4. a job whose group was merged away, or that stays below its threshold, waits for the next phase.

The memory threshold (:func:`memory_threshold`) is the least total memory a group needs under the
cost model's memory rule: one pipeline replica holding the whole model, ``16 P + A L min(M, K)``,
with ``K`` the number of stages of a one-stage-per-node pipeline. :func:`fits` checks the exact
layer-granular version of that rule, so a group that passes it always admits a valid placement
(a single pipeline, one stage per node that can hold a layer). A :class:`PlanningError` is raised
only when a job cannot fit even on the whole largest connected component.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import connected_components

from hulk.errors import PlanningError
from hulk.plural import count as plural
from planner.core import costmodel as cm
from planner.core.fleet import Network
from planner.core.jobs import Job


@dataclass(frozen=True)
class Grouping:
    """Algorithm 1's output: job name -> node indices and phase (0 = now, 1, 2 ... wait).

    ``notes``: remarks for people on merges and waits. ``unscored``: the jobs the class scores
    gave no node, as (place among the notes, job name, remark); a caller whose scores are only
    a start drops them, and :meth:`remarks` gives every remark in the order they were made."""

    groups: dict[str, tuple[int, ...]]
    phase: dict[str, int]
    notes: list[str] = field(default_factory=list)
    unscored: tuple[tuple[int, str, str], ...] = ()

    @property
    def unscored_jobs(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(name for _, name, _ in self.unscored))

    def remarks(self) -> list[str]:
        """The notes with the remarks on unscored jobs put back where they were made."""
        out = list(self.notes)
        for place, _, text in reversed(self.unscored):
            out.insert(place, text)
        return out

    def phases(self) -> list[int]:
        return sorted(set(self.phase.values()))

    def jobs_in_phase(self, phase: int) -> list[str]:
        return [name for name, p in self.phase.items() if p == phase]


def _layer_bytes(job: Job, micro_batch: int, num_stages: int) -> float:
    """Bytes one layer costs on a node of a one-replica pipeline of ``num_stages`` stages (with
    the outer optimizer's state for a ``sync: diloco`` job, which always runs islands)."""
    m = cm.micro_batches(job, 1, micro_batch)
    if job.sync.mode == "diloco":
        return cm.layer_memory_bytes(job, micro_batch, m, num_stages) + cm.outer_state_bytes(job, 1)
    return cm.layer_memory_bytes(job, micro_batch, m, num_stages)


def memory_threshold(job: Job, num_stages: int | None = None) -> float:
    """Least total memory (bytes) of a group that can train ``job``: one replica of the whole
    model, ``16 P + A L min(M, K)``, at the job's own micro-batch with ``K`` stages (default: as
    many as a one-layer-per-stage pipeline could need, capped by the layer count)."""
    k = job.layers if num_stages is None else max(1, min(num_stages, job.layers))
    return _layer_bytes(job, job.micro_batch, k) * job.layers


def layer_capacity(job: Job, mem: np.ndarray, micro_batch: int | None = None) -> int:
    """Layers a set of nodes (memory ``mem``, bytes) can hold as a one-replica pipeline with one
    stage per node: sum of floor(mem_i / per-layer bytes), with K = the number of usable nodes."""
    b = micro_batch or job.micro_batch
    mem = np.asarray(mem, dtype=float)
    if mem.size == 0:
        return 0
    # K is at most the number of nodes and the number of layers; a larger K only raises the
    # per-layer cost, so using that upper bound is conservative.
    k = max(1, min(int(mem.size), job.layers))
    u = _layer_bytes(job, b, k)
    return int(np.floor(mem / u).sum())


def fits(job: Job, net: Network, nodes) -> bool:
    """True when ``nodes`` admit a valid placement of ``job`` (see module docstring)."""
    idx = np.asarray(list(nodes), dtype=np.int64)
    return idx.size > 0 and layer_capacity(job, net.mem[idx]) >= job.layers


def component_labels(net: Network) -> np.ndarray:
    """Connected-component label per node (finite RTT), vectorised."""
    finite = np.isfinite(net.rtt_ms)
    if finite.all():
        return np.zeros(net.n, dtype=np.int64)
    rows, cols = np.nonzero(finite)
    graph = csr_matrix((np.ones(rows.size, dtype=bool), (rows, cols)), shape=(net.n, net.n))
    _, labels = connected_components(graph, directed=False)
    return labels


def algorithm1(jobs: list[Job], net: Network, scores: np.ndarray, *,
               labels: np.ndarray | None = None, max_phases: int | None = None) -> Grouping:
    """Feasible groups and phases from class scores (see module docstring)."""
    n, num = net.n, len(jobs)
    scores = np.asarray(scores, dtype=float)
    if scores.shape != (n, num + 1):
        raise ValueError(f"scores must have shape ({n}, {num + 1}), got {scores.shape}")
    if n == 0:
        raise PlanningError("the fleet has no nodes")
    if labels is None:
        labels = component_labels(net)
    comp_ids = np.unique(labels)
    comp_nodes = {int(c): np.flatnonzero(labels == c) for c in comp_ids}

    # Which components can hold each job at all; none -> it can never be placed.
    can_fit: dict[int, list[int]] = {}
    for j, job in enumerate(jobs):
        ok = [c for c, members in comp_nodes.items() if fits(job, net, members)]
        if not ok:
            largest = max(comp_nodes.values(), key=len)
            need = memory_threshold(job, min(len(largest), job.layers))
            raise PlanningError(
                f"job {job.name} cannot fit on the fleet: it needs about {need / 1e9:.0f} GB of GPU "
                f"memory in one connected group, the largest connected group "
                f"({plural(len(largest), 'node')}) has {net.mem[largest].sum() / 1e9:.0f} GB")
        can_fit[j] = ok

    threshold = np.array([memory_threshold(job) for job in jobs])
    groups: dict[str, tuple[int, ...]] = {}
    phase_of: dict[str, int] = {}
    notes: list[str] = []
    unscored: list[tuple[int, str, str]] = []
    pending = list(range(num))
    phase = 0
    limit = max_phases if max_phases is not None else num
    while pending:
        if phase >= limit:
            raise PlanningError(f"could not place jobs {[jobs[j].name for j in pending]} "
                                f"within {limit} phases")
        placed = _one_phase(jobs, net, scores, pending, can_fit, comp_nodes, labels, threshold,
                            notes, unscored, phase)
        if not placed:  # cannot happen (the hardest job always absorbs its component); be safe
            raise PlanningError(f"Algorithm 1 made no progress in phase {phase}")
        for j, members in placed.items():
            groups[jobs[j].name] = tuple(int(i) for i in members)
            phase_of[jobs[j].name] = phase
        pending = [j for j in pending if j not in placed]
        phase += 1
    return Grouping(groups, phase_of, notes, tuple(unscored))


def _one_phase(jobs, net, scores, pending, can_fit, comp_nodes, labels, threshold, notes,
               unscored, phase) -> dict[int, np.ndarray]:
    n = net.n
    cols = pending + [len(jobs)]
    sub = scores[:, cols]
    choice = np.argmax(sub, axis=1)                       # index into cols
    owner = np.full(n, -1, dtype=np.int64)                # job index, -1 idle
    is_job = choice < len(pending)
    owner[is_job] = np.asarray(pending)[choice[is_job]]

    # One component per job: most score mass among components where it fits.
    home: dict[int, int] = {}
    for j in pending:
        mine = owner == j
        best_c, best_mass = None, -math.inf
        for c in can_fit[j]:
            members = comp_nodes[c]
            mass = float(scores[members[mine[members]], j].sum()) if mine[members].any() else 0.0
            # Tie-break: the component where the job's scores are highest overall.
            key = (mass, float(scores[members, j].max()), len(members))
            if best_c is None or key > best_mass:
                best_c, best_mass = c, key
        outside = mine & (labels != best_c)
        owner[outside] = -1
        if not mine.any() or not (mine & (labels == best_c)).any():
            unscored.append((len(notes), jobs[j].name, f"phase {phase}: {jobs[j].name} got no "
                             f"node by score; grows from component {best_c}"))
        home[j] = best_c

    order = sorted(pending, key=lambda j: (-threshold[j], j))
    alive = set(pending)
    for j in order:
        if j not in alive:
            continue
        c = home[j]
        members = comp_nodes[c]
        group = members[owner[members] == j]
        if fits(jobs[j], net, group):
            continue
        # Take idle nodes of the component, best score for this job first.
        idle = members[owner[members] == -1]
        if idle.size:
            idle = idle[np.lexsort((idle, -scores[idle, j]))]
            taken = take_until_fit(jobs[j], net, group, idle)
            owner[taken] = j
            group = members[owner[members] == j]
            if fits(jobs[j], net, group):
                continue
        # Merge whole groups of other jobs of this component, easiest (smallest need) first.
        others = sorted({int(o) for o in owner[members] if o >= 0 and o != j},
                        key=lambda o: (threshold[o], o))
        for o in others:
            victim = members[owner[members] == o]
            owner[victim] = j
            alive.discard(o)
            notes.append(f"phase {phase}: {jobs[j].name} merged the group of {jobs[o].name}")
            group = members[owner[members] == j]
            if fits(jobs[j], net, group):
                break
        if not fits(jobs[j], net, group):
            owner[group] = -1
            alive.discard(j)
            notes.append(f"phase {phase}: {jobs[j].name} waits (not enough memory free)")

    placed: dict[int, np.ndarray] = {}
    for j in order:
        if j in alive:
            group = np.flatnonzero(owner == j)
            if fits(jobs[j], net, group):
                placed[j] = group
            else:
                owner[group] = -1
    # Jobs that lost their group: a second chance on idle nodes of their component.
    for j in order:
        if j in placed:
            continue
        c = home[j]
        members = comp_nodes[c]
        idle = members[owner[members] == -1]
        if idle.size and fits(jobs[j], net, idle):
            idle = idle[np.lexsort((idle, -scores[idle, j]))]
            taken = take_until_fit(jobs[j], net, np.zeros(0, dtype=np.int64), idle)
            owner[taken] = j
            placed[j] = np.sort(taken)
        else:
            notes.append(f"phase {phase}: {jobs[j].name} waits for phase {phase + 1}")
    return placed


def take_until_fit(job: Job, net: Network, group: np.ndarray, candidates: np.ndarray) -> np.ndarray:
    """The shortest prefix of ``candidates`` that makes ``group`` fit (all of them if none does)."""
    if candidates.size == 0:
        return candidates
    # Binary search on the prefix length. The returned prefix is always one that was checked to
    # fit (capacity is nearly monotone in the prefix; where it is not, a longer prefix is kept).
    lo, hi = 1, candidates.size
    if not fits(job, net, np.concatenate([group, candidates])):
        return candidates
    while lo < hi:
        mid = (lo + hi) // 2
        if fits(job, net, np.concatenate([group, candidates[:mid]])):
            hi = mid
        else:
            lo = mid + 1
    return candidates[:lo]
