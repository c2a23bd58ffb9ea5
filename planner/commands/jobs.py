"""`hulk-planner jobs submit|list|show|cancel|logs`: jobs as durable records in the store.

`serve --mqtt` owns them (planner/service/lifecycle.py): it plans queued jobs on free nodes,
follows their ranks to running and succeeded or failed, and retires finished and cancelled jobs
(their nodes' placements are cleared, so their processes stop). These commands only read and
write the records; the states are in docs/JOBS.md.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hulk.errors import InputError, NotFoundError
from hulk.plural import count
from hulk.validate import terminal_safe as _terminal_safe
from planner.core.lifecycle import CANCELLED, FENCED, FINAL, JobRecord
from planner.service.job_progress import JobIteration, estimated_iteration_s, measured
from planner.settings import PlannerSettings

if TYPE_CHECKING:
    from planner.service.store import Store

LOGS_NOTE = ("each rank's last report, kept after the job ends (refreshed every 10 s while it "
             "runs): the lines around the first error, the last lines, and where the full log is "
             "on its node")


def register(subparsers: argparse._SubParsersAction, settings: PlannerSettings) -> None:
    p = subparsers.add_parser("jobs", help="submit, list, show, cancel jobs and read their logs",
                              description=__doc__)
    sub = p.add_subparsers(dest="jobs_command", metavar="ACTION", required=True)

    def db(q: argparse.ArgumentParser) -> None:
        q.add_argument("--db", default=settings.db, help="the planner's SQLite store (HULK_DB)")

    submit = sub.add_parser("submit", help="validate a jobs.yaml and queue its jobs")
    submit.add_argument("jobs", type=Path, help="jobs.yaml")
    submit.add_argument("--plan-only", action="store_true",
                        help="check jobs that have no command and queue nothing (plan them with "
                             "`hulk-planner plan`)")
    db(submit)
    submit.set_defaults(func=cmd_submit)
    listing = sub.add_parser("list", help="a table of jobs: state, nodes, times, restarts")
    db(listing)
    listing.add_argument("--json", action="store_true", help="one JSON document instead")
    listing.set_defaults(func=cmd_list)
    for name, func, text in (("show", cmd_show, "one job: its spec, nodes and every state change"),
                             ("cancel", cmd_cancel, "cancel a job (serve stops its processes)"),
                             ("logs", cmd_logs, "the last lines each rank reported")):
        q = sub.add_parser(name, help=text)
        q.add_argument("name", help="the job's name")
        db(q)
        if name == "logs":
            q.add_argument("--node", help="only this node's rank")
        q.set_defaults(func=func)


def _store(args: argparse.Namespace, create: bool = False, read_only: bool = False) -> Store:
    """The store of --db: ``read_only`` for the commands that only read (they work on a
    read-only copy and never change the file); ``create`` when a missing file may be made."""
    if not args.db:
        raise InputError("expected a store path", field="--db")
    if not create and not read_only and not Path(args.db).is_file():
        raise InputError("no such store (expected the SQLite file `serve --db` writes)", path=str(args.db))
    from planner.service.store import Store
    return Store(args.db, read_only=read_only)


def _job(store: Store, name: str) -> JobRecord:
    try:
        return store.job_by_name(name)
    except NotFoundError as exc:
        raise InputError(str(exc), field="name") from None


def _fleet_gpu_bytes(store: Store) -> float | None:
    """The GPU memory of every node the store knows, in bytes; None when it knows none (or none
    reported memory), so nothing is checked against it."""
    total = sum(float(n.get("memory_gb") or 0.0) for n in store.nodes())
    return total * 1e9 if total > 0 else None


def cmd_submit(args: argparse.Namespace) -> int:
    from planner.core.job_checks import submit_problems
    from planner.core.placements import job_spec
    from planner.files.jobs import load_jobs

    jobs = load_jobs(args.jobs)

    def check(fleet_bytes: float | None, agent_commands=None) -> None:
        for job in jobs:
            problems = submit_problems(job, job.command, fleet_gpu_bytes=fleet_bytes,
                                       plan_only=args.plan_only, agent_commands=agent_commands)
            if problems:
                field, _, why = problems[0].partition(": ")
                raise InputError(f"job {job.name!r}: {why}", path=str(args.jobs), field=field)

    if args.plan_only:   # the store, when there is one, only tells the fleet's memory
        if args.db and Path(args.db).is_file():
            with _store(args, read_only=True) as store:
                check(_fleet_gpu_bytes(store))
        else:
            check(None)
        print(f"checked {count(len(jobs), 'job')}: {', '.join(j.name for j in jobs)}; --plan-only "
              f"queues nothing (`hulk-planner plan {args.jobs} --db DB` plans them)")
        return 0
    with _store(args, create=True) as store:
        check(_fleet_gpu_bytes(store), store.allowed_commands())
        active = {r.name: r.state for r in store.job_records() if r.active}
        taken = [j.name for j in jobs if j.name in active]
        if taken:
            raise InputError(f"job {taken[0]!r} is already {active[taken[0]]}; cancel it or pick "
                             "another name", path=str(args.jobs), field="name")
        store.submit_jobs([(job.name, job_spec(job)) for job in jobs])   # all or none
    print(f"queued {count(len(jobs), 'job')}: {', '.join(j.name for j in jobs)} "
          f"(`hulk-planner serve --mqtt` starts them on free nodes)")
    return 0


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def _when(ms: int | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ms / 1000)) if ms else "-"


def _step(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 1e-3:     # the lab's tiny example job: its estimate is microseconds
        return f"{seconds * 1e6:.1f} us"
    return f"{seconds * 1000:.0f} ms" if seconds < 1 else f"{seconds:.2f} s"


def _measured_vs_estimated(measured: float | None, estimated: float | None) -> str:
    """``0.231 s / est. 0.200 s (+16%)``: a step's measured time against the plan's estimate."""
    if measured is None:
        return f"- / est. {_step(estimated)}" if estimated is not None else "-"
    if estimated is None or estimated <= 0:
        return _step(measured)
    ratio = measured / estimated
    off = f"{ratio:.0f}x" if ratio >= 10 else f"{(ratio - 1) * 100:+.0f}%"
    return f"{_step(measured)} / est. {_step(estimated)} ({off})"


def _row(record: JobRecord, cities: dict[str, str], now_ms: int,
         iteration: JobIteration | None = None) -> dict[str, Any]:
    end = record.finished_ms or now_ms
    return {"name": record.name, "state": record.state, "nodes": list(record.nodes),
            "cities": sorted({cities[n] for n in record.nodes if cities.get(n)}),
            "submitted_ms": record.submitted_ms, "started_ms": record.started_ms,
            "finished_ms": record.finished_ms,
            "elapsed_s": (end - record.started_ms) / 1000 if record.started_ms else None,
            "estimate_s": record.estimate_s, "restarts": record.restarts, "failures": record.failures,
            "fences": record.fences, "plan_id": record.plan_id,
            "detail": record.detail,
            "iteration_s": iteration.measured_iteration_s if iteration else None,
            "iteration_samples": iteration.samples if iteration else 0,
            "iteration_estimate_s": estimated_iteration_s(record)}


def _first_line(detail: str, limit: int | None = None) -> str:
    """A detail's first line, safe for a terminal, cut to ``limit`` characters."""
    line = _terminal_safe(detail.splitlines()[0]) if detail.strip() else ""
    return line if limit is None or len(line) <= limit else line[:limit - 3] + "..."


