"""A lower bound on the makespan of every plan the cost model can score (pure: values in and out).

Every plan written as pipeline stages (the search, the portfolio, Systems A and B, the DT-FM-style
peer, the GNN) is judged by :func:`planner.core.costmodel.estimate_plan`: a job with K stages of D
replicas and M micro-batches of b sequences iterates in T = max_p T_pipe(p) + max_k T_ar(k),
T_pipe = sum_k c_k + sum_k x_k + (M - 1) max(max_k c_k, max_k x_k); jobs of a phase use disjoint
nodes, phases run one after another. Each part below is a time no such plan can beat; the bound
is their maximum. Every formula is the cost model's own (costmodel.hop_s, allreduce_s,
gradient_bytes, stage_memory_bytes, compute_floor_s); this module only picks the best nodes and
links any placement could get.

Notation: F = 6 P s B the FLOPs of one iteration, f(b) L one micro-batch's through all layers,
W = 16 P + A(1) L the least memory of one replica (its stages hold 16 P l_k / L + A(b) l_k min(M,
K) each; b >= 1, min(M, K) >= 1), Th(S) the summed throughput of a node set S, rtt* and bw* the
least RTT and most bandwidth over pairs of distinct nodes. For one job on S (K D nodes), with M in
a range [M1, M2] (so b >= beta = max(1, B / (D M2)) and (M - 1) b D >= (M1 - 1) max(D, B / M1)):

* compute: every node computes its stage's M micro-batches within T_pipe, so Th(S) T >= M b D f(1)
  L >= F; the slowest replica (throughput <= Th(S) / D) gives T_pipe >= f(b) L / thr_max +
  (M - 1) f(b) L D / Th(S) (sum_k c_k and (M - 1) max_k c_k);
* pipeline hops (K >= 2): sum_k x_k >= (K - 1) hop_s(rtt*, bw*, A(b)), and (M - 1) x_max over the
  replica's slowest link: M - 1 latencies and (M - 1) b A(1) bytes;
* slow links forced by memory: take the links by RTT, best first (a minimum spanning tree's
  merges). If every replica's links were better than r, each replica would lie in a component of
  those links holding W, apart from the others: so some replica has a link of RTT >= the first r
  at which such components hold D W together, and the job's links (pipelines and rings) reach
  a component of D W. Either a pipeline or every stage's ring has that link (replicas in two
  components put every ring across). The same holds for bandwidth (worst first); the bound takes
  the least of the four ways the slow links can fall;
* all-reduce (D >= 2): the stage with the most layers has at least L / K of them:
  allreduce_s(D, rtt / 2000, gradient_bytes(L / K), bw) over the links above;
* memory: the K D largest nodes hold D W (with the activations at beta, min(M1, K)); K = 1 needs
  D nodes of W each.

D and M are judged one by one up to EXACT_COUNT and in ranges beyond, each term at the end of
its range that makes it smaller. The parts of the bound (each times the job's steps):

* ``compute``: all jobs' FLOPs over the whole fleet's throughput (costmodel.compute_bound_s);
* ``<job> alone``: the least T over (K, D, M), S the K D fastest nodes: no plan ends before its
  slowest job, which does no better than alone on the fleet;
* ``shared fleet``: a phase of length t offers Th(fleet) t throughput-seconds and its jobs use
  disjoint nodes, so makespan T >= sum_j Th(S_j) T_j / Th(fleet), each job within T: the least T
  with sum_j (least area of job j finishing within T) <= Th(fleet) T, the area Th(S) T over each
  (K, D, M) bounded as above with Th(S) >= the K D slowest nodes' sum;
* ``phases``: two jobs whose W exceed the fleet's memory together, or whose least node counts
  exceed its nodes, never share a phase; such jobs run one after another, so makespan >= their
  alone times summed (the heaviest such set); a phase holds at most n jobs, so makespan >= the sum
  of every n-th alone time, longest first.

A job whose sync is ``diloco`` or ``auto`` may run as islands (docs/COSTMODEL.md section 9),
whose inner steps all-reduce within an island only and whose outer sync comes every H steps: its
floors keep compute, memory and the first micro-batch over the best links, without the
all-reduce and the slow-link terms (an island's inner step is a step of a smaller job, so every
other term still bounds it).

Left out (so the bound sits below the optimum): stages of whole layers, per-micro-batch and hop
overheads beyond those counted, the slowest replica's links and compute together, one link being
both the closest and the fastest, and which jobs share nodes beyond the phase rules. System C
(tensor parallel) is not written as stages and is outside this bound.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from planner.core import costmodel as cm
from planner.core.fleet import Network
from planner.core.jobs import Job

# Memory comparisons run at this slack: the cost model sums a replica's stages in floats, which
# can land a rounding below W; a bound must not call a plan infeasible that the model accepts.
MEMORY_SLACK = 1.0 - 1e-9
EXACT_CLIQUE_JOBS = 24   # heaviest set of mutually exclusive jobs: exact up to this many jobs
EXACT_COUNT = 16         # micro-batch and replica counts judged one by one; beyond, in ranges
RANGE_GROWTH = 1.25
PAIR_BLOCK = 1024        # rows of node pairs scanned at once (bounds the memory at 10,000 nodes)


@dataclass(frozen=True)
class Merges:
    """A minimum spanning tree's edges in order of one link figure (Kruskal's merges): the nodes
    joined by links at least as good as ``values[i]`` form the components merges 0..i make."""

    values: np.ndarray
    a: np.ndarray
    b: np.ndarray


def tree_merges(weights: np.ndarray) -> Merges:
    """Prim's tree over a dense symmetric matrix (smaller is better), its edges sorted."""
    n = len(weights)
    done = np.zeros(n, dtype=bool)
    best = np.array(weights[0], dtype=float) if n else np.zeros(0)
    parent = np.zeros(n, dtype=np.int64)
    values, aa, bb = [], [], []
    if n:
        done[0] = True
    for _ in range(n - 1):
        j = int(np.argmin(np.where(done, np.inf, best)))
        if done[j]:   # the rest is unreachable: join it at infinity
            j = int(np.flatnonzero(~done)[0])
        values.append(best[j] if best[j] == best[j] else np.inf)
        aa.append(int(parent[j]))
        bb.append(j)
        done[j] = True
        row = np.asarray(weights[j], dtype=float)
        better = row < best
        best[better] = row[better]
        parent[better] = j
    order = np.argsort(np.array(values, dtype=float), kind="stable")
    return Merges(np.array(values, dtype=float)[order], np.array(aa, dtype=np.int64)[order],
                  np.array(bb, dtype=np.int64)[order])


