"""Portfolio benchmark: the default `plan` (the portfolio: a fixed set of starts with work
budgets, and the baselines' plans as candidates) against what the default was before (the plain
search's wall time: its other starts stopped when the plain search ended) and against every
start that default queued run to its end; makespan by the reference cost model and planning wall
time, all measured in one run.

    .venv/bin/python -m bench.portfolio_bench --shared ../shared [--quick]

Fleets: servers in real cloud regions (bench/regions.py; 90 servers in 45 regions and larger,
up to 1,000 servers, the last one left out by --quick), the paper's fleet with its 4 and 6 jobs,
the shipped example fleets with examples/jobs.yaml (the WAN lab's five servers among them) and a
generated fleet. Writes bench/results/portfolio.json.

Each row measures, one after the other in this process:

- ``search``: the plain search, whose wall time the earlier default took (it stopped its other
  starts when the plain search ended), so the wall-time ratio below is against it;
- ``baselines``: Systems A/B/C and the DT-FM-style peer as `plan --compare` makes them;
- ``portfolio``: the default as `plan` runs it, the baselines' plans (made for the comparison
  anyway) given as candidates, on every core this process may use;
- ``portfolio_alone``: the default making the baselines' plans itself (a caller with no
  comparison); timed once;
- ``portfolio_one_worker``: the default as `plan` runs it with ``--workers 1`` (the same plan,
  its starts one after another in this process); timed once;
- ``portfolio_uncapped``: the :data:`EARLIER_STARTS` starts the earlier default queued, every
  one run to its end: the best plan it could give.

Targets on the real-region fleets: the default not longer than ``portfolio_uncapped`` and its
wall time at most :data:`TARGET_TIME_RATIO` x the plain search's. Runs shorter than
REPEAT_BELOW_S are timed twice, alternately, and the faster of each kept; the load average next
to each row says how busy the machine was.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BASELINE, PORTFOLIO, ALONE, FULL = "search", "portfolio", "portfolio_alone", "portfolio_uncapped"
ONE = "portfolio_one_worker"
EARLIER_STARTS = 8        # heuristic, greedy x2, uniform, 4 random: what the earlier default queued
TARGET_TIME_RATIO = 1.5
REPEAT_BELOW_S = 5.0   # searches shorter than this are timed twice (load noise)
UNCAPPED_S = 3600.0   # a budget no start reaches: the safety stop never fires


@dataclass(frozen=True)
class Fleet:
    name: str
    kind: str            # "regions", "paper", "example", "generated"
    nodes: int
    regions: int = 0
    jobs: str = ""       # "paper-4", "paper-6", "examples" or "generated:N"
    seed: int = 0
    path: str = ""


def fleets(quick: bool) -> list[Fleet]:
    out = [
        Fleet("regions 90 servers / 45 regions, paper's 4 jobs", "regions", 90, 45, "paper-4", 1),
        Fleet("regions 90 servers / 45 regions, paper's 6 jobs", "regions", 90, 45, "paper-6", 2),
        Fleet("regions 90 servers / 45 regions, 6 generated jobs", "regions", 90, 45, "generated:6", 3),
        Fleet("regions 150 servers / 60 regions, 8 generated jobs", "regions", 150, 60, "generated:8", 4),
        Fleet("regions 300 servers / 69 regions, 10 generated jobs", "regions", 300, 69, "generated:10", 7),
    ]
    if not quick:
        out.append(Fleet("regions 1,000 servers / 69 regions, 20 generated jobs", "regions", 1000,
                         69, "generated:20", 8))
    out += [
        Fleet("paper fleet (47 servers), 4 jobs", "paper", 47, jobs="paper-4"),
        Fleet("paper fleet (47 servers), 6 jobs", "paper", 47, jobs="paper-6"),
        Fleet("examples/fleets/asia-24.json, examples/jobs.yaml", "example", 24, jobs="examples",
              path="examples/fleets/asia-24.json"),
        Fleet("examples/fleets/world-48.json, examples/jobs.yaml", "example", 48, jobs="examples",
              path="examples/fleets/world-48.json"),
        Fleet("examples/fleets/lab-5.json, examples/jobs.yaml", "example", 5, jobs="examples",
              path="examples/fleets/lab-5.json"),
        Fleet("generated 100 servers (gazetteer cities), 8 jobs", "generated", 100,
              jobs="generated:8", seed=1),
    ]
    return out


def load(fl: Fleet, shared: Path):
    from bench.regions import region_network
    from planner.core.fleet import complete
    from planner.core.generate import generate_fleet, generate_jobs
    from planner.files.fleet import load_fleet
    from planner.files.jobs import load_jobs

    if fl.jobs.startswith("paper-"):
        jobs = load_jobs(shared / "bench" / f"{fl.jobs}-jobs.yaml")
    elif fl.jobs == "examples":
        jobs = load_jobs(REPO / "examples" / "jobs.yaml")
    else:
        jobs = generate_jobs(int(fl.jobs.split(":")[1]), seed=fl.seed)
    if fl.kind == "regions":
        net = region_network(fl.nodes, fl.regions, seed=fl.seed)
    elif fl.kind == "paper":
        net = complete(load_fleet(shared / "data" / "hulk-upstream"))
    elif fl.kind == "example":
        net = complete(load_fleet(REPO / fl.path))
    else:
        net = complete(generate_fleet(fl.nodes, seed=fl.seed))
    return jobs, net


def _cpu_s() -> float:
    """CPU seconds of this process and of its finished (reaped) children: the portfolio's
    workers are joined before it returns, so their work is counted."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def measure(method: str, jobs, net, stage_order: bool = True, **options) -> dict:
    """Plan with ``method`` as `hulk-planner plan --method M` would (``options``: its flags, and
    the portfolio's ``baselines``); ``stage_order=False`` (``search`` only): the search without
    stage ordering and chains of relocations (``SearchOptions(stage_order=False,
    chains=False)``). Every run starts cold: a search keeps its answers in its own run, never
    on the network."""
    from planner.commands.plan import planner_for

    if stage_order:
        fn = planner_for(method)
        return _measure(lambda: fn(jobs, net, seed=0, **options), net)
    if method != "search" or options:
        raise ValueError("stage_order=False measures the plain search with its defaults only")
    from planner.search import plan_search
    from planner.search.options import SearchOptions

    baseline = SearchOptions(stage_order=False, chains=False)
    return _measure(lambda: plan_search(jobs, net, options=baseline), net)


