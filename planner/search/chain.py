"""Step 7 of the search: chains of relocations for the job that sets the makespan.

The moves of step 5 give the critical job nodes one step at a time, and judge each at the
solver's cheapest effort; step 6 grows it where nodes are idle. Neither moves the critical
job C into another job's place when that job must itself go somewhere a third job holds:

    C -> d's place,   d -> t's place (or C's old one),   t -> what is left

C is tried on the whole of d's place and on its tightest parts (:func:`tight_parts`: single-
linkage clusters can span a continent, and the solvers judge a job on a cluster's whole
shape), and "what is left" is t's own leftovers, C's old nodes, what C leaves of d's place, or a
share of d's place split with C (:func:`split_pool`: C on the k fastest nodes, t on the rest,
k by bisection where their times cross). Such a chain is kept when every job it moves ends
before the current makespan: the makespan drops. Candidates are judged at the NORMAL
effort, since the cheapest effort keeps the job's current (D, b) and misjudges a move to a
cluster of another shape by up to 2.3x (gpt3-13b on a 61-server cluster: 4.02 h against
2.40 h). Places (and their parts) for C are tried in order of C's time there, those of the
:data:`CHAIN_DONORS` jobs where C does best; homes for d in order of d's time there (the best
:data:`CHAIN_TARGETS`); at the first place where any chain shortens the makespan, the best of
its chains (lowest makespan, then sum of times) is taken. Splits cost about ten solves each,
so at most :data:`CHAIN_SPLITS` are tried per chain. Deterministic: ties go by job name.

On the 300-server real-region fleet this is what takes gpt3-13b out of the slow cluster it
holds: it moves into llama-2-13b's, which moves into llama-2-7b-2's, which shares the first
with gpt3-13b. On the 150-server one llama-2-7b moves into the part of gpt3-2.7b's European
cluster within 10 ms of the Netherlands (1.07 h, against 1.41 h on the whole cluster) and
gpt3-2.7b takes its Tokyo servers.
"""

from __future__ import annotations

import numpy as np

from planner.core.costmodel import compute_floor_s
from planner.search.groups import Solved
from planner.search.options import Effort
from planner.search.state import JobState, SearchRun

CHAIN_EFFORT = Effort.NORMAL
CHAIN_ROUNDS = 3          # chains per phase (each followed by the refinement's moves)
CHAIN_DONORS = 4          # jobs whose places are tried for the critical job (most promising)
CHAIN_TARGETS = 4         # places tried for the displaced job
CHAIN_SPLITS = 4          # pools split between C and a third job per chain (each costs ~10 solves)
TIGHT_RADIUS_MS = 10.0    # parts of a place tried for C: within this RTT of one node
TIGHT_PARTS = 2
CORE_MS = 2.0             # a city and its metro: the centre of a tight part


def _free_near(run: SearchRun, group: np.ndarray, free: np.ndarray) -> np.ndarray:
    """The nodes of ``free`` in ``group``'s locality clusters."""
    return free[np.isin(run.labels[free], np.unique(run.labels[group]))]


def _solve(run: SearchRun, state: JobState, pool: np.ndarray,
           limit: float = np.inf) -> Solved | None:
    """``state``'s job solved on ``pool``; None when it does not fit, or when even all of the
    pool's FLOP/s could not finish it before ``limit`` (every node computes its share of the
    job's 6 P s B steps FLOPs within the job's time, so that time is at least the FLOPs over
    the pool's summed throughput: the solve is skipped)."""
    thr = float(run.net.thr[pool].sum()) if pool.size else 0.0
    if not thr > 0 or compute_floor_s(state.job.total_flops, thr) >= limit:
        return None
    solved = run.solve(state.job, pool, CHAIN_EFFORT, state.hint)
    return None if solved.placement is None else solved


def tight_parts(rtt_ms: np.ndarray, thr: np.ndarray, pool: np.ndarray,
                radius_ms: float = TIGHT_RADIUS_MS, count: int = TIGHT_PARTS) -> list[np.ndarray]:
    """Up to ``count`` parts of ``pool`` within ``radius_ms`` of one of its nodes: around the
    node with the most throughput within :data:`CORE_MS` (its city), then around the richest
    node outside the parts so far; none when the pool's RTT diameter is at most twice the
    radius (a tight pool already). Locality clusters are single-linkage, so one can chain
    across a continent (33 ms across Europe on the 150-server fleet), and the solvers, which
    grow sets cluster by cluster, then judge a job only on the whole of it: llama-2-7b takes
    1.41 h on those 32 servers and 1.07 h on the 24 within 10 ms of the Netherlands."""
    if pool.size < 2:
        return []
    rtt = rtt_ms[np.ix_(pool, pool)]
    if rtt.max() <= 2 * radius_ms:
        return []
    near = rtt <= radius_ms
    # Centre each part on the richest city-sized core (throughput within CORE_MS), ties to
    # the most throughput within reach, then the lower index.
    core = (rtt <= CORE_MS).astype(float) @ thr[pool]
    reach = near.astype(float) @ thr[pool]
    rank = np.lexsort((np.arange(pool.size), -reach, -core))
    parts, covered = [], np.zeros(pool.size, dtype=bool)
    for _ in range(count):
        left = rank[~covered[rank]]
        if left.size == 0:
            break
        seed = int(left[0])
        part = near[seed]
        parts.append(pool[part])
        covered |= part
    return parts


