"""Lower-bound benchmark: how far the default plan can be from the optimum on every fleet.

    .venv/bin/python -m bench.lower_bound_bench --shared ../shared [--quick]

For each fleet (the portfolio benchmark's: real cloud regions, the paper's fleet with its 4 and
6 jobs, the shipped example fleets with examples/jobs.yaml, a generated fleet; and the WAN lab's
5 servers), the default `plan` method's makespan by the reference cost model, and that makespan
over the compute bound and over planner.core.lower_bound (the plan is at most ratio - 1 above
the optimum). Target: the new bound's ratio below the compute bound's on every fleet. Writes
bench/results/lower_bound.json. --quick leaves out the 1,000-server region fleet.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LAB = "examples/fleets/lab-5.json, examples/jobs.yaml"


def _fleets(quick: bool):
    from bench.portfolio_bench import Fleet, fleets

    out = fleets(quick)
    if not any(fl.path.endswith("lab-5.json") for fl in out):
        out.append(Fleet(LAB, "example", 5, jobs="examples", path="examples/fleets/lab-5.json"))
    return out


def measure(fl, shared: Path) -> dict:
    from bench.portfolio_bench import load
    from planner.core.costmodel import compute_bound_s
    from planner.core.evaluate import evaluate
    from planner.core.lower_bound import lower_bound
    from planner.methods import DEFAULT_METHOD, planner_for

    jobs, net = load(fl, shared)
    t0 = time.perf_counter()
    plan = planner_for(DEFAULT_METHOD)(jobs, net, seed=0)
    planning_s = time.perf_counter() - t0
    report = evaluate(plan, net)
    t0 = time.perf_counter()
    bound = lower_bound(jobs, net)
    bound_s = time.perf_counter() - t0
    compute = compute_bound_s(jobs, net)
    makespan = report.makespan_s if report.complete else None
    row = {"fleet": fl.name, "nodes": net.n, "jobs": len(jobs), "method": DEFAULT_METHOD,
           "makespan_s": makespan, "planning_s": round(planning_s, 2),
           "compute_bound_s": compute, "lower_bound_s": bound.seconds,
           "binding": bound.binding, "bound_parts_s": bound.parts,
           "lower_bound_wall_s": round(bound_s, 3),
           "x_compute_bound": makespan / compute if makespan else None,
           "x_lower_bound": makespan / bound.seconds if makespan else None}
    row["meets_target"] = bool(makespan and row["x_lower_bound"] < row["x_compute_bound"])
    return row


def run(out_dir: Path, shared: Path = REPO.parent / "shared", quick: bool = False) -> dict:
    from rich.progress import Progress

    rows = []
    fleets = _fleets(quick)
    with Progress() as progress:
        task = progress.add_task("lower bound", total=len(fleets))
        for fl in fleets:
            progress.update(task, description=f"[lower bound] {fl.name}")
            rows.append(measure(fl, Path(shared)))
            r = rows[-1]
            progress.console.print(f"{fl.name}: makespan {r['makespan_s']}, "
                                   f"x compute bound {r['x_compute_bound']}, "
                                   f"x lower bound {r['x_lower_bound']} ({r['binding']})")
            progress.advance(task)
    doc = {"benchmark": "lower_bound_bench", "quick": quick, "machine": platform.platform(),
           "target": "makespan / lower bound below makespan / compute bound on every fleet",
           "all_met": all(r["meets_target"] for r in rows), "results": rows}
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    (Path(out_dir) / "lower_bound.json").write_text(json.dumps(doc, indent=2) + "\n")
    return doc


def _x(value) -> str:
    return f"{value:.2f}x" if value else "-"


def summarize(doc: dict) -> str:
    lines = ["The default plan's makespan over the compute bound and over the lower bound "
             "(planner.core.lower_bound): the plan is at most *x lower bound* - 1 above the "
             "optimum under the cost model.", "",
             "| fleet | servers | jobs | makespan s | x compute bound | x lower bound | binds "
             "| bound wall s | target |", "|---|---|---|---|---|---|---|---|---|"]
    for r in doc["results"]:
        makespan = f"{r['makespan_s']:,.0f}" if r["makespan_s"] else "incomplete"
        lines.append(f"| {r['fleet']} | {r['nodes']} | {r['jobs']} | {makespan} | "
                     f"{_x(r['x_compute_bound'])} | {_x(r['x_lower_bound'])} | {r['binding']} | "
                     f"{r['lower_bound_wall_s']} | {'met' if r['meets_target'] else 'NOT met'} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shared", type=Path, default=REPO.parent / "shared")
    parser.add_argument("--quick", action="store_true", help="leave out the 1,000-server fleet")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    args = parser.parse_args()
    print(summarize(run(args.out, args.shared, args.quick)))


if __name__ == "__main__":
    main()