def _measure(plan_now, net) -> dict:
    from planner.core.evaluate import evaluate
    from planner.search.workers import wait_reaped

    load_before = os.getloadavg()[0]
    cpu = _cpu_s()
    t = time.perf_counter()
    plan = plan_now()
    seconds = time.perf_counter() - t
    wait_reaped()   # the portfolio's killed workers count once reaped (after the timed part)
    cpu = _cpu_s() - cpu
    report = evaluate(plan, net)
    done = report.complete and math.isfinite(report.makespan_s)
    return {"makespan_s": report.makespan_s if done else None,
            "complete": report.complete, "planning_s": seconds, "cpu_s": cpu,
            "load_1min_before": round(load_before, 2), "notes": list(plan.notes),
            "cut_short": plan.facts.cut_short, "winner": plan.facts.winner, "plan": plan}


def measure_baselines(jobs, net) -> dict:
    """Every baseline `plan --compare` runs, as it runs them: {method: measure(...)}."""
    from planner.methods import compared_methods
    from planner.search.scale import SCALE_NODE_LIMIT

    return {m: measure(m, jobs, net)
            for m in compared_methods("portfolio", net.n, SCALE_NODE_LIMIT)[0]}


def measure_starts(jobs, net, count: int) -> dict:
    """The portfolio's ``count`` starts, each run to its end (no time stop, no work budget),
    each start's makespan and seconds, and the best of the first 1, 2 and all of them."""
    from planner.search.portfolio import refine_starts
    from planner.search.workers import wait_reaped

    load_before = os.getloadavg()[0]
    cpu = _cpu_s()
    t = time.perf_counter()
    # In this process, one after another: forked at the lowest priority (the anytime mode's
    # workers) they would get no CPU time on a busy machine.
    run = refine_starts(jobs, net, seed=0, budget_s=UNCAPPED_S, starts=count, workers=1)
    seconds = time.perf_counter() - t
    wait_reaped()
    starts = [{"name": r.name, "makespan_s": r.makespan_s if math.isfinite(r.makespan_s) else None,
               "seconds": r.seconds} for r in run.results]
    best_of = {}
    for k in sorted({1, 2, count}):
        done = [x["makespan_s"] for x in starts[:k] if x["makespan_s"] is not None]
        best_of[str(k)] = min(done) if done else None
    return {"makespan_s": run.best().makespan_s, "planning_s": seconds, "cpu_s": _cpu_s() - cpu,
            "load_1min_before": round(load_before, 2), "winner": run.best().name,
            "starts": starts, "best_of_first": best_of}


