"""Islands for low-communication jobs (``sync: diloco`` and ``sync: auto``; docs/COSTMODEL.md
section 8): where the search places such a job, and with which inner steps H and compression.

A DiLoCo job is a set of islands, each an ordinary pipeline (K stages x D_i replicas) that
all-reduces gradients among its own replicas only, and every H inner steps the islands average
their pseudo-gradients over the links between them. Its placement is one Placement whose stage k
lists every island's replicas as contiguous blocks (``Placement.islands``), so every island has
the same K and the same layer ranges. Islands are built inside locality clusters
(planner.search.clusters): a ring or chain that stays in a cluster is cheap, the WAN is crossed
only by the outer all-reduce.

For a job on a pool of nodes, :func:`with_islands` takes the search's own placement of the job on
that pool (made as for ``sync: step``: the screens, grid caps and all-reduce trades of
planner.search.groups assume one synchronous ring per stage, so they judge only that placement,
never an island layout) and compares it with island layouts judged by costmodel.estimate:

- anchored: that placement as island 0 (its K, micro-batch and arrangement), plus islands of the
  same K on the rest of the pool's clusters, most compute first, one more at a time, each of
  nodes at least as fast as the anchor's slowest;
- fresh: for a few throughput floors (the fastest node classes of the pool, and none) and stage
  counts K (the fewest that some cluster can hold, twice that, the anchor's), islands of
  K x floor(n_c / K) of each cluster's nodes above the floor, most compute first, one more at
  a time. Every replica runs the same micro-batches, so one slow node slows its stage in every
  island: the floors keep slow servers out.

A ``sync: diloco`` job that no cluster can hold with the outer state gets one island over the
whole pool.

Layers are then balanced once over every island's stage groups (the slowest replica of a stage,
whatever its island, sets its pace), within memory that holds the outer optimizer's state too.
The layouts are compared at the fastest outer setting the job allows (largest H, fewest bytes),
where each is at its best (the job time never grows with H nor with fewer bytes). A layout whose
compute floor (:func:`layout_floor_s`) is already longer than the best job time found is skipped
before its replicas are paired or its layers balanced: it could not have won, so the answer is
the same, for less work.
``sync: auto`` then keeps the synchronous placement when no island layout of two or more
islands is faster, else the island layout with the mildest setting (most bytes, then smallest
H, from :data:`H_LADDER` up to the user's largest) whose estimate equals the fastest's: with
streaming the outer sync can hide entirely behind the inner steps, and a smaller H then costs
nothing. ``sync: diloco`` always gets
islands (one island when no layout of more is faster) with the user's H and compression.

The step jobs of a plan never come here (:func:`uses_islands`), so their plans are unchanged.
Elsewhere: the exact search of small fleets leaves plans with such jobs alone (its space and
bounds are synchronous), the portfolio takes no baseline plan that runs a ``sync: diloco`` job
synchronously, and a repair after node losses re-plans such jobs in full.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from hulk.plural import count
from planner.core import costmodel as cm
from planner.core.costmodel import OuterSync, Placement, Stage, estimate
from planner.core.fleet import Network
from planner.core.jobs import COMPRESSION_BYTES, Job, Sync
from planner.search import algorithm1 as alg1
from planner.search.arrangement import balance_layers, match_rows
from planner.search.groups import UNSOLVED, GridCache, Solved

MAX_ISLANDS = 8          # clusters a job is spread over at most (the largest by compute)
FRESH_STAGES = (1, 2, 4, 8)   # stage counts of the fresh layouts (besides the anchor's)
LEVELS = 2               # fastest node throughputs the fresh layouts take as floors
MAX_STAGES = 16          # the fresh layouts' fewest stages are looked for up to this
PATIENCE = 2             # islands added without a faster layout before a family stops growing
# H values auto tries below the user's largest (which it always tries).
H_LADDER = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000)
REL = 1e-9
FLOOR_MARGIN = 1e-9      # a layout floor above the best by more than rounding cannot win


def uses_islands(job: Job) -> bool:
    """True for the jobs this module places: ``sync: diloco`` and ``sync: auto``."""
    return job.sync.mode != "step"


def step_twin(job: Job) -> Job:
    """``job`` as a ``sync: step`` job (what its islands run between outer steps)."""
    return dataclasses.replace(job, sync=Sync())


def outer_settings(sync: Sync) -> list[OuterSync]:
    """The outer settings ``sync`` allows, mildest first: most bytes per value, then smallest H
    (``diloco``: the user's one; ``auto``: :data:`H_LADDER` up to the user's largest H and
    every compression allowed)."""
    comps = sorted(dict.fromkeys(sync.compressions), key=lambda c: (-COMPRESSION_BYTES[c], c))
    if sync.mode == "diloco":
        return [OuterSync(sync.inner_steps, comps[0], sync.streaming_fragments)]
    hs = sorted({h for h in H_LADDER if h < sync.inner_steps} | {sync.inner_steps})
    return [OuterSync(h, c, sync.streaming_fragments) for c in comps for h in hs]


def fastest_setting(sync: Sync) -> OuterSync:
    """The setting with the least outer-sync time per inner step: largest H, fewest bytes."""
    return min(outer_settings(sync), key=lambda o: (COMPRESSION_BYTES[o.compression],
                                                     -o.inner_steps))


def _memory_per_layer(job: Job, b: int, m: int, k: int) -> float:
    """Bytes one layer needs on every node of its stage in an island layout: the step rule's
    (costmodel.layer_memory_bytes) plus the outer optimizer's state (costmodel)."""
    return cm.layer_memory_bytes(job, b, m, k) + cm.outer_state_bytes(job, 1)


