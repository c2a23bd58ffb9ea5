"""`hulk-planner plan jobs.yaml`: plan jobs on a fleet, show the plan and how it compares.

The methods, their labels and how each is called come from planner.methods; planners are
imported when used, so only `--method gnn` loads torch. With `--push` the plan is
published to the agents through the MQTT broker.
"""

from __future__ import annotations

import argparse
import math
import time
from dataclasses import dataclass
from pathlib import Path

from hulk.errors import ConfigError, HulkError, InputError, PlanningError
from hulk.plural import count
from planner.commands import seed_number
from planner.methods import DEFAULT_METHOD, METHODS, compared_methods, label, planner_for
from planner.settings import PlannerSettings


def register(subparsers: argparse._SubParsersAction, settings: PlannerSettings) -> None:
    p = subparsers.add_parser(
        "plan", help="plan training jobs on a fleet and compare with the baselines",
        description="Plan the jobs of a jobs.yaml on a fleet (a fleet file or the live store), "
                    "print the placement and how it compares with Systems A/B/C, the DT-FM-style "
                    "peer and the compute bound.")
    p.add_argument("jobs", help="jobs.yaml (see docs/DESIGN.md)")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--fleet", metavar="PATH",
                     help="the paper's folder or zip (node_feature.csv, edge.txt) or fleet JSON")
    src.add_argument("--db", metavar="PATH", help="the planner's SQLite store")
    p.add_argument("--method", choices=list(METHODS), default=DEFAULT_METHOD,
                   help=f"planner to use (default {DEFAULT_METHOD}; gnn: the same portfolio "
                        "with the placement GNN's start added)")
    p.add_argument("--seed", type=seed_number, default=0,
                   help="seed of the seeded planners ("
                        + ", ".join(m.name for m in METHODS.values() if m.seeded)
                        + "; default 0)")
    p.add_argument("--time-budget", type=_positive_float, metavar="S", dest="budget_s",
                   help="seconds after which the portfolio stops its starts other than the "
                        "plain search's (default: when the plain search's own start ends, so "
                        "the portfolio takes its wall time); given, it also sets the number "
                        "of starts")
    p.add_argument("--workers", type=_positive_int, metavar="N",
                   help="processes the portfolio refines its starts in (default: this one "
                        "plus one per core idle when planning begins, or all cores with "
                        "--time-budget; the plan depends on it only when starts are stopped)")
    p.add_argument("--starts", type=_positive_int, metavar="N",
                   help="number of portfolio starts (default: 8, or one per usable core where "
                        "that is more; with --time-budget, as many as it fits)")
    p.add_argument("--links", choices=["predicted", "formula"], default="predicted", help="complete "
                   "unmeasured links with the link model (docs/COSTMODEL.md 2) or the formula alone")
    p.add_argument("--out", metavar="PATH", help="write the plan as hulk-plan/1 JSON")
    p.add_argument("--plot", metavar="PATH", help="draw compute/communication bars per job and system")
    p.add_argument("--compare", action=argparse.BooleanOptionalAction, default=True,
                   help="also plan with Systems A/B/C and the DT-FM-style peer (default on)")
    from planner.commands.calibrate import add_cost_model_flags

    add_cost_model_flags(p)
    p.add_argument("--push", action="store_true",
                   help="publish the plan to the agents (retained MQTT messages; needs --mqtt)")
    p.add_argument("--mqtt", metavar="URL", default=settings.mqtt,
                   help="broker mqtt://[user:pass@]HOST:PORT for --push (HULK_MQTT)")
    p.add_argument("--signing-key", metavar="FILE", default=settings.signing_key,
                   help="Ed25519 key that signs pushed placements (HULK_SIGNING_KEY; "
                        "enroll --init-ca makes DIR/placement-signing.key)")
    p.add_argument("--fleet-name", default=settings.fleet,
                   help="fleet name in the MQTT topics (HULK_FLEET; default 'default')")
    p.set_defaults(func=run)


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {text!r}")
    return value


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive whole number, got {text!r}")
    return value


# ----------------------------------------------------------------------------------- progress

class LazyProgress:
    """A rich progress bar that appears only once a plan has taken more than ``delay`` seconds.

    Planners call ``progress(done, total)`` (or ``progress(fraction)``); extra arguments are a label.
    """

    def __init__(self, console, delay: float = 1.0, clock=time.monotonic):
        self.console, self.delay, self.clock = console, delay, clock
        self.progress = None
        self.task = None
        self.label = ""
        self.started = clock()

    def begin(self, label: str) -> "LazyProgress":
        self.label, self.started = label, self.clock()
        return self

    def __call__(self, done=None, total=None, *rest, **_ignored) -> None:
        if total is None and isinstance(done, (int, float)) and done <= 1.0:
            done, total = float(done), 1.0
        if not isinstance(done, (int, float)) or not isinstance(total, (int, float)) or total <= 0:
            return
        if self.progress is None:
            if self.clock() - self.started < self.delay:
                return
            from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

            self.progress = Progress(TextColumn("{task.description}"), BarColumn(),
                                     TextColumn("{task.percentage:>3.0f}%"), TimeElapsedColumn(),
                                     console=self.console, transient=True)
            self.progress.start()
            self.task = self.progress.add_task(self.label, total=float(total))
        self.progress.update(self.task, completed=float(done), total=float(total),
                             description=self.label)

    def end(self) -> None:
        if self.progress is not None:
            self.progress.stop()
            self.progress = None