def _faster(a: dict, b: dict) -> dict:
    return min(a, b, key=lambda m: m["planning_s"])


def _row(fl, jobs, net, log) -> dict:
    """One fleet's measurements (module docstring)."""
    base = measure(BASELINE, jobs, net)
    made = measure_baselines(jobs, net)
    given = [(m, r["plan"]) for m, r in made.items() if r["complete"]]
    port = measure(PORTFOLIO, jobs, net, baselines=given)
    if base["planning_s"] < REPEAT_BELOW_S:   # short runs: the faster of two, alternated
        base = _faster(base, measure(BASELINE, jobs, net))
        port = _faster(port, measure(PORTFOLIO, jobs, net, baselines=given))
    alone = measure(PORTFOLIO, jobs, net)
    one = measure(PORTFOLIO, jobs, net, baselines=given, workers=1)
    full = measure_starts(jobs, net, EARLIER_STARTS)
    spans = {m: r["makespan_s"] for m, r in made.items()}
    row = {"fleet": fl.name, "kind": fl.kind, "nodes": net.n, "jobs": len(jobs),
           BASELINE: base, "baselines": made, PORTFOLIO: port, ALONE: alone, ONE: one, FULL: full,
           "baselines_s": sum(r["planning_s"] for r in made.values()),
           "best_baseline_s": min((x for x in spans.values() if x is not None), default=None),
           "not_longer_than_uncapped": port["makespan_s"] <= full["makespan_s"] * (1 + 1e-9),
           "same_plan_alone": alone["makespan_s"] == port["makespan_s"],
           "same_plan_one_worker": one["makespan_s"] == port["makespan_s"],
           "gain_vs_search": 1 - port["makespan_s"] / base["makespan_s"],
           "time_ratio": port["planning_s"] / base["planning_s"],
           "time_ratio_alone": alone["planning_s"] / base["planning_s"],
           "time_ratio_one_worker": one["planning_s"] / base["planning_s"]}
    for m in (base, port, alone, one, *made.values()):
        m.pop("plan")
    log(f"{fl.name}: search {base['makespan_s'] / 3600:.3f} h in {base['planning_s']:.2f} s; "
        f"default {port['makespan_s'] / 3600:.3f} h in {port['planning_s']:.2f} s "
        f"({row['time_ratio']:.2f}x, winner {port['winner']}; one worker "
        f"{one['planning_s']:.2f} s; making the baselines itself "
        f"{alone['planning_s']:.2f} s); {EARLIER_STARTS} starts to their ends "
        f"{full['makespan_s'] / 3600:.3f} h in {full['planning_s']:.1f} s (winner "
        f"{full['winner']}); baselines {row['baselines_s']:.2f} s, best "
        f"{(row['best_baseline_s'] or math.nan) / 3600:.3f} h; load {port['load_1min_before']}",
        flush=True)
    return row


