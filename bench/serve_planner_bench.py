"""serve's planner against the plain search it replaced, on the portfolio bench's quick fleets.

    .venv/bin/python -m bench.run --shared ../shared --only serve_planner_bench

serve's lifecycle and recovery plan with ``planner.methods.serve_planner()``: the default
portfolio on a 20 s budget, its starts refined one after another in serve's process, with the
shipped GNN's scores as one more start when serve has a model dir. Per fleet: the makespan by
the reference cost model and the wall time of the plain search, of ``serve_planner()`` and of
``serve_planner(checkpoint=the shipped model)``, and the start that won. Writes
bench/results/serve_planner.json.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CHECKPOINT = REPO / "planner" / "gnn" / "hulk-gnn.pt"


def _timed(planner, jobs, net) -> dict:
    from planner.core.evaluate import evaluate

    t = time.perf_counter()
    plan = planner(jobs, net)
    seconds = time.perf_counter() - t
    return {"makespan_s": evaluate(plan, net).makespan_s, "planning_s": round(seconds, 2),
            "winner": plan.facts.winner}


def run(out_dir: Path, shared: Path, log=print) -> dict:
    from bench.portfolio_bench import fleets, load
    from planner.methods import SERVE_BUDGET_S, serve_planner
    from planner.search import plan_search

    rows = []
    for fl in fleets(quick=True):
        if fl.kind == "example" and not (REPO / fl.path).exists():
            continue
        jobs, net = load(fl, Path(shared))
        row = {"fleet": fl.name, "search": _timed(plan_search, jobs, net),
               "serve": _timed(serve_planner(), jobs, net),
               "serve_gnn": _timed(serve_planner(checkpoint=CHECKPOINT), jobs, net)}
        base = row["search"]["makespan_s"]
        for key in ("serve", "serve_gnn"):
            row[key]["shorter_than_search"] = round(1 - row[key]["makespan_s"] / base, 4)
        rows.append(row)
        log(f"{fl.name}: search {base:.0f} s, serve {row['serve']['makespan_s']:.0f} s, "
            f"serve+GNN {row['serve_gnn']['makespan_s']:.0f} s")
    result = {"benchmark": "serve_planner", "time": time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                                   time.gmtime()),
              "budget_s": SERVE_BUDGET_S, "cores": os.cpu_count(), "results": rows}
    out = Path(out_dir) / "serve_planner.json"
    out.write_text(json.dumps(result, indent=1) + "\n")
    return result


def summarize(result: dict) -> str:
    lines = ["## serve's planner", "",
             "| fleet | plain search | serve_planner() | with the GNN start |",
             "|---|---|---|---|"]
    for r in result["results"]:
        cells = [f"{r[k]['makespan_s']:.0f} s ({r[k]['planning_s']:.1f} s"
                 + (f", {r[k]['shorter_than_search']:+.1%}" if k != "search" else "") + ")"
                 for k in ("search", "serve", "serve_gnn")]
        lines.append(f"| {r['fleet']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
