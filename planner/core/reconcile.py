"""Reconciling what nodes run with the current plan, as pure decisions.

Values in, decisions out (the serve task, planner/service/reconcile.py, reads the summary, the
nodes' reports and the job records, and re-sends placements):

- :func:`expected_by_node`: what the plan summary gives each node, as (job, plan id) pairs.
- :func:`mismatch`: whether a node's last report disagrees with what it is given, and how.
- :func:`reconcile`: the nodes whose placement is to be sent again this round.
- :func:`deleted`: the nodes whose retained placement is gone, sent again in the same round.
- :func:`as_sent`: a placement rebuilt from the summary, made to agree with what the job's other
  ranks were sent.

A node is *lost* when the plan gives it a job it does not report (idle, or another job or plan
id): its placement went missing (a deleted retained message, an agent that lost its state), so
it is sent again. A node is *unplanned* when it reports running or starting a job the plan does
not give it: it is sent its placement again (a clear when it has none), so the agent stops that
process. A mismatch must last ``grace_ms`` before anything is sent, so a placement on its way
(an agent still starting, a cleared process still stopping) is never sent twice, and a node is
sent at most once every ``gap_ms``. A node the plan gives a job whose retained placement is
gone (:func:`deleted`) is sent it again in the round that sees it, whatever the node reports.
Silent nodes are recovery's: they are left alone here.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field, replace

from hulk.wire.placement import NodePlacement, Role, SummaryJob
from planner.core.lifecycle import RankState

LOST, UNPLANNED = "lost", "unplanned"
REASONS = (LOST, UNPLANNED)
ACTIVE_STATES = frozenset({"running", "starting"})
RESEND_GAP_MS = 30_000
MIN_GRACE_S = 10.0

Given = frozenset[tuple[str, str]]       # (job, plan id) pairs a node is given
Key = tuple[str, str, str]               # (reason, job, plan id): what a mismatch is about


def grace_s(interval_s: float, node_timeout_s: float = 0.0) -> float:
    """How long a mismatch must last before a placement is sent again: three reconcile rounds,
    at least the node timeout (a live node's heartbeat, which carries its launch state, comes
    within it) and never less than ``MIN_GRACE_S`` (an agent takes seconds to stop a process)."""
    return max(3.0 * interval_s, node_timeout_s, MIN_GRACE_S)


@dataclass(frozen=True)
class Resend:
    """Send ``node`` its placement again. ``job``/``plan_id``: lost, a job it should run but does
    not report; unplanned, the job it runs though the plan does not give it that one."""

    node: str
    reason: str
    job: str
    plan_id: str


@dataclass(frozen=True)
class Decision:
    resend: list[Resend] = field(default_factory=list)
    # node -> (what its mismatch is about, when it was first seen): kept for the next round
    since: dict[str, tuple[Key, int]] = field(default_factory=dict)


def expected_by_node(jobs: Iterable[SummaryJob]) -> dict[str, Given]:
    """Node id -> the (job, plan id) pairs the summary's ``jobs`` give it."""
    out: dict[str, set[tuple[str, str]]] = {}
    for job in jobs:
        for node in job.node_ids:
            out.setdefault(node, set()).add((job.name, job.plan_id))
    return {node: frozenset(given) for node, given in out.items()}


def mismatch(given: Given, report: RankState, final_jobs: Collection[str] = ()) -> Key | None:
    """What is wrong with a node's ``report`` given ``given``; None when nothing is.

    A report of one of its jobs and plan ids (whatever the state: exited and failed ranks are
    the lifecycle's) is right. Running or starting anything else is unplanned; reporting
    nothing of its jobs is lost, unless every job it is given is final (``final_jobs``: a
    finished job waiting to be retired is never started again)."""
    if (report.job, report.plan_id) in given:
        return None
    if report.state in ACTIVE_STATES:
        return UNPLANNED, report.job, report.plan_id
    live = sorted(pair for pair in given if pair[0] not in final_jobs)
    if live:
        return (LOST, *live[0])
    return None


def reconcile(given: Mapping[str, Given], reports: Mapping[str, RankState],
              silent: Collection[str], *, now_ms: int, grace_ms: float,
              since: Mapping[str, tuple[Key, int]], last_sent: Mapping[str, int],
              final_jobs: Collection[str] = (), gap_ms: int = RESEND_GAP_MS) -> Decision:
    """This round's re-sends.

    ``given``: :func:`expected_by_node` of the current summary (empty without one); ``reports``:
    each node's last launch report (only nodes with an agent that reported); ``silent``: nodes
    past the node timeout; ``since``: the previous round's :attr:`Decision.since`; ``last_sent``:
    node -> when it was last sent a placement by a reconcile round; ``final_jobs``: names of
    jobs whose record is final."""
    out = Decision()
    for node in sorted(reports):
        if node in silent:
            continue
        key = mismatch(given.get(node, frozenset()), reports[node], final_jobs)
        if key is None:
            continue
        previous = since.get(node)
        first = previous[1] if previous is not None and previous[0] == key else now_ms
        out.since[node] = (key, first)
        sent = last_sent.get(node)
        if now_ms - first >= grace_ms and (sent is None or now_ms - sent >= gap_ms):
            out.resend.append(Resend(node, *key))
    return out


def deleted(given: Mapping[str, Given], absent: Collection[str], silent: Collection[str],
            final_jobs: Collection[str] = (), already: Collection[str] = ()) -> list[Resend]:
    """Nodes the plan gives a live job whose retained placement is gone (``absent``: deleted,
    or lost by the broker), whatever they report: sent again this round, with no grace (a node
    running its job would never be noticed by :func:`reconcile`, and an agent that restarts
    would find nothing). Silent nodes are recovery's; ``already``: nodes re-sent this round."""
    out = []
    for node in sorted(set(absent) - set(silent) - set(already)):
        live = sorted(pair for pair in given.get(node, ()) if pair[0] not in final_jobs)
        if live:
            out.append(Resend(node, LOST, *live[0]))
    return out


def as_sent(placement: NodePlacement, sent: Iterable[Role]) -> NodePlacement:
    """``placement`` (rebuilt from the summary) with each role's rendezvous and restart count
    taken from a role of the same job and plan id in ``sent`` (what other nodes were sent), where
    there is one: rendezvous ports depend on the jobs a plan held when it was made, so a rebuilt
    role could name another port than its job's other ranks use."""
    ref: dict[tuple[str, str], Role] = {}
    for role in sent:
        ref.setdefault((role.job, role.plan_id), role)
    roles = tuple(replace(r, rendezvous_address=p.rendezvous_address,
                          rendezvous_port=p.rendezvous_port, restart_count=p.restart_count)
                  if (p := ref.get((r.job, r.plan_id))) is not None else r
                  for r in placement.roles)
    return replace(placement, roles=roles)