def run(out_dir: Path, shared: Path, quick: bool = False, log=print) -> dict:
    from planner.search.portfolio import DEFAULT_STARTS, default_workers

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = []
    for fl in fleets(quick):
        if fl.kind == "example" and not (REPO / fl.path).exists():
            continue
        jobs, net = load(fl, Path(shared))
        rows.append(_row(fl, jobs, net, log))
    region = [r for r in rows if r["kind"] == "regions"]
    ratios = sorted(r["time_ratio"] for r in region)
    ones = sorted(r["time_ratio_one_worker"] for r in region)
    doc = {
        "benchmark": "portfolio", "quick": quick, "python": platform.python_version(),
        "machine": platform.machine(), "cores": os.cpu_count(), "workers": default_workers(),
        "default_starts": DEFAULT_STARTS, "earlier_starts": EARLIER_STARTS,
        "cost_model": "reference (docs/COSTMODEL.md), planner.core.evaluate.evaluate",
        "regions_source": "bench/regions.py (own coordinates of AWS/GCP/Azure region cities)",
        "results": rows,
        "summary": {
            "region_fleets": len(region),
            "region_not_longer_than_uncapped": sum(r["not_longer_than_uncapped"] for r in region),
            "region_time_ratios": [r["time_ratio"] for r in region],
            "region_median_time_ratio": ratios[len(ratios) // 2],
            "region_max_time_ratio": ratios[-1],
            "region_time_target_met": ratios[-1] <= TARGET_TIME_RATIO,
            "region_median_time_ratio_one_worker": ones[len(ones) // 2],
            "region_max_time_ratio_one_worker": ones[-1],
            "never_beaten_by_a_baseline": all(
                r["best_baseline_s"] is None or r[PORTFOLIO]["makespan_s"]
                <= r["best_baseline_s"] * (1 + 1e-12) for r in rows),
            "same_plan_with_its_own_baselines": all(r["same_plan_alone"] for r in rows),
            "same_plan_on_one_worker": all(r["same_plan_one_worker"] for r in rows),
        },
    }
    (out_dir / "portfolio.json").write_text(json.dumps(doc, indent=2) + "\n")
    return doc


def summarize(doc: dict) -> str:
    """A markdown table (what `bench.run` puts in SUMMARY.md)."""
    from planner.commands.plan import fmt_s

    lines = [f"Default `plan` (portfolio: {doc.get('default_starts', '?')} starts with work "
             f"budgets and the baselines' plans, {doc['workers']} worker(s)) against the plain search "
             "(the earlier default's wall time) and the earlier default's "
             f"{doc.get('earlier_starts', '?')} starts run to their ends; makespan by the "
             "reference cost model, planning wall time (CPU seconds of all processes), 1-minute "
             "load average before the default ran.", "",
             "| fleet | search | default | wall / search | one worker | default making its "
             "baselines | all earlier starts, no stop | baselines (best) | load |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in doc["results"]:
        b, p, a, f, o = r[BASELINE], r[PORTFOLIO], r[ALONE], r[FULL], r[ONE]
        lines.append(
            f"| {r['fleet']} | {fmt_s(b['makespan_s'])} in {b['planning_s']:.2f} s | "
            f"{fmt_s(p['makespan_s'])} in {p['planning_s']:.2f} s ({p['cpu_s']:.1f}), "
            f"{p['winner']} | {r['time_ratio']:.2f}x | {o['planning_s']:.2f} s "
            f"({r['time_ratio_one_worker']:.2f}x) | {a['planning_s']:.2f} s | "
            f"{fmt_s(f['makespan_s'])} in {f['planning_s']:.1f} s, {f['winner']} | "
            f"{r['baselines_s']:.2f} s ({fmt_s(r['best_baseline_s'])}) | "
            f"{p['load_1min_before']:.1f} |")
    s = doc["summary"]
    lines += ["", f"Real-region fleets: the default is not longer than every earlier start run to "
              f"its end on {s['region_not_longer_than_uncapped']} of {s['region_fleets']}; its "
              f"wall time is {s['region_median_time_ratio']:.2f}x the plain search's (median; "
              f"at most {s['region_max_time_ratio']:.2f}x, target {TARGET_TIME_RATIO}x: "
              f"{'met' if s['region_time_target_met'] else 'NOT met'}); on one worker "
              f"{s['region_median_time_ratio_one_worker']:.2f}x (median; at most "
              f"{s['region_max_time_ratio_one_worker']:.2f}x). Never beaten by a baseline: "
              f"{'yes' if s['never_beaten_by_a_baseline'] else 'NO'}. The same plan on one "
              f"worker and with its own baselines: "
              f"{'yes' if s['same_plan_on_one_worker'] and s['same_plan_with_its_own_baselines'] else 'NO'}."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.portfolio_bench",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--shared", type=Path, default=REPO / ".." / "shared")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    parser.add_argument("--quick", action="store_true", help="leave out the 1,000-server fleet")
    args = parser.parse_args(argv)
    print(summarize(run(args.out, args.shared, args.quick)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
