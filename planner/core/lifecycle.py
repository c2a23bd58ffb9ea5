"""A job's life as pure decisions: queued -> placed -> running -> succeeded / failed, or cancelled.

Values in, decisions out (the serve task, planner/service/lifecycle.py, reads the store and the
broker, pushes and writes):

- :class:`JobRecord`: one submitted job as the store keeps it (its spec as jobs.yaml gave it).
- :func:`next_state`: where a placed or running job goes, from its ranks' launch states: on,
  failed for good, restarted (:data:`RESTART`) after a failure of its own processes, or
  restarted without spending its budget (:data:`FENCED_RESTART`) after a rank was fenced (its
  node's lease lapsed: serve was unreachable, not the job at fault).
- :func:`restart_wait`: whether a restart is due (its back-off passed, every node heard from
  since the failure), else why it waits; :func:`give_up_wait` likewise for a job whose budget
  is spent (:data:`GIVE_UP`: it fails once every node is heard from, no back-off).
- :func:`to_retire`: finished or cancelled jobs whose nodes still hold their placement.
- :func:`place_queued`: queued jobs planned on the nodes no active job uses (phase 0 only: a job
  that would have to wait for another stays queued until nodes free up); a job that can never
  be planned fails alone with its reason, one that waits says why.

A succeeded job is final: nothing here ever moves it back to queued, so it never runs again.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from hulk.errors import PlanningError
from hulk.plural import count
from planner.core.costmodel import Placement, estimate
from planner.core.fleet import Network
from planner.core.job_checks import submit_problems
from planner.core.jobs import DEFAULT_MAX_RESTARTS, Job
from planner.core.placements import job_from_spec, spec_max_restarts, stages_doc
from planner.core.plan import Plan
from planner.core.recovery import down_nodes, free_nodes, plan_on

if TYPE_CHECKING:
    from planner.methods import Planner

QUEUED, PLACED, RUNNING = "queued", "placed", "running"
SUCCEEDED, FAILED, CANCELLED = "succeeded", "failed", "cancelled"
STATES = (QUEUED, PLACED, RUNNING, SUCCEEDED, FAILED, CANCELLED)
LIVE = frozenset({QUEUED, PLACED, RUNNING})          # may still run
FINAL = frozenset({SUCCEEDED, FAILED, CANCELLED})    # never runs again
RESTART = "restart"      # a decision of next_state, never a record's state
FENCED_RESTART = "fenced restart"   # likewise: a restart that spends no budget
GIVE_UP = "give up"      # likewise: failed once every node is heard from (give_up_wait)
FENCED = "fenced"        # RankState.exit_cause: its wrapper stopped it, the node's lease lapsed

# Back-off before a restart: 5 s after the first failure, doubling up to 2 minutes, so a job
# whose crash is not transient spends its budget in minutes, not seconds.
BACKOFF_FIRST_S, BACKOFF_MAX_S = 5.0, 120.0
_ERROR_LINE = re.compile(r"error|exception|traceback|fatal|killed", re.IGNORECASE)
_SIGNAL = re.compile(r"Signal \d+ \(SIG\w+\)")              # torchrun: a worker killed
_EXCEPTION = re.compile(r"^[\w.]*(Error|Exception|Interrupt)\b: *\S")   # with a message
_LEASE_LAPSED = "the node's lease lapsed"
_NOT_CAUSES = ("exit code", "first error", "last lines", "full log:", "Traceback", "File ",
               "raise ")


@dataclass(frozen=True)
class JobRecord:
    """One submitted job: its state, when each state began, where it runs, how often it restarted."""

    id: int
    name: str
    state: str
    spec: Mapping[str, Any]                 # planner.core.placements.job_spec of the Job
    submitted_ms: int
    changed_ms: int
    plan_id: str | None = None
    nodes: tuple[str, ...] = ()
    restarts: int = 0
    started_ms: int | None = None           # first seen running
    finished_ms: int | None = None
    retired_ms: int | None = None           # its nodes' placements cleared
    estimate_s: float | None = None
    detail: str = ""
    events: tuple[tuple[str, int, str], ...] = field(default=())   # (state, at ms, detail)
    # Its placement's stages (planner.core.placements.stages_doc); None when the record
    # predates kept stages or its placement came without them.
    stages: Mapping[str, Any] | None = None
    failures: int = 0                       # restarts that followed a failure of its own ranks
    fences: int = 0                         # restarts that followed a fenced rank (no budget)

    @property
    def job(self) -> Job:
        return job_from_spec(self.name, self.spec)

    @property
    def max_restarts(self) -> int:
        """Its spec's restart budget (the default when the spec's value is absent or bad)."""
        try:
            return spec_max_restarts(self.spec)
        except ValueError:
            return DEFAULT_MAX_RESTARTS

    @property
    def active(self) -> bool:
        """Still holds its name: live, or finished but its placements not yet cleared."""
        return self.state in LIVE or (self.retired_ms is None and bool(self.nodes))


@dataclass(frozen=True)
class RankState:
    """What a node last reported about its launched process (the store's launch_* columns)."""

    state: str              # idle, starting, running, exited, failed
    job: str = ""
    plan_id: str = ""
    exit_code: int = 0
    detail: str = ""
    exit_cause: str = ""    # exited only: FENCED (whatever its code), else "" (its own exit)
    # When the agent saw this state begin (its clock, unix ms; 0: unknown); not what a rank is.
    changed_ms: int = field(default=0, compare=False)

    @property
    def fenced(self) -> bool:
        return self.state == "exited" and self.exit_cause == FENCED


def next_state(record: JobRecord, ranks: Mapping[str, RankState | None],
               down: Collection[str] = ()) -> tuple[str, str]:
    """(state, detail) of a placed or running job from its nodes' launch states; ``down``: the
    nodes not heard from within the node timeout.

    Only reports for this job and its plan id count. Any rank failed (refused, could not start)
    -> failed for good. A rank fenced (its wrapper stopped it when the node's lease lapsed,
    whatever its exit code) -> :data:`FENCED_RESTART` (detail: the cause), whatever the budget:
    not the job's failure, and its peers' ranks that exited non-zero meanwhile (their
    connections to the fenced rank broke) are its consequence. Else a rank exited non-zero ->
    :data:`RESTART` (detail: the cause) while the job's failures are below its
    ``max_restarts``, else :data:`GIVE_UP` (detail: "gave up after N restarts: <cause>"; it
    fails once every node is heard from, :func:`give_up_wait`). All three wait while any node
    of the job is ``down``: a node that died keeps its last report ("running") and its peers
    exit non-zero when their connections to it break, which is recovery's to handle (it
    re-plans the job after the node timeout) and spends no restart. Every rank exited 0 (none
    fenced) -> succeeded; every rank running (or already done with 0) and at least one running
    -> running; otherwise unchanged.
    """
    if record.state not in (PLACED, RUNNING) or not record.nodes:
        return record.state, record.detail
    mine = {n: r for n in record.nodes
            if (r := ranks.get(n)) is not None and r.job == record.name and r.plan_id == record.plan_id}
    for node, rank in sorted(mine.items()):
        if rank.state == "failed":
            return FAILED, rank_cause(node, rank)
    fenced = sorted(n for n, r in mine.items() if r.fenced)
    crashed = sorted(n for n, r in mine.items()
                     if r.state == "exited" and r.exit_code != 0 and not r.fenced)
    if fenced or crashed:
        if any(n in down for n in record.nodes):
            return record.state, record.detail
        if fenced:
            return FENCED_RESTART, rank_cause(fenced[0], mine[fenced[0]])
        cause = rank_cause(crashed[0], mine[crashed[0]])
        if record.failures < record.max_restarts:
            return RESTART, cause
        return GIVE_UP, f"gave up after {count(record.failures, 'restart')}: {cause}"[:500]
    if len(mine) < len(record.nodes):
        return record.state, record.detail
    states = {r.state for r in mine.values()}
    if states == {"exited"}:
        return SUCCEEDED, "every rank exited 0"
    if states <= {"running", "exited"} and "running" in states:
        return RUNNING, ""
    return record.state, record.detail


def running_since_ms(record: JobRecord, ranks: Mapping[str, RankState | None]) -> int | None:
    """When the last of ``record``'s ranks started running, as their agents report it (None:
    unknown): the moment the job as a whole began to train."""
    times = [r.changed_ms for n in record.nodes
             if (r := ranks.get(n)) is not None and r.job == record.name
             and r.plan_id == record.plan_id and r.state == "running"]
    return max(times) if times and all(times) else None


def rank_cause(node: str, rank: RankState) -> str:
    """One line on why a rank ended: ``NODE: exit code C: <first error line>`` (the first line
    of the agent's detail matching error, exception, traceback, fatal or killed), for a fenced
    rank ``NODE: fenced: <why, as its wrapper recorded it>``, or for a rank that could not
    start, ``NODE: <its detail>``."""
    lines = [ln.strip() for ln in rank.detail.splitlines() if ln.strip()]
    if rank.fenced:
        head = lines[0] if lines else ""
        why = head.removeprefix("fenced:").strip() if head.startswith("fenced:") else ""
        return f"{node}: fenced: {why or _LEASE_LAPSED}"[:300]
    if rank.state != "exited":
        return f"{node}: {' '.join(lines) or 'could not start'}"[:300]
    code = rank.exit_code
    head = (f"{node}: killed by signal {-code}" if code < 0 else
            f"{node}: exit code {code}" + (f" (signal {code - 128})" if 128 < code < 160 else ""))
    error = _error_line(lines)
    return (f"{head}: {error}" if error else head)[:300]


def _error_line(lines: list[str]) -> str:
    """The line of a rank's log that says most about its end: a signal torchrun reports, else
    a Python exception with its message, else the first line naming an error (headers,
    ``Traceback``, ``File`` and ``raise`` lines say nothing of what went wrong)."""
    for line in lines:
        if m := _SIGNAL.search(line):
            return line[m.start():]
    candidates = [ln for ln in lines if _ERROR_LINE.search(ln) and not ln.startswith(_NOT_CAUSES)]
    for line in candidates:
        if _EXCEPTION.match(line):
            return line
    return candidates[0] if candidates else ""


def backoff_ms(failures: int) -> int:
    """How long after a failure the job restarts: 5 s, 10 s, 20 s ... up to 120 s."""
    return int(min(BACKOFF_FIRST_S * 2.0 ** min(failures, 16), BACKOFF_MAX_S) * 1000)


def restart_turn(record: JobRecord, *, fenced: bool = False) -> str:
    """How a restart names itself: ``restart 2/3`` (the failure it spends of the budget), or
    for a fenced one ``fenced restart (not counted, 1/3 spent)``."""
    if fenced:
        return f"fenced restart (not counted, {record.failures}/{record.max_restarts} spent)"
    return f"restart {record.failures + 1}/{record.max_restarts}"


def restart_wait(record: JobRecord, cause: str, *, failed_at_ms: int, now_ms: int,
                 last_seen_ms: Mapping[str, int | None], fenced: bool = False) -> str | None:
    """None when the job whose rank failed at ``failed_at_ms`` (first seen then) restarts now;
    else the detail it shows meanwhile. It waits for its back-off (a ``fenced`` restart the
    first one, 5 s, however often the job failed: the fence was no fault of its own), and for
    every node of the job to be heard from (``last_seen_ms``) since the failure: a peer that
    died says nothing more, and its job is recovery's."""
    turn = restart_turn(record, fenced=fenced)
    wait_ms = backoff_ms(0 if fenced else record.failures)
    if now_ms < failed_at_ms + wait_ms:
        return f"{turn} after a {wait_ms / 1000:.0f} s back-off: {cause}"
    unheard = _unheard_since(record, failed_at_ms, now_ms, last_seen_ms)
    if unheard:
        return f"{turn} waits to hear from {', '.join(unheard)}: {cause}"
    return None


def give_up_wait(record: JobRecord, cause: str, *, failed_at_ms: int, now_ms: int,
                 last_seen_ms: Mapping[str, int | None]) -> str | None:
    """None when the job whose budget is spent (``cause``: next_state's ``gave up after ...``)
    fails now; else the detail it shows meanwhile. Like a restart it waits for every node of
    the job to be heard from since the failure was first seen (``failed_at_ms``), but with no
    back-off: a peer's rank exits non-zero when a fenced rank stops, and the fenced node's own
    report can come a heartbeat later, which restarts the job instead (a fence spends no
    budget)."""
    unheard = _unheard_since(record, failed_at_ms, now_ms, last_seen_ms)
    if unheard:
        return f"fails once it hears from {', '.join(unheard)}: {cause}"[:500]
    return None


def _unheard_since(record: JobRecord, since_ms: int, now_ms: int,
                   last_seen_ms: Mapping[str, int | None]) -> list[str]:
    """The job's nodes not heard from (``last_seen_ms``) since ``since_ms``, sorted."""
    since_s = max(0.0, (now_ms - since_ms) / 1000.0)
    return sorted(down_nodes({n: last_seen_ms.get(n) for n in record.nodes}, now_ms, since_s))


def to_retire(records: Iterable[JobRecord]) -> list[JobRecord]:
    """Finished or cancelled jobs whose nodes' placements are still to be cleared."""
    return [r for r in records if r.state in FINAL and r.retired_ms is None]


@dataclass
class Placing:
    plan: Plan                       # kept placements + the newly placed (full network indices)
    placed: dict[str, list[str]]     # job name -> its node ids
    estimates: dict[str, float]      # job name -> estimated seconds
    waiting: list[str]               # queued jobs that stay queued
    stages: dict[str, dict[str, Any]] = field(default_factory=dict)   # job name -> stages_doc
    failed: dict[str, str] = field(default_factory=dict)   # job name -> why it can never be planned
    why: dict[str, str] = field(default_factory=dict)      # waiting job name -> why it waits


def place_queued(kept: Plan, net: Network, queued: list[Job], unavailable: Iterable[str], *,
                 search: Planner, seed: int = 0, node_timeout_s: float | None = None) -> Placing:
    """Plan ``queued`` jobs on the nodes of ``net`` that are neither ``unavailable`` (silent) nor
    used by ``kept``'s placements; placements that would wait for another job (phase > 0) are
    dropped, so those jobs wait in the queue instead.

    One job's trouble stays that job's: a job outside the sensible bounds or beyond the whole
    fleet's GPU memory fails (``failed``); when the jobs planned together raise or none of them
    is placed, each is planned alone to find the culprits (any exception fails that job only)
    and the others are planned without them. Each waiting job gets its reason (``why``)."""
    silent = set(unavailable)
    free = free_nodes(kept.placements, net, silent)
    fleet_bytes = float(net.mem.sum()) if net.n else 0.0
    failed: dict[str, str] = {}
    fine: list[Job] = []
    for job in queued:
        # A fleet without GPU memory (agents that declare none yet) is waited out, not failed.
        problems = submit_problems(job, job.command, plan_only=True,
                                   fleet_gpu_bytes=fleet_bytes if fleet_bytes > 0 else None)
        if problems:
            failed[job.name] = f"cannot be planned: {problems[0]}"
        else:
            fine.append(job)
    notes: dict[str, str] = {}
    if net.n and fleet_bytes <= 0:
        free = []      # nothing could hold a layer: say so instead of asking the planner
    new = _placed(kept, net, fine, free, search, seed, notes, failed) if free and fine else []
    if free and len(fine) > 1 and not new:
        alone = [j for j in fine if _placed(kept, net, [j], free, search, seed, notes, failed)]
        new = _placed(kept, net, alone, free, search, seed, notes, failed) if alone else []
        if alone and not new:     # planned alone but not together: one at a time
            new = _placed(kept, net, alone[:1], free, search, seed, notes, failed)
    plan = Plan(method=kept.method, placements=list(kept.placements) + new,
                unplaced=list(kept.unplaced), notes=list(kept.notes))
    placed = {p.job.name: [net.ids[i] for i in p.nodes] for p in new}
    waiting = sorted(j.name for j in fine if j.name not in placed and j.name not in failed)
    busy = {net.ids[i]: p.job.name for p in plan.placements for i in p.nodes}
    why = {name: waiting_reason(net.ids, busy, silent, node_timeout_s=node_timeout_s,
                                note=notes.get(name, ""))
           for name in waiting}
    if net.n and fleet_bytes <= 0:
        why = dict.fromkeys(waiting, f"waiting: none of the {net.n} node(s) has GPU memory "
                                     "(no agent declares GPUs)")
    return Placing(plan, placed, {p.job.name: estimate(p, net).job_s for p in new}, waiting,
                   {p.job.name: stages_doc(p, net) for p in new}, failed, why)


def _placed(kept: Plan, net: Network, jobs: list[Job], free: list[int], search: Planner,
            seed: int, notes: dict[str, str], failed: dict[str, str]) -> list[Placement]:
    """The phase-0 placements of ``jobs`` planned together on ``free``; why the others are not
    placed goes to ``notes``; a lone job whose planning raises anything but a PlanningError goes
    to ``failed``."""
    try:
        got, left = plan_on(free, net, jobs, search=search, seed=seed)
    except PlanningError as exc:
        notes.update({j.name: _one_line(exc) for j in jobs})
        return []
    except Exception as exc:     # noqa: BLE001 - a job the planner cannot carry fails alone
        if len(jobs) == 1:
            failed[jobs[0].name] = f"cannot be planned: {type(exc).__name__}: {_one_line(exc)}"
        return []
    now = [p for p in got if p.phase == 0]
    for p in got:
        if p.phase > 0:
            first = sorted({q.job.name for q in now if set(q.nodes) & set(p.nodes)})
            notes[p.job.name] = f"the plan runs it after {', '.join(first) or 'another job'}"
    notes.update({u.name: u.reason for u in left})
    return now


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text[:240]


def waiting_reason(node_ids: Iterable[str], busy: Mapping[str, str], silent: Collection[str], *,
                   node_timeout_s: float | None = None, note: str = "") -> str:
    """Why a queued job waits: ``busy`` (node id -> the job using it), ``silent`` nodes, and the
    planner's ``note`` when free nodes were not enough."""
    nodes = list(node_ids)
    if not nodes:
        return "waiting: no nodes in the fleet yet"
    if all(n in silent for n in nodes):
        within = f" in the last {node_timeout_s:.0f} s" if node_timeout_s else ""
        return f"waiting: no node heard from{within}"
    parts = []
    if busy:
        parts.append(f"{len(busy)} node(s) run {', '.join(sorted(set(busy.values())))}")
    quiet = [n for n in nodes if n in silent and n not in busy]
    if quiet:
        parts.append(f"{len(quiet)} node(s) silent")
    free = [n for n in nodes if n not in busy and n not in silent]
    context = f" ({'; '.join(parts)})" if parts else ""
    if not free:
        return f"waiting: no free nodes{context}"
    return (f"waiting: {len(free)} free node(s) are not enough{context}"
            + (f": {note}" if note else ""))[:400]