def island_placement(job: Job, net: Network, grids: list[np.ndarray], b: int,
                     outer: OuterSync) -> Placement | None:
    """One Placement of ``job`` with the K x D_i ``grids`` as its islands (in order): layers
    balanced by the stages' slowest replicas over all islands within memory; None when the
    islands cannot hold the model or have more replicas than the batch has samples."""
    grid = np.hstack(grids)
    k, d = grid.shape
    if k > job.layers or d > job.global_batch:
        return None
    m = cm.micro_batches(job, d, b)
    caps = np.floor(net.mem[grid].min(axis=1) / _memory_per_layer(job, b, m, k)).astype(np.int64)
    if (caps < 1).any():
        return None
    layers = balance_layers(job, net.thr[grid].min(axis=1), caps)
    if layers is None:
        return None
    bounds = [0] + np.cumsum(layers).tolist()
    rows = grid.tolist()
    stages = tuple(Stage(bounds[s], bounds[s + 1], tuple(rows[s])) for s in range(k))
    return Placement(job, stages, b, islands=tuple(int(g.shape[1]) for g in grids), outer=outer)


def stage_groups(net: Network, nodes: np.ndarray, k: int) -> np.ndarray | None:
    """K x floor(n / K) stage groups of ``nodes`` (fastest first: stage 0 gets the fastest
    ones), replicas not yet paired (arrangement.match_rows pairs them along cheap hops);
    None when n < K."""
    d = nodes.size // k
    if d < 1:
        return None
    order = nodes[np.lexsort((nodes, -net.mem[nodes], -net.thr[nodes]))]
    return order[:k * d].reshape(k, d)


def layout_floor_s(job: Job, net: Network, grids: list[np.ndarray], b: int) -> float:
    """A lower bound of the job time of every island layout with the stage groups of ``grids``
    (whatever the pairing of replicas and the layer split): each inner step some replica runs
    M micro-batches through its slowest stage, and for any split of the L layers the largest
    l_k / t_k, t_k the slowest throughput in stage k, is at least L / sum_k t_k. The outer
    sync only adds to it (section 8)."""
    grid = np.hstack(grids)
    m = cm.micro_batches(job, grid.shape[1], b)
    slowest = float(net.thr[grid].min(axis=1).sum())
    return job.steps * m * job.flops_per_layer(b) * job.layers / slowest