def joined_memory(merges: Merges, mem: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The memory of the two components each merge joins (union-find over the merges)."""
    parent = list(range(len(mem)))
    size = [float(x) for x in mem]
    left, right = [], []

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for a, b in zip(merges.a.tolist(), merges.b.tolist()):
        ra, rb = root(a), root(b)   # distinct: the edges form a tree
        left.append(size[ra])
        right.append(size[rb])
        parent[rb] = ra
        size[ra] += size[rb]
    return np.array(left), np.array(right)


def span_memory(joined: tuple[np.ndarray, np.ndarray], mem: np.ndarray,
                need: float) -> tuple[np.ndarray, np.ndarray]:
    """After the first i merges (i = 0: no link): the summed memory of the components that hold
    ``need`` bytes each, and the largest component's memory (both never fall with i)."""
    left, right = joined
    both = left + right
    step = (np.where(both >= need, both, 0.0) - np.where(left >= need, left, 0.0)
            - np.where(right >= need, right, 0.0))
    big = np.concatenate(([float(mem[mem >= need].sum())], float(mem[mem >= need].sum())
                          + np.cumsum(step)))
    largest = np.maximum.accumulate(np.concatenate(([float(mem.max(initial=0.0))], both)))
    return big, largest


def _worst_link(merges: Merges, memory: np.ndarray, required: np.ndarray,
                best: float) -> np.ndarray:
    """The figure (in the merges' order) a set of links reaching ``required`` bytes (an array)
    needs at least: the merge after which ``memory`` reaches it; ``best`` where no link is
    needed; inf where it is never reached."""
    i = np.searchsorted(memory, required, side="left")
    values = np.concatenate(([best], merges.values, [np.inf]))
    return np.maximum(values[i], best)


@dataclass(frozen=True)
class Links:
    """The best link figures between two distinct nodes, and the trees by RTT (rising) and by
    bandwidth (falling, as -bw) the thresholds come from."""

    rtt_ms: float
    bw: float
    by_rtt: Merges
    by_bw: Merges
    joined_rtt: tuple[np.ndarray, np.ndarray]   # joined_memory of each tree
    joined_bw: tuple[np.ndarray, np.ndarray]


@dataclass(frozen=True)
class LowerBound:
    """Seconds no plan can beat, the part that binds, every part's value and each job's alone
    time (seconds, inf where no placement can hold the job)."""

    seconds: float
    binding: str
    parts: dict[str, float] = field(default_factory=dict)
    job_alone_s: dict[str, float] = field(default_factory=dict)

    def gap(self, makespan_s: float) -> float | None:
        """makespan / bound - 1, the most a plan of that makespan can be above the optimum."""
        if not (self.seconds > 0 and math.isfinite(self.seconds) and math.isfinite(makespan_s)):
            return None
        return max(0.0, makespan_s / self.seconds - 1.0)


def best_links(net: Network) -> Links:
    """Least RTT and most bandwidth over pairs of distinct nodes, and the two trees."""
    n = net.n
    rtt, bw = math.inf, 0.0
    for lo in range(0, n, PAIR_BLOCK):
        hi = min(n, lo + PAIR_BLOCK)
        r = np.array(net.rtt_ms[lo:hi], dtype=float)
        b = np.array(net.bw[lo:hi], dtype=float)
        rows = np.arange(lo, hi)
        r[rows - lo, rows] = np.inf
        b[rows - lo, rows] = 0.0
        rtt, bw = min(rtt, float(r.min(initial=math.inf))), max(bw, float(b.max(initial=0.0)))
    by_rtt, by_bw = tree_merges(net.rtt_ms), tree_merges(-np.asarray(net.bw, dtype=float))
    return Links(rtt, bw, by_rtt, by_bw, joined_memory(by_rtt, net.mem),
                 joined_memory(by_bw, net.mem))


def replica_bytes(job: Job) -> float:
    """W = 16 P + A(1) L: the least memory one replica's nodes hold together."""
    return float(cm.stage_memory_bytes(job, job.layers, 1, 1, 1))


def _allreduce_floor(job: Job, stages: np.ndarray, replicas: np.ndarray, rtt_ms,
                     bw) -> np.ndarray:
    """Least max_k T_ar of ``replicas`` replicas of ``stages`` stages over links of at least
    ``rtt_ms`` and at most ``bw`` (numbers or arrays); 0 at D = 1, inf without a link."""
    nbytes = cm.gradient_bytes(job, job.layers / stages)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.where(np.asarray(bw) > 0, cm.allreduce_s(replicas, np.asarray(rtt_ms) / 2000.0,
                                                          nbytes, bw), np.inf)
    return np.where(replicas > 1, out, 0.0)


@dataclass(frozen=True)
class _Fleet:
    """The sorted prefix sums a job's bound reads (computed once per network)."""

    thr_top: np.ndarray      # thr_top[N]: the N fastest nodes' summed throughput
    thr_bottom: np.ndarray   # the N slowest nodes'
    mem_top: np.ndarray      # the N largest memories' sum
    mem_sorted: np.ndarray   # each node's memory, largest first
    thr_by_mem: np.ndarray   # throughputs of the nodes in mem_sorted's order
    links: Links


def _fleet(net: Network) -> _Fleet:
    thr = np.sort(np.asarray(net.thr, dtype=float))
    mem_order = np.argsort(-np.asarray(net.mem, dtype=float), kind="stable")
    zero = np.zeros(1)
    return _Fleet(np.concatenate((zero, np.cumsum(thr[::-1]))),
                  np.concatenate((zero, np.cumsum(thr))),
                  np.concatenate((zero, np.cumsum(np.asarray(net.mem, dtype=float)[mem_order]))),
                  np.asarray(net.mem, dtype=float)[mem_order],
                  np.asarray(net.thr, dtype=float)[mem_order], best_links(net))


def count_ranges(top: int, exact: int | None = None) -> list[tuple[int, int]]:
    """Ranges [lo, hi] covering 1 .. ``top``: each count alone up to ``exact``, then ranges
    growing by RANGE_GROWTH. Every term of the bound is monotone in the micro-batch count M and
    in the replica count D, so a range is judged by its ends, each term at its kinder end."""
    out, m, exact = [], 1, EXACT_COUNT if exact is None else exact
    while m <= top:
        hi = m if m <= exact else min(top, int(m * RANGE_GROWTH))
        out.append((m, hi))
        m = hi + 1
    return out


@dataclass(frozen=True)
class JobFloor:
    """One job's least (seconds, area) pairs over its placements: ``seconds[i]`` rising,
    ``area[i]`` (throughput x seconds, in FLOP) falling, the Pareto front; ``nodes``: the fewest
    nodes any placement uses. Empty when no placement can hold the job."""

    seconds: np.ndarray
    area: np.ndarray
    nodes: int

    @property
    def alone_s(self) -> float:
        return float(self.seconds[0]) if len(self.seconds) else math.inf

    def area_within(self, seconds: float) -> float:
        """Least area of a placement that can finish within ``seconds``."""
        i = int(np.searchsorted(self.seconds, seconds, side="right"))
        return float(self.area[i - 1]) if i else math.inf


def job_floors(job: Job, net: Network, fleet: _Fleet | None = None) -> JobFloor:
    """The job's floors (:class:`JobFloor`) over every K stages, D replicas and M micro-batches
    the fleet can hold (D and M in ranges [D1, D2], [M1, M2] of :func:`count_ranges`), as the
    module's docstring derives them: T >= max(F / Th(S), first + max((M - 1) b D f(1) L / Th(S),
    tail)) + all-reduce, ``first`` the first micro-batch through the stages and hops, ``tail``
    the remaining M - 1 over the replica's slowest link."""
    fleet = fleet or _fleet(net)
    n, links = net.n, fleet.links
    # A job that may run as islands (sync diloco or auto) needs no link between its replicas
    # every step, nor slow links to reach their memory: only compute and the best links count.
    islands = job.sync.mode != "step"
    w1 = replica_bytes(job) * MEMORY_SLACK
    ranges = np.array(count_ranges(n), dtype=np.int64).reshape(-1, 2)
    k_max = np.minimum(job.layers, n // ranges[:, 0])
    d, d_hi = (np.repeat(ranges[:, i], k_max) for i in (0, 1))   # d: the range's least D
    k = np.concatenate([np.arange(1, km + 1) for km in k_max]) if len(d) else np.zeros(0, int)
    most = np.minimum(k * d_hi, n)
    holders = int(np.count_nonzero(fleet.mem_sorted >= w1))
    top = fleet.thr_top[most]
    bottom = fleet.thr_bottom[k * d]
    single = k == 1
    if holders:   # K = 1: every node holds the whole model, so only those nodes count
        held = np.sort(fleet.thr_by_mem[:holders])
        top[single] = np.concatenate(([0.0], np.cumsum(held[::-1])))[
            np.minimum(d_hi[single], holders)]
        bottom[single] = np.concatenate(([0.0], np.cumsum(held)))[np.minimum(d[single], holders)]
    keep = (~single | (d <= holders)) & (fleet.mem_top[most] >= d * w1) & (fleet.mem_top[k] >= w1)
    if not keep.any():
        return JobFloor(np.zeros(0), np.zeros(0), 0)
    k, d, d_hi, most, top, bottom, single = (x[keep] for x in
                                             (k, d, d_hi, most, top, bottom, single))
    flops = 6.0 * job.params * job.seq_len * job.global_batch
    f1, a1 = job.flops_per_layer(1) * job.layers, job.activation_bytes(1)
    tau = float(fleet.thr_top[1])
    act_layers = cm.stage_memory_bytes(job, job.layers, 1, 1, 1) - job.state_bytes   # A(1) L
    mem_asc = fleet.mem_sorted[::-1]
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        compute = cm.compute_floor_s(flops, top)
        # Some replica's pipeline has a link at least this slow (its nodes hold W apart from the
        # other replicas'), and the job's links (pipelines and rings) reach D W together.
        by_rtt = span_memory(links.joined_rtt, net.mem, w1)
        by_bw = span_memory(links.joined_bw, net.mem, w1)
        rep_rtt = _worst_link(links.by_rtt, by_rtt[0], d * w1, links.rtt_ms)
        job_rtt = _worst_link(links.by_rtt, by_rtt[1], d * w1, links.rtt_ms)
        rep_bw = -_worst_link(links.by_bw, by_bw[0], d * w1, -links.bw)
        job_bw = -_worst_link(links.by_bw, by_bw[1], d * w1, -links.bw)
        rings = {(hop_rtt, hop_bw): _allreduce_floor(job, k, d,
                                                     links.rtt_ms if hop_rtt else job_rtt,
                                                     links.bw if hop_bw else job_bw)
                 for hop_rtt in (True, False) for hop_bw in (True, False)}
        if islands:
            rings = {(False, False): np.zeros(len(k))}
        times, areas = [], []
        pipelined = k > 1
        for m1, m2 in count_ranges(job.global_batch):
            beta = np.maximum(1.0, job.global_batch / (d_hi * m2))
            u = (m1 - 1) * np.maximum(1.0, job.global_batch / (d_hi * m1))
            ud = (m1 - 1) * np.maximum(d, job.global_batch / m1)   # at most (M - 1) b D
            need = (job.state_bytes + act_layers * beta * np.minimum(m1, k)) * MEMORY_SLACK
            fits = ((m1 <= np.ceil(job.global_batch / d)) & (fleet.mem_top[most] >= d * need)
                    & (fleet.mem_top[k] >= need)
                    & (~single | (d <= n - np.searchsorted(mem_asc, need, side="left"))))
            if not fits.any():
                continue
            first = f1 * beta / tau + np.where(
                pipelined, (k - 1) * _hop(links.rtt_ms, links.bw, a1 * beta, 1, net), 0.0)
            options = []
            for (hop_rtt, hop_bw), allreduce in rings.items():
                # the pipeline's slowest link, by RTT and by bandwidth (two links, maybe)
                worst_rtt = np.maximum(rep_rtt, job_rtt) if hop_rtt else rep_rtt
                worst_bw = np.minimum(rep_bw, job_bw) if hop_bw else rep_bw
                if islands:
                    worst_rtt, worst_bw = links.rtt_ms, links.bw
                if m1 == 1:
                    tail = np.zeros(len(k))
                else:
                    tail = np.maximum(_hop(worst_rtt, links.bw, a1 * u, m1 - 1, net),
                                      _hop(links.rtt_ms, worst_bw, a1 * u, m1 - 1, net))
                if hop_rtt or hop_bw:   # without stages, only the rings connect the replicas
                    allreduce = np.where(pipelined, allreduce, np.inf)
                options.append((np.where(pipelined, tail, 0.0), allreduce))
            t = np.full(len(k), np.inf)
            a = np.full(len(k), np.inf)
            for tail, allreduce in options:
                t = np.minimum(t, np.maximum(compute, first + np.maximum(ud * f1 / top, tail))
                               + allreduce)
                a = np.minimum(a, np.maximum(flops, bottom * first
                                             + np.maximum(ud * f1, bottom * tail))
                               + bottom * allreduce)
            times.append(np.where(fits, t, np.inf))
            areas.append(a)
    if not times:
        return JobFloor(np.zeros(0), np.zeros(0), 0)
    t, a = np.concatenate(times) * job.steps, np.concatenate(areas) * job.steps
    counts = np.tile(k * d, len(times))
    finite = np.isfinite(t)
    if not finite.any():
        return JobFloor(np.zeros(0), np.zeros(0), 0)
    t, a, count = t[finite], a[finite], int(counts[finite].min())
    order = np.lexsort((a, t))              # by time, then area
    t, a = t[order], a[order]
    front = a < np.minimum.accumulate(np.concatenate(([np.inf], a[:-1])))
    return JobFloor(t[front], a[front], count)


def _hop(rtt_ms, bw, act, count: int, net: Network):
    """``count`` hops' latency and overhead (count >= 1) plus ``act`` bytes over a link
    (rtt_ms, bw; numbers or arrays): :func:`costmodel.hop_s` with the latency and overhead
    taken ``count`` times; inf without a link."""
    return np.where(np.asarray(bw) > 0, cm.hop_s(np.asarray(rtt_ms) * count, bw, act,
                                                 net.hop_overhead_s * count), np.inf)


def _heaviest_clique(weights: list[float], apart: list[set[int]]) -> tuple[float, list[int]]:
    """The heaviest set of jobs that pairwise cannot share a phase: exact for a few jobs (branch
    and bound), greedy (still a valid set, so still a bound) beyond."""
    order = sorted(range(len(weights)), key=lambda i: -weights[i])
    if len(order) > EXACT_CLIQUE_JOBS:
        chosen: list[int] = []
        for i in order:
            if all(i in apart[j] for j in chosen):
                chosen.append(i)
        return sum(weights[i] for i in chosen), chosen
    best: tuple[float, list[int]] = (0.0, [])

    def grow(chosen: list[int], total: float, candidates: list[int]) -> None:
        nonlocal best
        if total > best[0]:
            best = (total, list(chosen))
        if total + sum(weights[i] for i in candidates) <= best[0]:
            return
        for pos, i in enumerate(candidates):
            chosen.append(i)
            grow(chosen, total + weights[i], [j for j in candidates[pos + 1:] if j in apart[i]])
            chosen.pop()

    grow([], 0.0, order)
    return best


def area_bound_s(floors: list[JobFloor], throughput: float) -> float:
    """Least T with sum_j (least area of job j within T) <= throughput T: in a plan of makespan
    T every job finishes within T and the jobs' areas fit in the fleet's throughput x T.
    The left side falls and the right side rises with T, so the first step where they cross
    is the answer."""
    if not floors or throughput <= 0:
        return math.inf
    steps = np.unique(np.concatenate([f.seconds for f in floors]))
    steps = steps[steps >= max(f.alone_s for f in floors)]
    total = np.zeros(len(steps))
    for f in floors:
        i = np.searchsorted(f.seconds, steps, side="right")
        total += f.area[i - 1]
    following = np.append(steps[1:], np.inf)
    ok = np.flatnonzero(total < throughput * following)
    if not len(ok):
        return math.inf
    i = int(ok[0])
    return float(max(steps[i], cm.compute_floor_s(total[i], throughput)))


def lower_bound(jobs: list[Job], net: Network) -> LowerBound:
    """The bound (module docstring) for ``jobs`` on ``net``; jobs no placement can hold count in
    the compute part only (no plan places them)."""
    compute = cm.compute_bound_s(jobs, net) if net.n and float(net.thr.sum()) > 0 else math.inf
    if not jobs or net.n == 0:
        return LowerBound(0.0 if not jobs else math.inf, "compute",
                          {"compute": compute if jobs else 0.0})
    fleet = _fleet(net)
    floors = {job.name: job_floors(job, net, fleet) for job in jobs}
    placeable = [j for j in jobs if len(floors[j.name].seconds)]
    alone = {name: f.alone_s for name, f in floors.items()}
    parts = {"compute": compute}
    if placeable:
        slowest = max(placeable, key=lambda j: alone[j.name])
        parts[f"{slowest.name} alone"] = alone[slowest.name]
        parts["shared fleet"] = area_bound_s([floors[j.name] for j in placeable],
                                             float(fleet.thr_top[-1]))
        times = sorted((alone[j.name] for j in placeable), reverse=True)
        parts["phases (nodes)"] = sum(times[::net.n])
        total_mem = float(fleet.mem_top[-1])
        need = [replica_bytes(j) * MEMORY_SLACK for j in placeable]
        counts = [floors[j.name].nodes for j in placeable]
        apart = [{b for b in range(len(placeable)) if b != a
                  and (need[a] + need[b] > total_mem or counts[a] + counts[b] > net.n)}
                 for a in range(len(placeable))]
        weight, chosen = _heaviest_clique([alone[j.name] for j in placeable], apart)
        if len(chosen) > 1:
            names = [placeable[i].name for i in chosen]
            more = f" and {len(names) - 3} more" if len(names) > 3 else ""
            parts["phases (" + ", ".join(names[:3]) + more + ")"] = weight
    binding = max(parts, key=lambda key: parts[key])
    return LowerBound(parts[binding], binding, parts, alone)