# ----------------------------------------------------------------------------------- checks

def check_plannable(jobs, net) -> None:
    """Input that no planner can handle: raise PlanningError with a one-line reason."""
    if net.n == 0:
        raise PlanningError("the fleet has no nodes")
    components = net.components()
    if net.n > 1 and max(len(c) for c in components) == 1:
        raise PlanningError(f"the fleet is split into {len(components)} single nodes: no two "
                            "nodes can communicate (no measured links)")
    best = max(float(net.mem[c].sum()) for c in components)
    total = float(net.mem.sum())
    if total <= 0:
        raise PlanningError("no node of the fleet has a GPU (none reported by NVML, or gpus: 0 / "
                            "no memory in the fleet file): `hulk-planner fleet show` lists each "
                            "node's GPUs and why they are missing")
    for job in jobs:
        need = job.state_bytes
        if need > total:
            raise PlanningError(f"job {job.name!r} needs at least {_gb(need)} of GPU memory "
                                f"(16 bytes per parameter); the whole fleet has {_gb(total)}")
        if need > best:
            raise PlanningError(f"job {job.name!r} needs at least {_gb(need)} of GPU memory; "
                                f"the fleet is split and its largest connected part has only "
                                f"{_gb(best)}")


def _gb(n_bytes: float) -> str:
    """GB with enough digits that a small figure never reads as 0."""
    gb = n_bytes / 1e9
    return f"{gb:,.0f} GB" if gb >= 10 else f"{gb:.2g} GB"


def load_network(args):
    from planner.linkpred.complete import network_with_links

    if args.fleet:
        from planner.files.fleet import load_fleet_with_report

        if not Path(args.fleet).exists():
            raise InputError("no such file or folder", path=args.fleet, field="--fleet")
        fleet, issues = load_fleet_with_report(args.fleet)
    else:
        if not Path(args.db).is_file():
            raise InputError("no such store (expected the SQLite file `serve --db` writes)",
                             path=args.db, field="--db")
        from planner.service.graph import fleet_from_store
        from planner.service.store import Store

        with Store(args.db, read_only=True) as store:   # only --push writes (its own opening)
            fleet, issues = fleet_from_store(store, name=Path(args.db).stem), []
        if not fleet.nodes:
            raise PlanningError(f"{args.db}: the store knows no nodes yet (no agent has registered)")
    return fleet, network_with_links(fleet, getattr(args, "links", "predicted")), issues


# ----------------------------------------------------------------------------------- run

@dataclass
class MethodResult:
    method: str
    plan: object | None      # Plan
    report: object | None    # PlanReport
    seconds: float
    error: str | None = None


def run_method(method, jobs, net, seed, progress: LazyProgress, *, required: bool,
               options: dict | None = None) -> MethodResult:
    from planner.core.evaluate import evaluate

    fn = planner_for(method)
    progress.begin(f"planning: {label(method)}")
    t0 = time.perf_counter()
    try:
        plan = fn(jobs, net, seed=seed, progress=progress, **(options or {}))
    except HulkError as exc:
        if required:
            raise
        return MethodResult(method, None, None, time.perf_counter() - t0, error=str(exc))
    finally:
        progress.end()
    seconds = time.perf_counter() - t0
    return MethodResult(method, plan, evaluate(plan, net), seconds)


