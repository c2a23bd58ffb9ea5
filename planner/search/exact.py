"""Small fleets solved exactly: the best plan of a bounded search space under the cost model,
with a proof or a stated gap.

What "optimal" covers. The search decides, for every job, which servers it gets and in which
phase it runs, exhaustively up to the symmetry below, and takes each job's arrangement on its
servers (stages x replicas, their order, layer ranges, micro-batch) from the search's per-job
solver (:func:`planner.search.groups.solve_group` at ``Effort.NORMAL``), which is a heuristic:
the optimum is over allocations and phases, with arrangements as that solver makes them.
Servers of one class (same site, GPU model, throughput and memory) count as interchangeable:
the search enumerates how many servers of each class a job gets, not which ones, and gives a
job the first free servers of each class (servers its solver leaves idle go to the jobs after
it). Every value it compares is the cost model's (costmodel.estimate of a placement, or its
formulas at values no placement beats); nothing here re-derives a cost.

How. For each set of jobs that may share a phase, a branch and bound over the jobs (hardest
first) and, per job, the class-count vectors that the servers still free allow, ordered by a
lower bound (:func:`job_bounds`: the cost model's least time of the job on any placement the
solver can make over servers of those counts); a branch is cut when its bound reaches the best
phase found, or when the jobs after it cannot all fit under it on the servers left
(:func:`planner.search.exact_bounds.suffix_fits`). Phases: the best split of the jobs into
phases (each phase gets the whole fleet, phases add up) from those per-set optima. The default
plan is the first incumbent, so the result is never worse than it.

The work is bounded by solver calls (:data:`EVALUATIONS`), never by wall time, so the answer
depends only on the inputs. When the budget runs out, the branches not explored keep their
bounds and the result says how far the plan can be from the best plan of the space.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

from planner.core import costmodel as cm
from planner.core.costmodel import Placement, estimate_plan
from planner.core.fleet import Network
from planner.core.jobs import Job
from planner.core.plan import Plan
from planner.search.clusters import network_clusters
from planner.search.exact_bounds import nan_inf, suffix, suffix_fits, top_sums
from planner.search.groups import MICRO_BATCH_CANDIDATES, GridCache, solve_group
from planner.search.options import Effort

MAX_SERVERS = 16        # the rule: fleets of at most this many servers ...
MAX_JOBS = 6            # ... and at most this many jobs are searched exactly
EVALUATIONS = 500       # per-job solver calls one exact search may make (10-20 ms each)
NOTE_PREFIX = "exact:"  # the plan note that states the result (planner.commands.plan prints it)
REL = 1e-9


@dataclass(frozen=True)
class ExactResult:
    """The best plan found (None when none is shorter than the incumbent), its makespan (the
    incumbent's then), the best lower bound on the space's optimum (the makespan when
    ``proved``), and the solver calls made."""

    placements: list[Placement] | None
    makespan_s: float
    bound_s: float
    proved: bool
    evaluations: int

    @property
    def gap(self) -> float:
        """How much longer than the bound the plan may be, as a fraction (0 when proved)."""
        if self.proved or self.makespan_s <= 0:
            return 0.0
        return self.makespan_s / self.bound_s - 1.0 if self.bound_s > 0 else math.inf


def applies(jobs, net: Network) -> bool:
    """The rule for :func:`improve`: at most MAX_SERVERS servers and MAX_JOBS jobs, every one
    ``sync: step`` (its space and bounds are those of synchronous placements, not islands)."""
    return (0 < len(jobs) <= MAX_JOBS and 0 < net.n <= MAX_SERVERS
            and all(j.sync.mode == "step" for j in jobs))


class _Instance:
    """Server classes, every class-count vector and the per-vector facts the bounds need."""

    def __init__(self, jobs: list[Job], net: Network):
        self.jobs, self.net = jobs, net
        keys: dict[tuple, list[int]] = {}
        for i, node in enumerate(net.nodes):
            key = (node.site_key or "", node.gpu_name or "", float(net.thr[i]), float(net.mem[i]))
            keys.setdefault(key, []).append(i)
        self.classes = [np.array(v, dtype=np.int64) for _, v in sorted(keys.items())]
        self.counts = counts = np.array([c.size for c in self.classes], dtype=np.int64)
        self.vectors = np.indices(counts + 1).reshape(counts.size, -1).T.copy()
        # Mixed-radix index of a vector: the last class varies fastest.
        self.stride = np.array([int(np.prod(counts[k + 1:] + 1)) for k in range(counts.size)],
                               dtype=np.int64)
        thr = np.array([net.thr[c[0]] for c in self.classes])
        mem = np.array([net.mem[c[0]] for c in self.classes])
        self.size = self.vectors.sum(axis=1)
        self.top_thr = top_sums(self.vectors, thr, net.n)   # (V, n + 1): best m servers' sum
        self.top_mem = top_sums(self.vectors, mem, net.n)
        self.a_min = self.over_pairs(self.class_pairs(net.rtt_ms / 2000.0, np.min), np.inf, True)
        self.bw_max = self.over_pairs(self.class_pairs(net.bw, np.max), 0.0, False)
        self.merges: list[tuple[float, np.ndarray, np.ndarray, np.ndarray]] = []
        self.reach_rtt = self._reach_rtt(thr)
        # (V, n + 1): the most throughput one class of at least m servers holds
        self.usable0 = np.where(self.vectors[:, :, None] >= np.arange(net.n + 1)[None, None],
                                (self.vectors * thr)[:, :, None], 0.0).max(axis=1, initial=0.0)
        iu, ju = np.triu_indices(net.n, 1)
        order = np.argsort(net.rtt_ms[iu, ju], kind="stable")
        self.pairs = (iu[order], ju[order])                  # every server pair, by RTT
        self.pair_rtt = net.rtt_ms[self.pairs]
        self.bw_beyond = suffix(net.bw[self.pairs], np.maximum, 0.0)
        self.reach_pos = self.position(self.reach_rtt)
        self.labels = network_clusters(net)
        self.grids = GridCache(net)
        self.solved: dict[tuple, tuple[Placement | None, float]] = {}
        self.evaluations = 0

    def class_pairs(self, matrix: np.ndarray, reduce) -> np.ndarray:
        """(C, C): ``reduce`` of ``matrix`` over pairs of distinct servers of two classes."""
        k = len(self.classes)
        out = np.full((k, k), np.nan)
        for a in range(k):
            for b in range(k):
                block = matrix[np.ix_(self.classes[a], self.classes[b])]
                if a == b:
                    block = block[~np.eye(block.shape[0], dtype=bool)]
                if block.size:
                    out[a, b] = reduce(block)
        return out

    def over_pairs(self, pair_values: np.ndarray, empty: float, least: bool) -> np.ndarray:
        """Per vector, the least (``least``) or largest of ``pair_values`` (C, C) over the
        class pairs its servers hold (two classes, or two servers of one); ``empty`` for none."""
        v = self.vectors
        out = np.full(v.shape[0], empty)
        done = np.zeros(v.shape[0], dtype=bool)
        a_idx, b_idx = np.nonzero(~np.isnan(pair_values))
        vals = pair_values[a_idx, b_idx]
        for q in np.argsort(vals if least else -vals, kind="stable"):
            a, b = int(a_idx[q]), int(b_idx[q])
            held = (v[:, a] >= 2) if a == b else (v[:, a] > 0) & (v[:, b] > 0)
            take = held & ~done
            out[take] = vals[q]
            done |= take
        return out

    def _reach_rtt(self, thr: np.ndarray) -> np.ndarray:
        """(V, n + 1): per vector and m, an RTT that any m of its servers joined by a path
        (a pipeline replica, a ring) must have on at least one of their links: the least
        threshold at which links no longer than it join m of them (Kruskal over class pairs,
        each class's own links taken as free, which only lowers it). Records each merge in
        ``merges``: (threshold, vectors, their merged component's size and throughput)."""
        v = self.vectors
        n_vec, c = v.shape
        label = np.tile(np.arange(c), (n_vec, 1))
        largest = v.max(axis=1, initial=0)
        m = np.arange(self.net.n + 1)
        out = np.where(m[None] <= largest[:, None], 0.0, np.inf)
        pair = self.class_pairs(self.net.rtt_ms, np.min)
        edges = sorted((pair[a, b], a, b) for a in range(c) for b in range(a + 1, c)
                       if np.isfinite(pair[a, b]))
        for rtt, a, b in edges:
            rows = np.flatnonzero((v[:, a] > 0) & (v[:, b] > 0) & (label[:, a] != label[:, b]))
            if rows.size == 0:
                continue
            sub = label[rows]
            la, lb = sub[:, a:a + 1], sub[:, b:b + 1]
            sub = np.where(sub == lb, la, sub)
            label[rows] = sub
            size = np.where(sub == la, v[rows], 0).sum(axis=1)
            self.merges.append((float(rtt), rows, size,
                                np.where(sub == la, v[rows] * thr, 0.0).sum(axis=1)))
            grown = (m[None] > largest[rows, None]) & (m[None] <= size[:, None])
            out[rows] = np.where(grown, rtt, out[rows])
            largest[rows] = np.maximum(largest[rows], size)
        return out

    def position(self, rtt):
        """Where the pairs with an RTT of at least ``rtt`` begin (for a :func:`suffix`)."""
        return np.searchsorted(self.pair_rtt, rtt, side="left")

    def index(self, vector: np.ndarray) -> int:
        return int(vector @ self.stride)

    def solve(self, job: Job, nodes: tuple[int, ...]) -> tuple[Placement | None, float]:
        """The per-job solver's placement of ``job`` on ``nodes`` and its time (inf: none)."""
        key = (job, nodes)
        hit = self.solved.get(key)
        if hit is None:
            self.evaluations += 1
            idx = np.array(nodes, dtype=np.int64)
            p, e = solve_group(job, self.net, idx, Effort.NORMAL, None, self.labels[idx],
                               cache=self.grids)
            hit = (p, e.job_s if p is not None else math.inf)
            self.solved[key] = hit
        return hit


def job_bounds(job: Job, inst: _Instance) -> np.ndarray:
    """For every class-count vector, a lower bound on the job's time on any placement of the
    per-job solver over servers of those counts (inf where their memory cannot hold it): the
    least over K stages x D replicas that memory allows of the pipeline, at least the compute
    floor on the D K fastest servers and at least the first micro-batch's compute (on the
    fastest server) plus (M - 1) times the larger of the slowest replica's stage and the
    cheapest hop over a link as long as any K of them joined by a path need
    (:meth:`_Instance._reach_rtt`) plus K - 1 cheapest hops, at the micro-batch sizes the
    solver tries (the only place the bound uses
    the solver's choices); plus the ring all-reduce of the largest stage (at least L / K
    layers) over a link as long as any D of them joined in a ring need; and the larger of that
    and :func:`_coupled`'s. Each term is the cost model's own formula at values no placement
    beats."""
    net = inst.net
    sizes = sorted({b for b in MICRO_BATCH_CANDIDATES + (job.micro_batch,) if b >= 1})
    every = np.arange(net.n)
    src, dst = inst.pairs
    with np.errstate(divide="ignore", invalid="ignore"):
        hop = cm.transfer_s(net, every[:, None], every[None, :], job.activation_bytes(1))
        hop_beyond = {b: suffix(cm.transfer_s(net, src, dst, job.activation_bytes(b)),
                                 np.minimum, np.inf) for b in sizes}
    hop_min = inst.over_pairs(inst.class_pairs(hop, np.min), np.inf, True)
    keys, oks, chains, rings = [], [], [], []
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        for d in range(1, net.n + 1):
            for k in range(1, min(job.layers, net.n // d) + 1):
                ok = (inst.size >= d * k) & (inst.top_mem[:, k] >= job.state_bytes) \
                    & (inst.top_mem[:, d * k] >= d * job.state_bytes)
                if not ok.any():
                    continue
                chain = ring = np.zeros(inst.size.size)
                if k > 1:
                    chain = _chain_s(job, d, sizes, hop_beyond, inst.reach_pos[:, k],
                                     inst.top_thr[:, 1], d / inst.top_thr[:, d * k]) \
                        + job.steps * (k - 1) * hop_min
                if d > 1:
                    ring = _ring_s(job, inst, d, k, inst.reach_rtt[:, d], inst.reach_pos[:, d])
                keys.append((d, k))
                oks.append(ok)
                chains.append(nan_inf(chain))
                rings.append(nan_inf(ring))
        best = np.full(inst.vectors.shape[0], np.inf)
        if keys:
            dk = np.array(keys)
            chain, ring = np.stack(chains, axis=1), np.stack(rings, axis=1)   # (V, P)
            t = np.maximum(cm.compute_floor_s(job.total_flops,
                                              inst.top_thr[:, dk[:, 0] * dk[:, 1]]), chain) + ring
            t = np.maximum(nan_inf(t),
                           _coupled(job, inst, dk, chain, ring, sizes, hop_beyond, hop_min))
            best = np.where(np.stack(oks, axis=1), t, np.inf).min(axis=1)
    best[inst.size == 0] = np.inf
    return best


def _chain_s(job: Job, d: int, sizes, hop_beyond, pos, fastest, share=0.0):
    """(M - 1) transfers over a link at least as long as the pairs from ``pos`` on, or (M - 1)
    times the slowest replica's stage (its throughput at most 1 / ``share``), after the first
    micro-batch's compute through every layer (at ``fastest``, the fastest server's
    throughput): the least over the micro-batch sizes the solver tries with ``d`` replicas,
    for the whole job (sum_k c_k + (M - 1) max(c_max, x_max) of the cost model's pipeline)."""
    waits = [(cm.micro_batches(job, d, b) - 1)
             * np.maximum(hop_beyond[b][pos], job.flops_per_layer(b) * job.layers * share)
             + job.flops_per_layer(b) * job.layers / fastest
             for b in sizes if b <= cm.micro_batches(job, d, 1)]
    return job.steps * np.min(nan_inf(waits), axis=0)


def _ring_s(job: Job, inst: _Instance, d: int, k: int, rtt: np.ndarray, pos: np.ndarray):
    """The ring all-reduce of a stage of at least L / K layers over ``d`` servers with a link
    of at least ``rtt`` (the pairs from ``pos`` on), for the whole job."""
    a_max = np.maximum(inst.a_min, rtt / 2000.0)
    bw_min = np.minimum(inst.bw_max, inst.bw_beyond[pos])
    return job.steps * cm.allreduce_s(d, a_max, cm.gradient_bytes(job, math.ceil(job.layers / k)),
                                      bw_min)


def _coupled(job: Job, inst: _Instance, dk: np.ndarray, chain_lo: np.ndarray,
             ring_lo: np.ndarray, sizes, hop_beyond, hop_min) -> np.ndarray:
    """(V, P): the bound of :func:`job_bounds` for each (D, K) of ``dk`` with compute and
    links tied: if the longest link a K x D grid uses has RTT r, its D K servers lie in one
    component of the links no longer than r, so they compute at most that component's
    throughput; and that link is a pipeline hop (then (M - 1) transfers over it) or a ring
    link (then the all-reduce over it). The least over r of the thresholds of
    :meth:`_Instance._reach_rtt` (terms only grow between them), replayed from its merges:
    a vector's bound changes only where its components do."""
    n_vec = inst.vectors.shape[0]
    m = np.arange(inst.net.n + 1)
    d, k = dk[:, 0], dk[:, 1]
    out = np.full((n_vec, d.size), np.inf)
    usable = inst.usable0.copy()
    nbytes = cm.gradient_bytes(job, np.ceil(job.layers / k))
    prod = d * k
    for rtt, rows, size, thr in [(0.0, np.arange(n_vec), None, None)] + inst.merges:
        if size is None:   # each class alone: only grids one class can hold
            largest = inst.vectors.max(axis=1, initial=0)
            groups = [(rows[largest == s], np.flatnonzero(prod <= s)) for s in np.unique(largest)]
        else:   # only vectors whose usable throughput grew, only grids the merge can hold
            old = usable[rows]
            new = np.maximum(old, np.where(m[None] <= size[:, None], thr[:, None], 0.0))
            usable[rows] = new
            grew = (new > old).any(axis=1)
            rows, size = rows[grew], size[grew]
            groups = [(rows[size == s], np.flatnonzero(prod <= s)) for s in np.unique(size)]
        pos = int(inst.position(rtt))
        per_d = {int(x): float(_chain_s(job, int(x), sizes, hop_beyond, pos,
                                        float(inst.top_thr[-1, 1])))
                 for x in np.unique(d[k > 1])}
        chain_at = np.array([per_d.get(int(x), 0.0) for x in d])
        bw_at = inst.bw_beyond[pos]
        for rows, cols in groups:
            if rows.size == 0 or cols.size == 0:
                continue
            dc, kc = d[cols], k[cols]
            chain = chain_at[cols][None] + job.steps * (kc - 1)[None] * hop_min[rows, None]
            a_max = np.maximum(inst.a_min[rows], rtt / 2000.0)[:, None]
            bw_min = np.minimum(inst.bw_max[rows], bw_at)[:, None]
            ring = job.steps * cm.allreduce_s(dc[None], a_max, nbytes[cols][None], bw_min)
            t = cm.compute_floor_s(job.total_flops, np.minimum(inst.top_thr[rows][:, dc * kc],
                                                               usable[rows][:, dc * kc]))
            grid = np.ix_(rows, cols)
            both = np.minimum(np.maximum(t, chain) + ring_lo[grid],
                              np.maximum(t, chain_lo[grid]) + ring)
            t = np.where(kc > 1, np.where(dc > 1, both, np.maximum(t, chain)),
                         np.where(dc > 1, t + ring, t))
            out[grid] = np.fmin(out[grid], nan_inf(t))
    return out


class _Phase:
    """Branch and bound for one set of jobs sharing a phase: least max job time."""

    def __init__(self, inst: _Instance, jobs: list[int], bounds: list[np.ndarray],
                 upper: float, budget: int):
        self.inst, self.bounds, self.budget = inst, bounds, budget
        self.jobs = sorted(jobs, key=lambda j: (-float(bounds[j][-1]), j))
        self.best_assign: list[Placement] | None = None
        self.open_bound = math.inf
        self.out_of_budget = False
        self.improved(upper)

    def improved(self, best: float) -> None:
        """A new best: the vectors that can still hold the jobs from each depth on under it."""
        self.best = best
        self.fits = suffix_fits([self.bounds[j] for j in self.jobs], best * (1 - REL),
                                tuple(int(c) + 1 for c in self.inst.counts))

    def run(self) -> None:
        free = [list(c) for c in self.inst.classes]
        self._dfs(0, self.inst.counts.copy(), free, 0.0, [])

    def _dfs(self, depth: int, remaining: np.ndarray, free: list[list[int]], worst: float,
             chosen: list[Placement]) -> None:
        inst = self.inst
        if depth == len(self.jobs):
            if worst < self.best * (1 - REL):
                self.best_assign = list(chosen)
                self.improved(worst)
            return
        j = self.jobs[depth]
        if not self.fits[depth][inst.index(remaining)]:
            return   # the jobs left cannot share the servers left under the best phase
        fits = (inst.vectors <= remaining).all(axis=1) & (inst.size > 0)
        cand = np.flatnonzero(fits & np.isfinite(self.bounds[j]))
        rest_idx = inst.index(remaining) - inst.vectors[cand] @ inst.stride
        keep = self.fits[depth + 1][rest_idx]
        cand, rest_idx = cand[keep], rest_idx[keep]
        if cand.size == 0:
            return
        bound = np.maximum(worst, self.bounds[j][cand])
        for later in self.jobs[depth + 1:]:
            bound = np.maximum(bound, self.bounds[later][rest_idx])
        order = np.lexsort((cand, bound))
        for i, pos in enumerate(order):
            b = float(bound[pos])
            if b >= self.best * (1 - REL):
                break
            if not self.fits[depth + 1][rest_idx[pos]]:
                continue
            x = inst.vectors[cand[pos]]
            nodes = tuple(sorted(n for k in range(x.size) for n in free[k][:x[k]]))
            if inst.evaluations >= self.budget and (inst.jobs[j], nodes) not in inst.solved:
                self.out_of_budget = True
                self.open_bound = min(self.open_bound, b)
                return
            placement, t = inst.solve(inst.jobs[j], nodes)
            if placement is None or max(worst, t) >= self.best * (1 - REL):
                continue
            used = set(placement.nodes)   # the solver may leave some of the nodes idle
            rest = [[n for n in cl if n not in used] for cl in free]
            left = np.array([len(cl) for cl in rest], dtype=np.int64)
            self._dfs(depth + 1, left, rest, max(worst, t), chosen + [placement])
            if self.out_of_budget:   # the siblings not explored keep their bounds
                if i + 1 < order.size:
                    self.open_bound = min(self.open_bound, float(bound[order[i + 1]]))
                return


def _partitions_best(n_jobs: int, value: dict[int, float]) -> tuple[float, list[int]]:
    """The least sum of ``value`` over the splits of all jobs into blocks (bit masks), and the
    blocks of one split reaching it."""
    full = (1 << n_jobs) - 1
    best: dict[int, tuple[float, list[int]]] = {0: (0.0, [])}
    for mask in range(1, full + 1):
        low = mask & -mask
        rest = mask ^ low
        options = []
        sub = rest
        while True:   # every block holding the lowest job of mask
            block = sub | low
            t = value.get(block, math.inf) + best[mask ^ block][0]
            options.append((t, block))
            if sub == 0:
                break
            sub = (sub - 1) & rest
        t, block = min(options)
        best[mask] = (t, best[mask ^ block][1] + [block])
    return best[full]


def solve_exact(jobs: list[Job], net: Network, *, incumbent_s: float = math.inf,
                evaluations: int = EVALUATIONS) -> ExactResult | None:
    """The best plan of the space (module docstring) shorter than ``incumbent_s``, or proof
    that none is, within ``evaluations`` solver calls. None when the instance is outside
    :func:`applies` or a job fits nowhere."""
    jobs = list(jobs)
    if not applies(jobs, net):
        return None
    inst = _Instance(jobs, net)   # at most 2^16 class-count vectors (16 distinct servers)
    bounds = [job_bounds(job, inst) for job in jobs]
    alone = [float(b[-1]) for b in bounds]   # the last vector holds every server
    if not all(math.isfinite(t) for t in alone):
        return None
    n = len(jobs)
    blocks = sorted(range(1, 1 << n), key=lambda m: (-bin(m).count("1"), m))
    lo: dict[int, float] = {}
    hi: dict[int, float] = {}
    found: dict[int, list[Placement]] = {}
    upper = incumbent_s
    for mask in blocks:
        members = [j for j in range(n) if mask >> j & 1]
        floor = max(alone[j] for j in members)
        rest = max((alone[j] for j in range(n) if not mask >> j & 1), default=0.0)
        cap = upper - rest   # a phase this long cannot be part of a shorter plan
        if floor >= cap * (1 - REL) or inst.evaluations >= evaluations:
            lo[mask] = floor
            continue
        phase = _Phase(inst, members, bounds, cap, evaluations)
        phase.run()
        if phase.best_assign is not None:
            hi[mask], found[mask] = phase.best, phase.best_assign
        lo[mask] = max(floor, min(phase.best, phase.open_bound) if phase.out_of_budget
                       else phase.best)
        upper = min(upper, _partitions_best(n, hi)[0])
    best_s, split = _partitions_best(n, hi)
    bound = min(upper, _partitions_best(n, lo)[0])
    placements: list[Placement] | None = None
    if math.isfinite(best_s) and best_s < incumbent_s * (1 - REL):
        placements = []
        for phase, mask in enumerate(sorted(split, key=lambda m: (hi[m], m))):
            placements += [dataclasses.replace(p, phase=phase) for p in found[mask]]
        placements.sort(key=lambda p: jobs.index(p.job))
        best_s = estimate_plan(placements, net).makespan_s
    made = best_s if placements is not None else incumbent_s
    return ExactResult(placements, made, bound, bound >= made * (1 - REL), inst.evaluations)


def note(result: ExactResult, default_s: float = math.inf) -> str:
    """The plan's note on the result (what the space is: the module docstring); it says so
    when the plan is the exact search's, shorter than the default's ``default_s``."""
    space = "all server allocations by class and phasings; jobs arranged by the per-job solver"
    calls = f"{result.evaluations} solver calls" + (
        "" if result.placements is None else
        f"; its own plan, {1 - result.makespan_s / default_s:.1%} shorter than the default's")
    if result.proved:
        return f"{NOTE_PREFIX} optimal under the cost model ({space}; {calls})"
    return (f"{NOTE_PREFIX} within {result.gap:.1%} of the optimum under the cost model "
            f"({space}; stopped after {calls})")


def improve(jobs, net: Network, plan: Plan, *, evaluations: int = EVALUATIONS) -> Plan:
    """``plan`` (the default method's) or, when :func:`applies` and the exact search finds a
    shorter one, that plan; either way with a note saying whether it is optimal or the gap.
    Plans with unplaced jobs or per-job time overrides are returned as they are."""
    jobs = list(jobs)
    if not applies(jobs, net) or plan.unplaced or plan.job_s_override or not plan.placements:
        return plan
    current = estimate_plan(plan.placements, net).makespan_s
    result = solve_exact(jobs, net, incumbent_s=current, evaluations=evaluations)
    if result is None:
        return plan
    placements, facts = plan.placements, plan.facts
    if result.placements is not None:
        placements = result.placements
        facts = dataclasses.replace(facts, winner="exact")
    return dataclasses.replace(plan, placements=list(placements),
                               notes=list(plan.notes) + [note(result, current)], facts=facts)