def cmd_list(args: argparse.Namespace) -> int:
    with _store(args, read_only=True) as store:
        records = store.job_records()
        cities = {n.id: n.city for n in store.node_records()}
        measured = {(j.job_name, j.plan_id): j for j in store.job_iterations()}
    now = int(time.time() * 1000)
    rows = [_row(r, cities, now, measured.get((r.name, r.plan_id))) for r in records]
    if args.json:
        print(json.dumps({"jobs": rows}, indent=2))
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"jobs in {args.db}")
    for column in ("name", "state", "nodes", "cities", "started", "elapsed", "estimate",
                   "step: measured / estimated", "restarts", "detail"):
        table.add_column(column, justify="right" if column == "restarts" else "left")
    for r in rows:
        table.add_row(r["name"], r["state"], ", ".join(r["nodes"]) or "-", ", ".join(r["cities"]) or "-",
                      _when(r["started_ms"]), _duration(r["elapsed_s"]), _duration(r["estimate_s"]),
                      _measured_vs_estimated(r["iteration_s"], r["iteration_estimate_s"]),
                      str(r["restarts"]), _first_line(r["detail"], 60) or "-")
    Console(width=200).print(table) if rows else print("no jobs (hulk-planner jobs submit jobs.yaml)")
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    with _store(args, read_only=True) as store:
        record = _job(store, args.name)
        cities = {n.id: n.city for n in store.node_records()}
        ranks = store.rank_progress(record.id, record.plan_id) if record.plan_id else []
    figures = measured(ranks)
    now = int(time.time() * 1000)
    row = _row(record, cities, now)
    first = _first_line(record.detail)
    print(f"job {record.name}: {record.state}" + (f" ({first})" if first else ""))
    for line in record.detail.splitlines()[1:]:
        print(f"    {_terminal_safe(line)}")
    print(f"  nodes     {', '.join(record.nodes) or '-'}  ({', '.join(row['cities']) or '-'})")
    print(f"  plan      {record.plan_id or '-'}   restarts {record.restarts} "
          f"(after its own failures {record.failures} of at most {record.max_restarts})")
    if record.fences:
        print(f"  fenced    {count(record.fences, 'time')}: the node's lease lapsed (no "
              "heartbeat acknowledged in time); restarted without spending max_restarts")
    print(f"  elapsed   {_duration(row['elapsed_s'])}   estimate {_duration(record.estimate_s)}")
    step = _measured_vs_estimated(figures[0] if figures else None, row["iteration_estimate_s"])
    print(f"  step      {step}"
          + (f"   (slowest rank's median of {figures[1]} steps)" if figures else ""))
    for r in ranks:
        p = r.progress
        total = f"/{p.total_steps}" if p.total_steps else ""
        split = (f"  compute {_step(p.compute_s)}  communication {_step(p.communication_s)}"
                 if p.compute_s or p.communication_s else "")
        rank = r.rank if r.rank is not None else "?"
        print(f"    rank {rank} {r.node_id}: step {p.steps}{total}  "
              f"median {_step(p.iteration_s if p.samples else None)}  "
              f"p90 {_step(p.iteration_p90_s if p.samples else None)}{split}  "
              f"({count(p.samples, 'step')}, heard {_duration(max(0, now - r.received_ms) / 1000)} ago)")
    print(f"  spec      {json.dumps(dict(record.spec), sort_keys=True)}")
    print("  history")
    for state, at_ms, detail in record.events:
        print(f"    {_when(at_ms)}  {state:<9} {_first_line(detail)}")
        for line in detail.splitlines()[1:]:
            print(f"{'':35}{_terminal_safe(line)}")
    return 0