def run(args) -> int:
    from rich.console import Console

    from planner.files.jobs import load_jobs

    console = Console()
    if not console.is_terminal:  # piped or captured: rich would assume 80 columns
        console = Console(width=140)
    err_console = Console(stderr=True)
    if args.out and args.method == "system-c":
        raise InputError("System C (tensor parallel) cannot be written as pipeline stages; "
                         "drop --out or choose another method", field="--out")
    if args.plot:
        from planner.plots.output import plot_path

        plot_path(args.plot)   # refused before planning, not after
    jobs = load_jobs(args.jobs)
    fleet, net, issues = load_network(args)
    check_plannable(jobs, net)
    from planner.commands.calibrate import cost_model_for

    reference = net
    model, net = cost_model_for(args, net)
    progress = LazyProgress(err_console)

    options = {"budget_s": args.budget_s, "workers": args.workers, "starts": args.starts}
    for key, flag in (("budget_s", "--time-budget"), ("workers", "--workers"), ("starts", "--starts")):
        if options[key] is not None and key not in METHODS[args.method].options:
            raise InputError(f"only --method portfolio takes it, not --method {args.method}",
                             field=flag)
    others: dict[str, MethodResult] = {}
    skipped = []
    if args.compare:
        from planner.search.scale import SCALE_NODE_LIMIT
        compared, skipped = compared_methods(args.method, net.n, SCALE_NODE_LIMIT)
        for method in compared:
            if method != args.method:
                others[method] = run_method(method, jobs, net, args.seed, progress, required=False)
    if "baselines" in METHODS[args.method].options and others:   # judged, not made again
        options["baselines"] = [(m, r.plan) for m, r in others.items() if r.plan is not None]
    chosen = run_method(args.method, jobs, net, args.seed, progress, required=True,
                        options=options)
    results = {args.method: chosen, **others}

    from planner.core.costmodel import compute_bound_s

    bound = compute_bound_s(jobs, net)
    if issues:  # shown with the plan, so an error stays a single line
        console.print(f"[yellow]{count(len(issues), 'flaw')} repaired while reading the fleet "
                      f"(first: {issues[0]})[/yellow]", highlight=False)
    console.print(f"cost model: {model}", highlight=False)
    print_plan(console, chosen, net)
    print_optimality(console, chosen.plan)
    lower = print_lower_bound(console, jobs, net, chosen)
    if args.compare:
        print_comparison(console, args.method, results, bound, model,
                         None if net is reference else reference)
        for method in skipped:
            console.print(f"[dim]{label(method)}: not compared above {SCALE_NODE_LIMIT:,} servers "
                          f"(it would take too long; plan it with --method {method})[/dim]",
                          highlight=False)
    else:
        console.print(f"compute bound: {fmt_s(bound)}; this plan is "
                      f"{ratio(chosen.report.makespan_s, bound)} of it")
    if args.out:
        from planner.files.plan import write_plan

        write_plan(chosen.plan, net, args.out, chosen.report, cost_model=model, lower_bound=lower)
        console.print(f"plan written to {args.out}")
    if args.push:
        console.print(push(args, chosen.plan, net, jobs))
    if args.plot:
        from planner.plots.plan import plot_reports

        reports = {m: r.report for m, r in results.items() if r.report is not None}
        plot_reports(reports, args.plot, title=f"{count(len(jobs), 'job')} on {count(net.n, 'node')}")
        console.print(f"plot written to {args.plot}")
    return 0


def push(args: argparse.Namespace, plan, net, jobs) -> str:
    """Publish ``plan`` to the agents as ``--push`` asks; returns the line to print."""
    from hulk.wire.broker import check_name, parse_broker_url
    from planner.security.signing import load_signer
    from planner.service.placement_seq import ClockSequence
    from planner.service.publisher import (MqttPublisher, new_plan_id, push_new_plan,
                                           registered_addresses)

    if getattr(plan, "job_s_override", None):
        raise ConfigError("this method's plan has jobs without pipeline stages (tensor parallel); "
                          "it cannot be pushed", field="--push")
    if not args.mqtt:
        raise ConfigError("--push needs a broker: pass --mqtt mqtt://HOST:PORT or set HULK_MQTT",
                          field="--mqtt")
    broker = parse_broker_url(args.mqtt, source="--mqtt")
    fleet = check_name(args.fleet_name, "--fleet-name")
    now = int(time.time() * 1000)
    plan_id = new_plan_id(now)
    signer = load_signer(args.signing_key, "--signing-key")
    import asyncio   # only --push needs it (25 ms of every plan's start-up otherwise)

    placements = asyncio.run(push_new_plan(
        MqttPublisher(broker), plan, net, fleet=fleet, plan_id=plan_id, issued_at_ms=now,
        signer=signer, addresses=registered_addresses(args.db), jobs=jobs,
        sequence=ClockSequence()))   # numbers from the clock: above serve's, which follow it too
    if args.db:   # the same records `jobs` and serve's lifecycle use
        from planner.core.placements import job_spec, stages_doc
        from planner.service.job_records import record_pushed_plan
        from planner.service.store import Store
        with Store(args.db) as store:
            record_pushed_plan(store, {p.job.name: (job_spec(p.job), [net.ids[i] for i in p.nodes],
                                                    stages_doc(p, net))
                                       for p in plan.placements}, plan_id)
    return (f"plan {plan_id} pushed to {count(len(placements), 'node')} of fleet {fleet} via "
            f"{broker.host}:{broker.port}")


# ----------------------------------------------------------------------------------- output

