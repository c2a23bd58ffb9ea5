"""Exact-search benchmark: small generated fleets solved by planner.search.exact after the
default method's portfolio, makespan by the reference cost model.

    .venv/bin/python -m bench.exact_bench [--quick]

Fleets: FLEETS generated fleets of 4 to 16 servers (fixed seeds; every third one regional, a few
sites measured as site links), 1 to 5 jobs drawn from the catalog. Per fleet: the portfolio's
plan in this process (``workers=1``: the same plan on any machine), then the exact search with
its default budget of solver calls: its wall time (target: under TARGET_S), whether it proved
the optimum of its space (planner.search.exact's docstring) or the gap, and its makespan
against the portfolio's. Writes bench/results/exact.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

FLEETS = 36
QUICK_FLEETS = 8
TARGET_S = 10.0


def instance(seed: int):
    """The seed's fleet (a Network) and jobs, or None where the jobs cannot all fit."""
    from planner.core.fleet import complete
    from planner.core.generate import generate_jobs, generate_network, generate_regional_fleet

    n = 4 + (seed * 5) % 13
    if seed % 3 == 2:
        net = complete(generate_regional_fleet(n, min(n, 2 + seed % 3), seed=seed))
    else:
        net = generate_network(n, seed=seed)
    jobs = generate_jobs(1 + seed % 5, seed=seed, max_params=15e9 if seed % 2 else 70e9)
    return jobs, net


def run(out_dir: Path, quick: bool = False, log=print) -> dict:
    from rich.progress import Progress

    from hulk.errors import PlanningError
    from planner.core.costmodel import estimate_plan
    from planner.search import exact
    from planner.search.portfolio import plan_portfolio

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = []
    load_before = os.getloadavg()[0]   # other work on the machine moves the wall times
    count = QUICK_FLEETS if quick else FLEETS
    with Progress(transient=True) as bar:
        task = bar.add_task("exact search on small fleets", total=count)
        for seed in range(count):
            jobs, net = instance(seed)
            row = {"seed": seed, "nodes": net.n, "jobs": len(jobs),
                   "models": [j.name for j in jobs]}
            t0 = time.perf_counter()
            try:
                default = plan_portfolio(jobs, net, workers=1)
            except PlanningError as err:
                row["skipped"] = str(err)
                rows.append(row)
                bar.advance(task)
                continue
            t1 = time.perf_counter()
            base = estimate_plan(default.placements, net).makespan_s
            result = exact.solve_exact(jobs, net, incumbent_s=base)
            t2 = time.perf_counter()
            row.update({"default_s": base, "default_planning_s": t1 - t0,
                        "exact_s": result.makespan_s, "exact_planning_s": t2 - t1,
                        "bound_s": result.bound_s, "proved": result.proved,
                        "gap": result.gap, "evaluations": result.evaluations,
                        "shorter_by": 1 - result.makespan_s / base if base > 0 else 0.0})
            rows.append(row)
            log(f"seed {seed}: {net.n} servers, {len(jobs)} jobs: default {base:.0f} s, exact "
                f"{result.makespan_s:.0f} s in {t2 - t1:.1f} s, "
                + ("proved" if result.proved else f"gap {result.gap:.1%}"), flush=True)
            bar.advance(task)
    done = [r for r in rows if "skipped" not in r]
    doc = {
        "benchmark": "exact", "quick": quick, "python": platform.python_version(),
        "machine": platform.machine(), "cores": os.cpu_count(),
        "load_1min_before": load_before, "load_1min_after": os.getloadavg()[0],
        "cost_model": "reference (docs/COSTMODEL.md), planner.core.costmodel.estimate_plan",
        "budget_evaluations": exact.EVALUATIONS,
        "results": rows,
        "summary": {
            "fleets": len(done), "skipped": len(rows) - len(done),
            "proved": sum(r["proved"] for r in done),
            "under_target_s": sum(r["exact_planning_s"] < TARGET_S for r in done),
            "max_exact_planning_s": max((r["exact_planning_s"] for r in done), default=0.0),
            "shorter_than_default": sum(r["shorter_by"] > 1e-9 for r in done),
            "largest_gain": max((r["shorter_by"] for r in done), default=0.0),
            "largest_gap_left": max((r["gap"] for r in done), default=0.0),
            "largest_proved_nodes": max((r["nodes"] for r in done if r["proved"]), default=0),
        },
    }
    (out_dir / "exact.json").write_text(json.dumps(doc, indent=2) + "\n")
    return doc


def summarize(doc: dict) -> str:
    """A markdown table (what `bench.run` puts in SUMMARY.md)."""
    lines = ["Exact search after the default portfolio (workers=1) on small generated fleets; "
             "makespan by the reference cost model.", "",
             "| seed | servers | jobs | default | exact | exact time | proved / gap |",
             "|---|---|---|---|---|---|---|"]
    for r in doc["results"]:
        if "skipped" in r:
            lines.append(f"| {r['seed']} | {r['nodes']} | {r['jobs']} | skipped: {r['skipped']} "
                         "| | | |")
            continue
        verdict = "proved" if r["proved"] else f"gap {r['gap']:.1%}"
        lines.append(f"| {r['seed']} | {r['nodes']} | {r['jobs']} | {r['default_s']:.0f} s | "
                     f"{r['exact_s']:.0f} s | {r['exact_planning_s']:.1f} s | {verdict} |")
    s = doc["summary"]
    lines += ["", f"{s['proved']} of {s['fleets']} fleets proved optimal, "
              f"{s['under_target_s']} under {TARGET_S:.0f} s (longest "
              f"{s['max_exact_planning_s']:.1f} s), {s['shorter_than_default']} shorter than the "
              f"default (by up to {s['largest_gain']:.1%}); largest gap left "
              f"{s['largest_gap_left']:.1%}."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results")
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_FLEETS} fleets only")
    args = parser.parse_args(argv)
    doc = run(args.out, quick=args.quick)
    print(summarize(doc), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