def eligible(job: Job, net: Network, nodes: np.ndarray, k: int, b: int, floor_thr: float
             ) -> np.ndarray:
    """The nodes of ``nodes`` at least ``floor_thr`` fast that can hold an equal share of the
    layers in an island layout of K stages (min(M, K) taken as K: an upper bound). Every
    replica of every island runs the same micro-batches, so a slow node anywhere slows the
    stage it is in, in every island."""
    return _fit(net, nodes, _share_bytes(job, k, b), floor_thr)


def _share_bytes(job: Job, k: int, b: int) -> float:
    """Memory an equal share of the layers over K stages needs (:func:`eligible`)."""
    return _memory_per_layer(job, b, k, k) * math.ceil(job.layers / k)


def _fit(net: Network, nodes: np.ndarray, need: float, floor_thr: float) -> np.ndarray:
    return nodes[(net.thr[nodes] >= floor_thr) & (net.mem[nodes] >= need)]


def speed_levels(net: Network, nodes: np.ndarray) -> list[float]:
    """Throughput floors the fresh layouts try: the :data:`LEVELS` largest node throughputs of
    ``nodes`` and 0 (every node)."""
    distinct = np.unique(net.thr[nodes])[::-1]
    return [float(x) for x in distinct[:LEVELS]] + [0.0]


def _clusters(job: Job, net: Network, nodes: np.ndarray, labels: np.ndarray
              ) -> list[np.ndarray]:
    """The clusters of ``nodes`` (``labels``: their cluster labels) that can hold the job on
    their own, most compute first."""
    out = []
    for c in np.unique(labels):
        members = nodes[labels == c]
        if alg1.fits(job, net, members):
            out.append(members)
    out.sort(key=lambda cl: (-float(net.thr[cl].sum()), int(cl.min())))
    return out


class _Best:
    """The fastest feasible island layout offered: (job time, nodes, order offered) decides.
    Layouts are judged once per search run (``cache``, the run's GridCache: pools of
    different moves share most clusters, so the same layouts come back)."""

    def __init__(self, job: Job, net: Network, outer: OuterSync, cache: GridCache | None):
        self.job, self.net, self.outer, self.cache = job, net, outer, cache
        self.solved, self.key = UNSOLVED, None

    def _judge(self, grids: list[np.ndarray], b: int) -> Solved:
        p = island_placement(self.job, self.net, grids, b, self.outer)
        return UNSOLVED if p is None else Solved(p, estimate(p, self.net))

    def cannot_win(self, grids: list[np.ndarray], b: int) -> bool:
        """True when no layout of the stage groups ``grids`` can be kept (:meth:`keep`): its
        :func:`layout_floor_s` is already longer than the best job time yet."""
        return self.key is not None and \
            layout_floor_s(self.job, self.net, grids, b) > self.key[0] * (1 + FLOOR_MARGIN)

    def offer(self, grids: list[np.ndarray], b: int, floor_checked: bool = False) -> bool:
        """Judge the islands ``grids`` at micro-batch ``b``; True when they are the best yet.
        ``floor_checked``: the caller found :meth:`cannot_win` False for them since the best
        last changed, so the floor is not computed twice."""
        if not floor_checked and self.cannot_win(grids, b):
            return False
        if self.cache is None:
            placement, est = self._judge(grids, b)
        else:
            key = (self.job, b, self.outer, tuple(g.shape[1] for g in grids),
                   np.hstack(grids).tobytes())
            placement, est = self.cache.remember("islands", key, lambda: self._judge(grids, b))
        return placement is not None and self.keep(placement, est)

    def keep(self, placement: Placement, est) -> bool:
        if not est.feasible:
            return False
        key = (est.job_s, len(placement.nodes))
        if self.key is None or key[0] < self.key[0] * (1 - REL) or (
                key[0] <= self.key[0] and key[1] < self.key[1]):
            self.solved, self.key = Solved(placement, est), key
            return True
        return False


