"""Step 5 of the search: moves of nodes between the jobs' groups, phase by phase, and
:func:`plan_search`, the whole pipeline.

Per phase, the job that sets the makespan gets moves of free nodes and of cluster chunks (all,
1/2, 1/4, 1/8) from other jobs (the nearest ones and those with most slack, compensated with
free nodes) or whole-group exchanges, accepted when they lower the phase's makespan; then free
nodes go to the other jobs (sum of completion times). Every job is then re-solved with more
effort, the bottleneck job grown (planner.search.grow), chains of relocations tried
(planner.search.chain), and later-phase jobs pulled into an earlier phase when free nodes
allow it.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import numpy as np

from hulk.errors import PlanningError
from planner.core.costmodel import Placement
from planner.core.fleet import Network
from planner.core.jobs import Job
from planner.core.plan import Plan, PlanFacts
from planner.search import algorithm1 as alg1
from planner.search.clusters import CLUSTER_RTT_MS
from planner.search import chain as chain_step
from planner.search.grow import grow_bottleneck
from planner.search.groups import GridCache
from planner.search.heuristics import heuristic_scores
from planner.search.options import Effort, SearchOptions
from planner.search.state import JobState, SearchRun


def _refine_phase(run: SearchRun, states: dict[str, JobState], rounds: int,
                  tick: Callable[[], None]):
    """Moves for the critical job until none lowers the makespan (free nodes first, then
    chunks of other jobs), then free nodes for the other jobs (sum of completion times)."""
    net = run.net
    used_rounds = 0
    while used_rounds < rounds and states and not run.out_of_time():
        tick()
        used_rounds += 1
        crit, times, free = run.critical(states)
        cs = states[crit]
        best = _best_move(run, cs, free, states, times, donors=False)
        if best is None:
            best = _best_move(run, cs, free, states, times, donors=True)
        if best is None:
            break
        for k, (p, e) in best.items():
            s = states[k]
            states[k] = JobState.of(s.job, p, e)
    for _ in range(max(2, rounds - used_rounds)):
        if run.out_of_time() or not states:
            break
        tick()
        used = np.zeros(net.n, dtype=bool)
        for s in states.values():
            used[s.group] = True
        makespan = max(s.est.job_s for s in states.values())
        if not _improve_others(run, states, np.flatnonzero(~used), makespan):
            break


def _best_move(run: SearchRun, cs: JobState, free: np.ndarray, states, times, donors: bool):
    """The candidate move with the lowest (makespan, sum of times), if it improves on now."""
    crit = cs.job.name
    makespan, total = times[crit], sum(times.values())
    best_key, best = None, None
    for cand_nodes, donor, donor_nodes, extra in _candidates(run, cs, free, states, times, donors):
        if run.out_of_time():   # stopped: the best move so far (each one is valid on its own)
            break
        new_c = run.solve(cs.job, np.concatenate([cs.group, cand_nodes]), Effort.FAST, cs.hint)
        if new_c.placement is None or (new_c.estimate.job_s >= makespan * (1 - 1e-9)
                                       and donor is not None):
            continue
        upd = {crit: new_c}
        if donor is not None:
            ds = states[donor]
            rest = np.setdiff1d(ds.group, donor_nodes)
            if extra is not None and extra.size:
                rest = np.union1d(rest, extra)
            rest = np.setdiff1d(rest, new_c.placement.nodes)
            if rest.size == 0:
                continue
            new_d = run.solve(ds.job, rest, Effort.FAST, ds.hint)
            if new_d.placement is None:
                continue
            upd[donor] = new_d
        new_times = dict(times)
        for k, (p, e) in upd.items():
            new_times[k] = e.job_s
        key = (max(new_times.values()), sum(new_times.values()))
        better = key[0] < makespan * (1 - 1e-9) or (key[0] <= makespan
                                                     and key[1] < total * (1 - 1e-9))
        if better and (best_key is None or key < best_key):
            best_key, best = key, upd
    return best


def _candidates(run: SearchRun, cs: JobState, free: np.ndarray, states, times, donors: bool):
    """Node sets to add to the critical job: free cluster chunks nearest to it, and chunks of
    the jobs with most slack."""
    net = run.net
    out = []
    if free.size and not donors:
        near = net.rtt_ms[np.ix_(free, cs.group)].min(axis=1)
        lab = run.labels[free]
        by_cluster: dict[int, np.ndarray] = {}
        for c in np.unique(lab):
            by_cluster[int(c)] = free[lab == c]
        ranked = sorted(by_cluster, key=lambda c: (near[lab == c].min(), -net.thr[by_cluster[c]].sum(), c))
        for c in ranked[:4]:
            members = by_cluster[c]
            members = members[np.lexsort((members, -net.thr[members]))]
            out.append((members, None, None, None))
            if members.size >= 4:
                out.append((members[:members.size // 2], None, None, None))
            elif members.size > 1:
                out.append((members[:1], None, None, None))
        big = sorted(by_cluster, key=lambda c: (-net.thr[by_cluster[c]].sum(), c))[:2]
        for c in big:
            if c not in ranked[:4]:
                out.append((by_cluster[c], None, None, None))
    if not donors:
        return out
    # Chunks of other jobs' groups near the critical job; the donor is compensated with free
    # nodes of its own clusters and of the nearest free cluster.
    comp = run.components[cs.group[0]]
    others = [k for k in states if k != cs.job.name
              and run.components[states[k].group[0]] == comp]
    dist_to_c = {k: float(net.rtt_ms[np.ix_(states[k].group, cs.group)].min()) for k in others}
    makespan = times[cs.job.name]
    near_jobs = sorted(others, key=lambda k: (dist_to_c[k], times[k], k))[:3]
    slack = sorted(others, key=lambda k: (-(makespan - times[k]) * net.thr[states[k].group].sum(),
                                          k))[:3]
    for d in dict.fromkeys(near_jobs + slack):
        g = states[d].group
        lab = run.labels[g]
        near = net.rtt_ms[np.ix_(g, cs.group)].min(axis=1)
        clusters = sorted(np.unique(lab), key=lambda c: (near[lab == c].min(), c))
        for c in clusters[:2]:
            members = g[lab == c]
            members = members[np.lexsort((members, -net.thr[members]))]
            sizes = {members.size, members.size // 2, members.size // 4, members.size // 8}
            for size in sorted(x for x in sizes if x >= 1):
                chunk = members[:size]
                out.append((chunk, d, chunk, _compensation(run, g, chunk, free)))
        # Exchange: the critical job may take the donor's whole group; the donor gets what
        # the critical job leaves of its old group, plus free nodes near it.
        comp_nodes = np.union1d(cs.group, _compensation(run, np.union1d(g, cs.group), g, free))
        out.append((g, d, g, comp_nodes))
    return out


def _compensation(run: SearchRun, group: np.ndarray, chunk: np.ndarray, free: np.ndarray
                  ) -> np.ndarray:
    """Free nodes a donor may take instead of ``chunk``: free nodes in its remaining clusters,
    plus the free cluster nearest to its remaining nodes."""
    rest = np.setdiff1d(group, chunk)
    if free.size == 0 or rest.size == 0:
        return np.zeros(0, dtype=np.int64)
    lab_rest = np.unique(run.labels[rest])
    same = free[np.isin(run.labels[free], lab_rest)]
    others = free[~np.isin(run.labels[free], lab_rest)]
    if others.size:
        near = run.net.rtt_ms[np.ix_(others, rest)].min(axis=1)
        nearest = run.labels[others[int(np.argmin(near))]]
        same = np.concatenate([same, others[run.labels[others] == nearest]])
    return same


def _improve_others(run: SearchRun, states, free: np.ndarray, makespan: float) -> bool:
    """Give free nodes to non-critical jobs when that shortens them (never past makespan)."""
    improved = False
    if free.size == 0:
        return False
    net = run.net
    for name in sorted(states, key=lambda k: (-states[k].est.job_s, k)):
        s = states[name]
        if run.components[s.group[0]] != run.components[free[0]]:
            continue
        near = net.rtt_ms[np.ix_(free, s.group)].min(axis=1)
        cand = free[near <= max(CLUSTER_RTT_MS, near.min())]
        if cand.size == 0:
            continue
        p, e = run.solve(s.job, np.concatenate([s.group, cand]), Effort.FAST, s.hint)
        if p is not None and e.job_s < s.est.job_s * (1 - 1e-6) and e.job_s <= makespan:
            states[name] = JobState.of(s.job, p, e)
            free = np.setdiff1d(free, p.nodes)
            improved = True
            if free.size == 0:
                break
    return improved


def _polish(run: SearchRun, states: dict[str, JobState]) -> bool:
    """Re-solve every job on its own group with more effort; True when any job got faster."""
    improved = False
    for name in sorted(states):
        s = states[name]
        p, e = run.solve(s.job, s.group, Effort.NORMAL, s.hint)
        if p is not None and e.iteration_s < s.est.iteration_s * (1 - 1e-9):
            states[name] = JobState.of(s.job, p, e)
            improved = True
    return improved


def _run_phases(run: SearchRun, grouping: alg1.Grouping) -> Plan:
    """Every phase of ``grouping`` solved and refined, then assembled into the plan."""
    phases = grouping.phases()
    per_phase_rounds = max(1, run.max_rounds // max(1, len(phases)))
    second_rounds = max(2, per_phase_rounds // 3)
    # Upper bound of ticks: each refine_phase ticks at most rounds + max(2, rounds) times.
    total_ticks = len(phases) * (per_phase_rounds + max(2, per_phase_rounds)
                                 + second_rounds + max(2, second_rounds))
    done = [0]

    def tick():
        done[0] += 1
        if run.progress is not None:
            run.progress(min(done[0], total_ticks), total_ticks)
        if run.snapshot is not None and len(phase_states) == len(phases) - 1:
            run.snapshot(phase_states + [states])   # every phase has a valid solution now

    by_name = {j.name: j for j in run.jobs}
    phase_states: list[dict[str, JobState]] = []
    for ph in phases:
        states: dict[str, JobState] = {}
        for name in grouping.jobs_in_phase(ph):
            st = run.state(by_name[name], np.asarray(grouping.groups[name], dtype=np.int64))
            if st is None:
                raise PlanningError(f"job {name}: Algorithm 1 gave a group with no valid placement")
            states[name] = st
        _refine_phase(run, states, per_phase_rounds, tick)
        if run.out_of_time():
            phase_states.append(states)
            continue
        if _polish(run, states):
            _refine_phase(run, states, second_rounds, tick)
        if grow_bottleneck(run, states):
            _refine_phase(run, states, second_rounds, tick)
        for _ in range(chain_step.CHAIN_ROUNDS if run.options.chains else 0):
            if run.out_of_time() or not chain_step.chain_move(run, states):
                break
            _refine_phase(run, states, second_rounds, tick)
            grow_bottleneck(run, states)
        phase_states.append(states)
    phase_states = _pull_forward(run, phase_states)
    if run.snapshot is not None:
        run.snapshot(phase_states)
    for states in phase_states:
        if not run.out_of_time():   # stopped: the states are valid as they are
            _polish(run, states)
    placements = phase_placements(phase_states, run.jobs)
    if run.progress is not None:
        run.progress(total_ticks, total_ticks)
    notes = grouping.remarks()
    if run.cut_short:
        notes.append("search stopped at the budget_s safety cap; the plan is valid but may "
                     "differ from an uncapped run")
    facts = PlanFacts(cut_short=run.cut_short, unscored_jobs=grouping.unscored_jobs)
    return Plan("search", placements, notes=notes, facts=facts)


def phase_placements(phase_states: list[dict[str, JobState]], jobs: list[Job]) -> list[Placement]:
    """Every job's placement with its phase's index, in (phase, ``jobs``' order)."""
    order = {j.name: k for k, j in enumerate(jobs)}
    placements = [dataclasses.replace(s.placement, phase=ph)
                  for ph, states in enumerate(phase_states) for s in states.values()]
    placements.sort(key=lambda p: (p.phase, order[p.job.name]))
    return placements


def _pull_forward(run: SearchRun, phase_states: list[dict[str, JobState]]
                  ) -> list[dict[str, JobState]]:
    """Move a later-phase job into an earlier phase on free nodes when that ends sooner."""
    changed = True
    while changed and len(phase_states) > 1 and not run.out_of_time():
        changed = False
        for ph in range(1, len(phase_states)):
            for name in sorted(phase_states[ph]):
                s = phase_states[ph][name]
                for target in range(ph):
                    used = np.zeros(run.net.n, dtype=bool)
                    for t in phase_states[target].values():
                        used[t.group] = True
                    free = np.flatnonzero(~used)
                    if free.size == 0:
                        continue
                    comp = np.bincount(run.components[free]).argmax()
                    free = free[run.components[free] == comp]
                    if not alg1.fits(s.job, run.net, free):
                        continue
                    new = run.state(s.job, free, Effort.NORMAL)
                    if new is None:
                        continue
                    before = phases_makespan(phase_states)
                    trial = [dict(x) for x in phase_states]
                    del trial[ph][name]
                    trial[target][name] = new
                    trial = [x for x in trial if x]
                    if phases_makespan(trial) < before * (1 - 1e-9):
                        phase_states = trial
                        changed = True
                        break
                if changed:
                    break
            if changed:
                break
    return phase_states


def phases_makespan(phase_states: list[dict[str, JobState]]) -> float:
    """Makespan of phases run one after another: the sum of each phase's longest job."""
    return sum(max(s.est.job_s for s in states.values()) for states in phase_states if states)


def plan_search(jobs: list[Job], net: Network, *, options: SearchOptions = SearchOptions(),
                progress: Callable[[int, int], None] | None = None,
                initial: alg1.Grouping | np.ndarray | None = None,
                should_stop: Callable[[], bool] | None = None,
                snapshot: Callable[[list[dict[str, JobState]]], None] | None = None) -> Plan:
    """Plan all ``jobs`` on ``net`` (method "search"; the pipeline is described in planner.search).

    ``options`` (planner.search.options.SearchOptions): the rounds of cross-group moves, the
    wall-clock safety cap, and whether stage ordering and chains of relocations run.
    ``initial``: a Grouping (e.g. the GNN's, after Algorithm 1) or a class-score array
    (n x (jobs + 1)) to start from instead of the heuristic scores. ``should_stop()``, asked
    between rounds, is a second safety stop (the portfolio's, which can move while the search
    runs). ``progress(done, total)`` is called once per round. ``snapshot(phases)`` (the
    portfolio's anytime results) gets each phase's job states once per round once every phase
    has them; it must not change them. The plan's ``facts`` say whether a stop cut it short.
    """
    return search_sharing(jobs, net, None, options=options, progress=progress, initial=initial,
                          should_stop=should_stop, snapshot=snapshot)


def search_sharing(jobs: list[Job], net: Network, grids: GridCache | None, *,
                   options: SearchOptions = SearchOptions(),
                   progress: Callable[[int, int], None] | None = None,
                   initial: alg1.Grouping | np.ndarray | None = None,
                   should_stop: Callable[[], bool] | None = None,
                   snapshot: Callable[[list[dict[str, JobState]]], None] | None = None) -> Plan:
    """:func:`plan_search` with the solver's answers kept in ``grids``, a GridCache its caller
    shares between runs on ``net`` (the portfolio's starts in one process ask for many of the
    same grids); None: one of this run's own. The plan does not depend on it."""
    jobs = list(jobs)
    if net.n == 0:
        raise PlanningError("the fleet has no nodes")
    if not jobs:
        return Plan("search", [])
    names = [j.name for j in jobs]
    if len(set(names)) != len(names):
        raise PlanningError("job names must be unique")
    run = SearchRun(jobs, net, options, progress, should_stop, snapshot, grids)
    if isinstance(initial, alg1.Grouping):
        grouping = initial
        missing = set(names) - set(grouping.groups)
        if missing:
            raise PlanningError(f"initial grouping lacks jobs {sorted(missing)}")
    else:
        scores = initial if initial is not None else heuristic_scores(
            jobs, net, labels=run.labels, components=run.components)
        grouping = alg1.algorithm1(jobs, net, np.asarray(scores), labels=run.components)
    return _run_phases(run, grouping)