def split_pool(run: SearchRun, a: JobState, b: JobState, pool: np.ndarray,
               limit: float) -> tuple[Solved, Solved] | None:
    """``a`` on the k fastest nodes of ``pool`` and ``b`` on the rest, k by bisection where
    their times cross; the split with the lowest longer time, if that is under ``limit``."""
    order = pool[np.lexsort((pool, -run.net.thr[pool]))]
    lo, hi = 1, order.size - 1
    best = None
    while lo <= hi and not run.out_of_time():
        k = (lo + hi) // 2
        sa, sb = _solve(run, a, order[:k], limit), _solve(run, b, order[k:], limit)
        ta = np.inf if sa is None else sa.estimate.job_s
        tb = np.inf if sb is None else sb.estimate.job_s
        if sa is not None and sb is not None and (best is None or max(ta, tb) < best[0]):
            best = (max(ta, tb), sa, sb)
        if ta > tb:
            lo = k + 1
        else:
            hi = k - 1
    if best is None or not best[0] < limit:
        return None
    return best[1], best[2]


def chain_move(run: SearchRun, states: dict[str, JobState]) -> bool:
    """At the most promising place for the critical job where a chain (module docstring)
    lowers the makespan, apply the best such chain; True when one was applied."""
    crit, times, free = run.critical(states)
    makespan = times[crit]
    limit = makespan * (1 - 1e-9)
    cs = states[crit]
    comp = run.components[cs.group[0]]
    others = [k for k in sorted(states)
              if k != crit and run.components[states[k].group[0]] == comp]
    # Places for C: each other job's group plus the free nodes of its clusters (C solved on
    # the whole place and on its tightest parts; the rest of the place is left to the others).
    places = []
    for d in others:
        if run.out_of_time():
            return False
        pool_c = np.union1d(states[d].group, _free_near(run, states[d].group, free))
        for part, pool in enumerate([pool_c] + tight_parts(run.net.rtt_ms, run.net.thr, pool_c)):
            sc = _solve(run, cs, pool, limit)
            if sc is not None and sc.estimate.job_s < limit:
                places.append((sc.estimate.job_s, d, part, pool_c, sc))
    places.sort(key=lambda x: (x[0], x[1], x[2]))
    donors = list(dict.fromkeys(x[1] for x in places))[:CHAIN_DONORS]
    splits = [CHAIN_SPLITS]
    for _, d, _, pool_c, sc in (x for x in places if x[1] in donors):
        ds = states[d]
        left_c = np.setdiff1d(pool_c, sc.placement.nodes)
        # Free once C has moved: the free nodes outside d's place, C's old group, C's leftovers.
        free2 = np.union1d(np.union1d(np.setdiff1d(free, pool_c), cs.group), left_c)
        homes = []
        for t in [None] + [k for k in others if k != d]:
            if run.out_of_time():
                return False
            base = cs.group if t is None else states[t].group
            sd = _solve(run, ds, np.union1d(base, _free_near(run, base, free2)), limit)
            if sd is not None and sd.estimate.job_s < limit:
                homes.append((sd.estimate.job_s, "" if t is None else t, t, sd))
        homes.sort(key=lambda x: (x[0], x[1]))
        best = None
        for _, _, t, sd in homes[:CHAIN_TARGETS]:
            upd = {crit: sc, d: sd}
            if t is not None:
                third = _place_third(run, cs, states[t], sd, pool_c, left_c,
                                     np.union1d(free2, states[t].group), limit, splits)
                if third is None:
                    continue
                upd.update({crit: third[0], t: third[1]} if third[0] is not None
                           else {t: third[1]})
            new_times = dict(times)
            new_times.update({k: e.job_s for k, (_, e) in upd.items()})
            key = (max(new_times.values()), sum(new_times.values()))
            if key[0] < limit and (best is None or key < best[0]):
                best = (key, upd)
        if best is not None:
            for k, (p, e) in best[1].items():
                states[k] = JobState.of(states[k].job, p, e)
            return True
    return False


def _place_third(run: SearchRun, cs: JobState, ts: JobState, sd: Solved,
                 pool_c: np.ndarray, left_c: np.ndarray, free3: np.ndarray, limit: float,
                 budget: list[int]) -> tuple[Solved | None, Solved] | None:
    """Where the job t displaced by d goes: (C's new solution or None for unchanged, t's),
    the best under ``limit`` among t's leftovers, C's old nodes, C's leftovers in d's place
    and a split of d's place between C and t."""
    free3 = np.setdiff1d(free3, sd.placement.nodes)
    best = None
    for base in (np.setdiff1d(ts.group, sd.placement.nodes), cs.group, left_c):
        base = np.intersect1d(base, free3)
        if base.size == 0:
            continue
        st = _solve(run, ts, np.union1d(base, _free_near(run, base, free3)), limit)
        if st is not None and st.estimate.job_s < limit and (best is None
                                                             or st.estimate.job_s < best[0]):
            best = (st.estimate.job_s, None, st)
    if best is None and budget[0] > 0:
        budget[0] -= 1
        split = split_pool(run, cs, ts, np.setdiff1d(pool_c, sd.placement.nodes), limit)
        if split is not None:
            sc, st = split
            best = (max(sc.estimate.job_s, st.estimate.job_s), sc, st)
    return None if best is None else (best[1], best[2])