def _paired(net: Network, grid: np.ndarray, act: float, cache: GridCache | None) -> np.ndarray:
    """``arrangement.match_rows(net, grid, act)``, kept in the run's ``cache``: the same
    cluster's stage groups come back in most pools of a run (one pairing in eight is new on the
    400-server DiLoCo bench fleet). Read-only, as it may be shared."""
    if cache is None:
        return match_rows(net, grid, act)

    def pair() -> np.ndarray:
        out = match_rows(net, grid, act)
        out.flags.writeable = False
        return out

    return cache.remember("island_pairs", (grid.shape, grid.tobytes(), act), pair)


def _grow(job: Job, net: Network, first: list[np.ndarray], clusters: list[np.ndarray], k: int,
          b: int, floor_thr: float, best: _Best) -> None:
    """Offer the layouts ``first`` + islands in the first j of ``clusters`` (j = 0, 1, ...;
    each cluster's :func:`eligible` nodes, most compute first) until :data:`PATIENCE` islands
    in a row bring nothing faster."""
    need = _share_bytes(job, k, b)
    pools = [e for cl in clusters if (e := _fit(net, cl, need, floor_thr)).size >= k]
    pools.sort(key=lambda e: (-float(net.thr[e].sum()), int(e.min())))
    grids = list(first)
    act = job.activation_bytes(b)
    misses = 0
    if grids:
        best.offer(grids, b)
    paired = len(grids)        # grids[paired:] are stage groups whose replicas await pairing
    for pool in pools[:MAX_ISLANDS]:
        grids.append(stage_groups(net, pool, k))
        if not best.cannot_win(grids, b):
            # Pairing (arrangement.match_rows) keeps each stage's nodes: the floor holds for
            # it, so it is only done for layouts that are judged.
            grids[paired:] = [_paired(net, g, act, best.cache) for g in grids[paired:]]
            paired = len(grids)
        if paired == len(grids) and best.offer(grids, b, floor_checked=True):
            misses = 0
        else:
            misses += 1
            if misses >= PATIENCE:
                break


def fewest_stages(job: Job, net: Network, clusters: list[np.ndarray], b: int,
                  floor_thr: float) -> int | None:
    """The fewest stages K (up to :data:`MAX_STAGES`) for which some cluster has K
    :func:`eligible` nodes; None when none has."""
    for k in range(1, min(job.layers, MAX_STAGES) + 1):
        need = _share_bytes(job, k, b)
        if any(_fit(net, cl, need, floor_thr).size >= k for cl in clusters):
            return k
    return None


def island_layouts(job: Job, net: Network, nodes: np.ndarray, labels: np.ndarray,
                   anchor: Placement | None, cache: GridCache | None = None) -> Solved:
    """The fastest island layout of ``job`` on ``nodes`` (``labels``: their locality clusters)
    at the job's fastest outer setting: the anchored and fresh families of the module
    docstring. UNSOLVED when no layout fits."""
    nodes = np.asarray(nodes, dtype=np.int64)
    best = _Best(job, net, fastest_setting(job.sync), cache)
    clusters = _clusters(job, net, nodes, labels)
    if anchor is not None:
        used = np.asarray(anchor.nodes, dtype=np.int64)
        single = dataclasses.replace(anchor, job=job, islands=(anchor.replicas,),
                                     outer=best.outer)
        best.keep(single, estimate(single, net) if cache is None else
                  cache.remember("islands_single", single, lambda: estimate(single, net)))
        in_anchor = np.zeros(net.n, dtype=bool)
        in_anchor[used] = True
        rest = [cl[~in_anchor[cl]] for cl in clusters]
        _grow(job, net, [anchor.node_matrix()], rest, anchor.num_stages, anchor.micro_batch,
              float(net.thr[used].min()), best)
    sizes = sorted({job.micro_batch} | ({anchor.micro_batch} if anchor is not None else set()))
    for floor_thr in speed_levels(net, nodes):
        for b in sizes:
            fewest = fewest_stages(job, net, clusters, b, floor_thr)
            if fewest is None:
                continue
            stages = {fewest, 2 * fewest} | ({anchor.num_stages} if anchor is not None else set())
            for k in sorted(x for x in stages if x <= job.layers):
                _grow(job, net, [], clusters, k, b, floor_thr, best)
    if best.solved.placement is None and job.sync.mode == "diloco":
        # No cluster holds it with the outer state: one island over the whole pool.
        for k in range(1, min(job.layers, MAX_STAGES) + 1):
            _grow(job, net, [], [nodes], k, sizes[0], 0.0, best)
            if best.solved.placement is not None:
                break
    return best.solved


