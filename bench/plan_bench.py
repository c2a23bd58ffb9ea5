"""Planner benchmark: makespan of every method and planning time, on the paper's fleet and on
generated fleets of 100, 1,000 and 5,000 nodes.

    .venv/bin/python -m bench.plan_bench --shared ../shared [--quick]

Writes bench/results/plan.json. For every scenario and method: makespan and sum of job completion
times by the reference cost model, how many times better than the best of Systems A/B/C and than
the DT-FM-style peer, the makespan as a multiple of the compute bound, and the planning time.
The targets: Hulk >= 10x better than the best of A/B/C, better than DT-FM, planning < 5 s on
the paper's fleet with 6 jobs and < 60 s at 1,000 nodes with 20 jobs. A method that leaves a job
unplaced has no comparable makespan and is reported as infeasible.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
METHODS = ("search", "gnn", "gnn-raw", "dtfm", "system-a", "system-b", "system-c")
BASELINES = ("system-a", "system-b", "system-c")
HULK = "search"
GNN_CHECKPOINT = REPO / "planner" / "gnn" / "hulk-gnn.pt"
METHOD_TIMEOUT_S = 600.0   # per method and scenario; a method past it is reported as a timeout


def _log(line: str) -> None:
    print(line, flush=True)


@dataclass(frozen=True)
class Scenario:
    name: str
    nodes: int
    jobs: int
    source: str   # "paper:<yaml>" or "generated"
    seed: int = 0


def scenarios(shared: Path, quick: bool) -> list[Scenario]:
    out = [Scenario("paper fleet, 4 jobs", 47, 4, f"paper:{shared / 'bench' / 'paper-4-jobs.yaml'}"),
           Scenario("paper fleet, 6 jobs", 47, 6, f"paper:{shared / 'bench' / 'paper-6-jobs.yaml'}"),
           Scenario("generated 100 nodes, 8 jobs", 100, 8, "generated", seed=1),
           Scenario("generated 1,000 nodes, 20 jobs", 1000, 20, "generated", seed=2)]
    if not quick:
        out.append(Scenario("generated 5,000 nodes, 20 jobs", 5000, 20, "generated", seed=3))
    return out


def load_scenario(sc: Scenario, shared: Path):
    from planner.core.fleet import complete
    from planner.core.generate import generate_fleet, generate_jobs, generate_network
    from planner.files.fleet import load_fleet
    from planner.files.jobs import load_jobs

    if sc.source.startswith("paper:"):
        net = complete(load_fleet(shared / "data" / "hulk-upstream"))
        return load_jobs(sc.source.split(":", 1)[1]), net
    if sc.nodes <= 300:  # small enough for Link objects and the full completion rule
        net = complete(generate_fleet(sc.nodes, seed=sc.seed))
    else:
        net = generate_network(sc.nodes, seed=sc.seed)
    return generate_jobs(sc.jobs, seed=sc.seed), net


def _finite(x: float) -> float | None:
    return x if x is not None and math.isfinite(x) else None


def _plan_row(method: str, jobs, net, bound: float) -> dict:
    """Plan with ``method`` and measure it (runs in a forked child; see :func:`_measure`)."""
    from hulk.errors import HulkError, InputError
    from planner.methods import planner_for
    from planner.core.evaluate import evaluate

    try:
        fn = planner_for(method)
    except InputError as exc:
        return {"status": "unavailable", "error": str(exc)}
    t = time.perf_counter()
    try:
        plan = fn(jobs, net, seed=0)
    except HulkError as exc:
        return {"status": "error", "error": str(exc), "planning_s": time.perf_counter() - t}
    planning_s = time.perf_counter() - t
    report = evaluate(plan, net)
    complete = report.complete
    return {
        "status": "ok" if complete else "infeasible",
        "unplaced": [u.name for u in report.unplaced],
        "makespan_s": _finite(report.makespan_s) if complete else None,
        "sum_jct_s": _finite(report.sum_jct_s) if complete else None,
        "planning_s": planning_s,
        "x_compute_bound": (report.makespan_s / bound) if complete and math.isfinite(report.makespan_s) else None,
        "notes": list(plan.notes),
    }


def _child(conn, method, jobs, net, bound) -> None:
    try:
        conn.send(_plan_row(method, jobs, net, bound))
    except BaseException as exc:  # reported as a failed method, the benchmark goes on
        conn.send({"status": "error", "error": f"{type(exc).__name__}: {exc}"})
    finally:
        conn.close()


def _measure(method: str, jobs, net, bound: float, timeout_s: float) -> dict:
    """One method in a forked process, stopped after ``timeout_s`` (reported as a timeout)."""
    import multiprocessing as mp

    ctx = mp.get_context("fork")
    parent, child = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(child, method, jobs, net, bound), daemon=True)
    t = time.perf_counter()
    proc.start()
    child.close()
    row = None
    if parent.poll(timeout_s):
        try:
            row = parent.recv()
        except EOFError:
            row = None
    proc.join(timeout=5)
    if proc.is_alive():
        proc.terminate()
        proc.join()
    if row is None:
        if proc.exitcode not in (0, None) and time.perf_counter() - t < timeout_s:
            row = {"status": "error", "error": f"planner process died (exit code {proc.exitcode})"}
        else:
            row = {"status": "timeout", "error": f"stopped after {timeout_s:.0f} s",
                   "planning_s": None}
    return row


def run_scenario(sc: Scenario, shared: Path, methods=METHODS, log=_log,
                 timeout_s: float = 600.0) -> dict:
    from planner.core.costmodel import compute_bound_s

    t0 = time.perf_counter()
    jobs, net = load_scenario(sc, shared)
    load_s = time.perf_counter() - t0
    bound = compute_bound_s(jobs, net)
    rows: dict[str, dict] = {}
    for method in methods:
        if method.startswith("gnn") and not GNN_CHECKPOINT.exists():
            # Without a trained model plan_gnn falls back to search: nothing of its own to measure.
            rows[method] = {"status": "unavailable",
                            "error": f"no trained model at {GNN_CHECKPOINT.relative_to(REPO)} (make model)"}
            log(f"  {method:9s} unavailable: {rows[method]['error']}")
            continue
        row = rows[method] = _measure(method, jobs, net, bound, timeout_s)
        if row["status"] in ("ok", "infeasible"):
            log(f"  {method:9s} makespan {row['makespan_s']}  planning {row['planning_s']:.2f} s"
                + (f"  unplaced {row['unplaced']}" if row["status"] == "infeasible" else ""))
        else:
            log(f"  {method:9s} {row['status']}: {row['error']}")
    feasible_baselines = [rows[m]["makespan_s"] for m in BASELINES
                          if rows.get(m, {}).get("makespan_s") is not None]
    best_abc = min(feasible_baselines) if feasible_baselines else None
    dtfm = rows.get("dtfm", {}).get("makespan_s")
    for row in rows.values():
        ms = row.get("makespan_s")
        row["best_abc_over_this"] = (best_abc / ms) if ms and best_abc else None
        row["dtfm_over_this"] = (dtfm / ms) if ms and dtfm else None
    return {"scenario": sc.name, "nodes": net.n, "jobs": len(jobs), "seed": sc.seed,
            "compute_bound_s": bound, "best_abc_makespan_s": best_abc, "load_s": load_s,
            "methods": rows}


def targets(results: list[dict]) -> dict:
    """The targets (module docstring), checked on what was measured."""
    def row(name_prefix, method):
        for r in results:
            if r["scenario"].startswith(name_prefix):
                return r["methods"].get(method, {})
        return {}

    out = {}
    for r in results:
        h = r["methods"].get(HULK, {})
        out[f"{r['scenario']}: hulk >= 10x best of A/B/C"] = (
            None if h.get("best_abc_over_this") is None else h["best_abc_over_this"] >= 10)
        out[f"{r['scenario']}: hulk better than DT-FM"] = (
            None if h.get("dtfm_over_this") is None else h["dtfm_over_this"] > 1)
    p6 = row("paper fleet, 6 jobs", HULK).get("planning_s")
    g1k = row("generated 1,000 nodes", HULK).get("planning_s")
    out["paper fleet, 6 jobs: planning < 5 s"] = None if p6 is None else p6 < 5
    out["1,000 nodes / 20 jobs: planning < 60 s"] = None if g1k is None else g1k < 60
    return out


def run(out_dir: Path, shared: Path, quick: bool = False, log=_log,
        timeout_s: float = METHOD_TIMEOUT_S) -> dict:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    results = []
    for sc in scenarios(Path(shared), quick):
        log(f"{sc.name}")
        results.append(run_scenario(sc, Path(shared), log=log, timeout_s=timeout_s))
    doc = {"benchmark": "plan", "quick": quick, "method_timeout_s": timeout_s, "python": platform.python_version(),
           "machine": platform.machine(), "cost_model": "reference (docs/COSTMODEL.md)",
           "results": results, "targets": targets(results)}
    (out_dir / "plan.json").write_text(json.dumps(doc, indent=2) + "\n")
    return doc


def _fmt_x(x) -> str:
    return "-" if x is None else f"{x:.2f}x"


def summarize(doc: dict) -> str:
    """A markdown table per scenario (what `bench.run` puts in SUMMARY.md)."""
    from planner.commands.plan import fmt_s

    lines = ["Makespan by the reference cost model; *best A/B/C ÷ this* and *DT-FM ÷ this* say how "
             "many times faster this plan is; *× bound* is the makespan over the compute bound "
             "(lower is better).", ""]
    for r in doc["results"]:
        lines += [f"**{r['scenario']}** (compute bound {fmt_s(r['compute_bound_s'])})", "",
                  "| method | makespan | sum JCT | best A/B/C ÷ this | DT-FM ÷ this | × bound | planning |",
                  "|---|---|---|---|---|---|---|"]
        for method, row in r["methods"].items():
            if row["status"] == "unavailable":
                lines.append(f"| {method} | unavailable: {row['error']} | | | | | |")
                continue
            if row["status"] == "timeout":
                lines.append(f"| {method} | timeout ({row['error']}) | | | | | > {doc.get('method_timeout_s', 0):.0f} s |")
                continue
            if row["status"] == "error":
                lines.append(f"| {method} | error: {row['error'][:80]} | | | | | |")
                continue
            if row["status"] == "infeasible":
                lines.append(f"| {method} | infeasible ({', '.join(row['unplaced'])} unplaced) | | | | | "
                             f"{row['planning_s']:.2f} s |")
                continue
            lines.append(f"| {method} | {fmt_s(row['makespan_s'])} | {fmt_s(row['sum_jct_s'])} | "
                         f"{_fmt_x(row['best_abc_over_this'])} | {_fmt_x(row['dtfm_over_this'])} | "
                         f"{_fmt_x(row['x_compute_bound'])} | {row['planning_s']:.2f} s |")
        lines.append("")
    lines.append("Targets:")
    lines.append("")
    for name, ok in doc["targets"].items():
        lines.append(f"- {name}: {'met' if ok else 'not measured' if ok is None else 'NOT met'}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.plan_bench", description=__doc__.splitlines()[0])
    parser.add_argument("--shared", type=Path, default=REPO / ".." / "shared")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    parser.add_argument("--quick", action="store_true", help="skip the 5,000-node fleet")
    parser.add_argument("--method-timeout", type=float, default=METHOD_TIMEOUT_S,
                        help="seconds per method and scenario before it is stopped")
    args = parser.parse_args(argv)
    doc = run(args.out, args.shared, args.quick, timeout_s=args.method_timeout)
    print(summarize(doc))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