def fmt_s(seconds: float | None) -> str:
    """Seconds as a short human duration."""
    if seconds is None or (isinstance(seconds, float) and math.isnan(seconds)):
        return "-"
    if not math.isfinite(seconds):
        return "inf"
    if seconds == 0:
        return "0 s"
    if seconds < 1e-3:   # a tiny job (the lab's example) must not print as "0.0 ms"
        return f"{seconds * 1e6:.1f} us"
    if seconds < 1:
        return f"{seconds * 1000:.1f} ms"
    if seconds < 120:
        return f"{seconds:.2f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    if seconds < 172800:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"


def ratio(x: float, y: float) -> str:
    if not (math.isfinite(x) and math.isfinite(y)) or y <= 0:
        return "-"
    return f"{x / y:.2f}x"


def print_plan(console, result: MethodResult, net) -> None:
    """The chosen plan, job by job (planner/commands/plan_print.py)."""
    from planner.commands.plan_print import print_plan as show

    show(console, result, net)


def print_optimality(console, plan) -> None:
    """The exact search's verdict on a small fleet's plan (planner.search.exact): optimal under
    the cost model, or its gap; nothing for plans it did not judge."""
    from planner.search.exact import NOTE_PREFIX

    for note in getattr(plan, "notes", []):
        if note.startswith(NOTE_PREFIX):
            console.print(f"[bold]optimality[/bold]:{note[len(NOTE_PREFIX):]}", highlight=False)


def print_lower_bound(console, jobs, net, result: MethodResult):
    """The plan's makespan against planner.core.lower_bound (which part binds); returns it."""
    from planner.core.lower_bound import lower_bound
    from planner.search.exact import NOTE_PREFIX

    bound, report = lower_bound(jobs, net), result.report
    gap = bound.gap(report.makespan_s) if report.complete else None
    proved = any(note.startswith(f"{NOTE_PREFIX} optimal")
                 for note in getattr(result.plan, "notes", []))
    if gap is None or getattr(result.plan, "job_s_override", None):
        verdict = "no gap: a job is not placed or has no stages"
    elif proved:    # the exact search's proof is tighter than this bound
        verdict = f"the plan is {gap:.0%} above it and optimal (see optimality)"
    else:
        verdict = f"this plan is at most {gap:.0%} above the optimum under the cost model"
    console.print(f"lower bound: {fmt_s(bound.seconds)} ({bound.binding}); {verdict}",
                  highlight=False)
    return bound


def print_comparison(console, chosen: str, results: dict[str, MethodResult], bound: float,
                     model: str = "reference", reference=None) -> None:
    """The methods' plans judged by ``model``; with ``reference`` (the uncalibrated network) also
    each plan's makespan by the reference model, in its own column."""
    from rich.table import Table

    from planner.core.evaluate import evaluate

    mine = results[chosen].report
    unavailable: list[str] = []
    table = Table(title=f"comparison ({model.split(' (')[0]} cost model)", header_style="bold")
    extra = ("makespan (reference)",) if reference is not None else ()
    for col in ("method", "makespan", "sum JCT", "makespan / this", "sum JCT / this",
                "x compute bound", "planning", *extra):
        table.add_column(col, justify="left" if col == "method" else "right")
    for method, r in results.items():
        name = label(method) + (" [this plan]" if method == chosen else "")
        if r.report is None:
            table.add_row(name, "n/a", "", "", "", "", "", *[""] * len(extra))
            unavailable.append(f"{label(method)}: {r.error}")
            continue
        rep = r.report
        if not rep.complete:
            note = f"{count(len(rep.unplaced), 'job')} infeasible"
            table.add_row(name, note, "", "", "", "", f"{r.seconds:.2f} s", *[""] * len(extra))
            continue
        # Tensor-parallel plans carry times the calibrated model computed: no reference figure.
        judged = ((fmt_s(evaluate(r.plan, reference).makespan_s)
                   if not getattr(r.plan, "job_s_override", None) else "-",) if extra else ())
        table.add_row(name, fmt_s(rep.makespan_s), fmt_s(rep.sum_jct_s),
                      ratio(rep.makespan_s, mine.makespan_s), ratio(rep.sum_jct_s, mine.sum_jct_s),
                      ratio(rep.makespan_s, bound), f"{r.seconds:.2f} s", *judged)
    table.add_row("compute bound", fmt_s(bound), "", ratio(bound, mine.makespan_s), "", "1.00x", "",
                  *[""] * len(extra))
    console.print(table)
    for line in unavailable:
        console.print(f"[dim]{line}[/dim]", highlight=False)
    baselines = [results[m].report for m in ("system-a", "system-b", "system-c")
                 if m in results and results[m].report is not None and results[m].report.complete]
    if baselines and mine.complete:
        best = min(b.makespan_s for b in baselines)
        console.print(f"best of Systems A/B/C: {fmt_s(best)}, {ratio(best, mine.makespan_s)} this "
                      f"plan's makespan", highlight=False)