def mildest(placement: Placement, net: Network, fast: cm.Estimate | None = None) -> Solved:
    """``placement`` with the mildest outer setting its job allows whose job time equals
    the fastest setting's (module docstring). The job time never grows with H nor with fewer
    bytes (section 8), so per compression a bisection over H finds it. ``fast``: the estimate
    at the fastest setting, when known (the layouts are judged at it)."""
    sync = placement.job.sync
    fastest = dataclasses.replace(placement, outer=fastest_setting(sync))
    if fast is None or placement.outer != fastest.outer:
        fast = estimate(fastest, net)
    settings = outer_settings(sync)
    for comp in dict.fromkeys(o.compression for o in settings):
        hs = [o for o in settings if o.compression == comp]   # H ascending
        top = fast if hs[-1] == fastest.outer else \
            estimate(dataclasses.replace(placement, outer=hs[-1]), net)
        if not top.job_s <= fast.job_s * (1 + REL):
            continue
        lo, hi, found = 0, len(hs) - 1, (hs[-1], top)
        while lo < hi:
            mid = (lo + hi) // 2
            e = estimate(dataclasses.replace(placement, outer=hs[mid]), net)
            if e.job_s <= fast.job_s * (1 + REL):
                hi, found = mid, (hs[mid], e)
            else:
                lo = mid + 1
        return Solved(dataclasses.replace(placement, outer=found[0]), found[1])
    return Solved(fastest, fast)


def with_islands(job: Job, net: Network, nodes: np.ndarray, labels: np.ndarray,
                 step: Solved, cache: GridCache | None = None) -> Solved:
    """The search's answer for ``job`` on ``nodes`` (``labels``: their locality clusters),
    given ``step``, its placement there as a ``sync: step`` job would get it: for ``auto`` the
    faster of that and the best island layout of two or more islands (the synchronous one on a
    tie), for ``diloco`` the best island layout (module docstring). ``cache``: the search
    run's GridCache, which keeps the layouts judged."""
    best = island_layouts(job, net, nodes, labels, step.placement, cache)
    if best.placement is None:
        return step if job.sync.mode == "auto" else UNSOLVED
    if job.sync.mode == "auto":
        spread = len(best.placement.islands) >= 2
        faster = step.placement is None or \
            best.estimate.job_s < step.estimate.job_s * (1 - REL)
        if not (spread and faster):
            return step
    if cache is None:
        return mildest(best.placement, net, best.estimate)
    # Pools of different moves often end on the same best layout (a third of the calls are new
    # on the 400-server DiLoCo bench fleet); the answer depends on the placement only.
    return cache.remember("mildest", best.placement,
                          lambda: mildest(best.placement, net, best.estimate))


def islands_of(placement: Placement) -> list[list[int]]:
    """Each island's nodes (every stage's replicas of that island)."""
    out, start = [], 0
    widths = placement.islands or (placement.replicas,)
    for w in widths:
        out.append([i for st in placement.stages for i in st.nodes[start:start + w]])
        start += w
    return out


def outer_summary(placement: Placement) -> str:
    """A few words on a placement's synchronisation, for notes and benchmarks."""
    if placement.outer is None:
        return "step"
    o = placement.outer
    return (f"diloco: {count(len(placement.islands) or 1, 'island')} {list(placement.islands)}, "
            f"H={o.inner_steps}, {o.compression}"
            + (f", {count(o.streaming_fragments, 'fragment')}" if o.streaming_fragments else ""))