def cmd_cancel(args: argparse.Namespace) -> int:
    with _store(args) as store:
        record = _job(store, args.name)
        if record.state in FINAL:
            raise InputError(f"job {record.name!r} is already {record.state}", field="name")
        store.update_job(record.id, state=CANCELLED, detail="cancelled by an operator")
    print(f"cancelled {record.name} (was {record.state}); `serve --mqtt` clears its nodes' "
          "placements, so its processes stop")
    return 0


def _rank_header(state: str, exit_code: int, job_ended: bool, exit_cause: str = "") -> str:
    """What a rank's last report says, by state: only an ended rank has an exit code (and a
    fenced one says so)."""
    if state == "exited" and exit_cause == FENCED:
        return f"fenced (the node's lease lapsed), exit code {exit_code}"
    if state == "exited":
        return "exited 0" if exit_code == 0 else f"exited, exit code {exit_code}"
    if state == "failed":
        return "failed (could not start)"
    if state in ("running", "starting") and job_ended:
        return f"last reported {state} (the job has ended since)"
    return state


def cmd_logs(args: argparse.Namespace) -> int:
    from planner.service.job_ranks import RankReport, rank_reports

    with _store(args, read_only=True) as store:
        record = _job(store, args.name)
        nodes_now = {n.id: n for n in store.node_records()}
        kept = {r.node_id: r for r in rank_reports(store, record.id)}
    ranks: dict[str, RankReport | None] = {}
    for node in (*record.nodes, *sorted(set(kept) - set(record.nodes))):
        live = nodes_now[node].launch if node in nodes_now else None
        if live is not None and live.job == record.name and live.plan_id == record.plan_id:
            seen = nodes_now[node].last_seen_ms or 0
            ranks[node] = RankReport(node, live.plan_id, live.state, live.exit_code, live.detail,
                                     seen, live.exit_cause)
        else:
            ranks[node] = kept.get(node)
    if args.node:
        if args.node not in ranks:
            raise InputError(f"job {record.name!r} has no rank on {args.node!r} (its nodes: "
                             f"{', '.join(ranks) or 'none'})", field="--node")
        ranks = {args.node: ranks[args.node]}
    print(f"job {record.name} ({record.state}); {LOGS_NOTE}")
    if not ranks:
        print("no rank has reported for this job" + (f" ({_first_line(record.detail)})"
                                                      if record.detail.strip() else ""))
    now = int(time.time() * 1000)
    for node, report in ranks.items():
        where = f"rank {record.nodes.index(node)}" if node in record.nodes else "earlier placement"
        if report is None:
            print(f"== {node} ({where}): no report for this job")
            continue
        plan = "" if report.plan_id == record.plan_id else f", plan {report.plan_id}"
        heard = _duration(max(0, now - report.changed_ms) / 1000) if report.changed_ms else "-"
        header = _rank_header(report.state, report.exit_code, record.state in FINAL,
                              report.exit_cause)
        print(f"== {node} ({where}{plan}): {header} (heard {heard} ago)")
        for line in report.detail.splitlines():
            print(f"   {_terminal_safe(line)}")
    return 0
