"""DiLoCo benchmark: the same job sets planned with ``sync: auto`` and with ``sync: step`` only,
on fleets the search was not tuned on; makespan by the reference cost model (docs/COSTMODEL.md,
section 8 for island placements), every plan checked, planning time of each.

    .venv/bin/python -m bench.diloco_bench [--quick] [--repeats N]

Fleets: servers in real cloud regions (bench/regions.py) drawn with seeds no other benchmark
uses (held out), and the scale benchmark's 10,000 servers in 200 sites written with site links
only (bench/scale_bench.py: planner.core.generate.generate_regional_fleet, seed 1, 20 generated
jobs), completed with the formula (`plan --links formula`); --quick keeps two small
region fleets. Jobs: generated (planner.core.generate.generate_jobs, the fleet's seed), once as
they are (``sync: step``) and once with :data:`AUTO` (``sync: auto``: H up to 500, any of
none / bf16 / int8).

Each fleet is planned with the default method as `hulk-planner plan` runs it
(planner.methods.planner_for("portfolio"), every core), ``step`` first, then ``auto``, the pair
``--repeats`` times (default 3; times are the medians, so a spell of load on this shared machine
falls on both and moves neither much). Per run: makespan, wall and CPU seconds (this process and its reaped workers), whether every
placement is valid (costmodel.problems empty, no node twice in a phase, every job placed) and,
for ``auto``, what each job got (islands, H, compression, or step). Targets: every plan valid,
``auto``'s makespan never longer than ``step``'s and shorter on the fleets spread over
continents, and ``auto``'s planning time at most :data:`TARGET_TIME_RATIO` x ``step``'s.
The load average beside each row says how busy the machine was. Writes
bench/results/diloco.json.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TARGET_TIME_RATIO = 1.5
AUTO_LIMITS = {"mode": "auto", "inner_steps": 500, "compressions": ("none", "bf16", "int8")}


@dataclass(frozen=True)
class Fleet:
    name: str
    kind: str          # "regions" (bench/regions.py) or "regional" (generate_regional_fleet)
    nodes: int
    regions: int
    jobs: int
    seed: int


FLEETS = (
    Fleet("regions 90 servers / 45 regions, 6 jobs", "regions", 90, 45, 6, 21),
    Fleet("regions 120 servers / 24 regions, 6 jobs", "regions", 120, 24, 6, 22),
    Fleet("regions 200 servers / 60 regions, 8 jobs", "regions", 200, 60, 8, 23),
    Fleet("regions 400 servers / 69 regions, 10 jobs", "regions", 400, 69, 10, 24),
    Fleet("regional 10,000 servers / 200 sites, 20 jobs", "regional", 10_000, 200, 20, 1),
)
QUICK_FLEETS = (
    Fleet("regions 40 servers / 12 regions, 3 jobs", "regions", 40, 12, 3, 21),
    Fleet("regions 60 servers / 20 regions, 4 jobs", "regions", 60, 20, 4, 22),
)


def auto_sync():
    from planner.core.jobs import Sync

    return Sync(AUTO_LIMITS["mode"], AUTO_LIMITS["inner_steps"], AUTO_LIMITS["compressions"])


def load(fl: Fleet):
    """(step jobs, auto jobs, network) of ``fl``."""
    from bench.regions import region_network
    from planner.core.fleet import complete
    from planner.core.generate import generate_jobs, generate_regional_fleet

    if fl.kind == "regions":
        net = region_network(fl.nodes, fl.regions, seed=fl.seed)
    else:
        net = complete(generate_regional_fleet(fl.nodes, fl.regions, seed=fl.seed))
    jobs = generate_jobs(fl.jobs, seed=fl.seed)
    sync = auto_sync()
    return jobs, [dataclasses.replace(j, sync=sync) for j in jobs], net


def _cpu_s() -> float:
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def check(plan, net, jobs) -> list[str]:
    """Why ``plan`` is not a valid plan of ``jobs`` on ``net`` (empty when it is)."""
    from planner.core.costmodel import problems

    out = [f"{j.name} unplaced" for j in plan.unplaced]
    placed = sorted(p.job.name for p in plan.placements)
    if placed != sorted(j.name for j in jobs):
        out.append(f"jobs placed {placed}, expected each of {sorted(j.name for j in jobs)} once")
    by_phase: dict[int, list[int]] = {}
    for p in plan.placements:
        out += problems(p, net)
        by_phase.setdefault(p.phase, []).extend(p.nodes)
    out += [f"phase {ph} uses a node twice" for ph, nodes in by_phase.items()
            if len(nodes) != len(set(nodes))]
    return out


def measure(jobs, net, workers: int | None = None) -> dict:
    """The default method's plan of ``jobs`` on ``net`` and its figures (module docstring);
    ``workers``: its processes (None: every core, as `plan`)."""
    from planner.core.evaluate import evaluate
    from planner.methods import planner_for
    from planner.search.islands import outer_summary
    from planner.search.workers import wait_reaped

    load_before = os.getloadavg()[0]
    cpu = _cpu_s()
    t = time.perf_counter()
    plan = planner_for("portfolio")(jobs, net, seed=0, workers=workers)
    seconds = time.perf_counter() - t
    wait_reaped()
    cpu = _cpu_s() - cpu
    report = evaluate(plan, net)
    problems = check(plan, net, jobs)
    return {"makespan_s": report.makespan_s if math.isfinite(report.makespan_s) else None,
            "planning_s": seconds, "cpu_s": cpu, "load_1min_before": round(load_before, 2),
            "valid": not problems, "problems": problems[:5],
            "sync": {p.job.name: outer_summary(p) for p in plan.placements},
            "island_jobs": sum(p.outer is not None for p in plan.placements)}


def repeated(runs: list[dict]) -> dict:
    """The first of ``runs`` (plans of the same jobs) with planning_s and cpu_s replaced by their
    medians, every run's times kept, and whether every run's makespan was the same."""
    out = dict(runs[0])
    for key in ("planning_s", "cpu_s"):
        out[f"{key[:-2]}_runs_s"] = [r[key] for r in runs]
        out[key] = statistics.median(r[key] for r in runs)
    out["valid"] = all(r["valid"] for r in runs)
    out["makespans_agree"] = len({r["makespan_s"] for r in runs}) == 1
    return out


def run_fleet(fl: Fleet, log=print, workers: int | None = None, repeats: int = 1) -> dict:
    """``fl`` planned ``repeats`` times with ``step`` and ``auto`` alternating (so both see the
    same spells of load); times are medians."""
    step_jobs, auto_jobs, net = load(fl)
    row = {"fleet": fl.name, "nodes": net.n, "jobs": len(step_jobs), "seed": fl.seed,
           "models": [j.model or j.name for j in step_jobs], "repeats": repeats}
    runs: dict[str, list[dict]] = {"step": [], "auto": []}
    for _ in range(repeats):
        runs["step"].append(measure(step_jobs, net, workers))
        runs["auto"].append(measure(auto_jobs, net, workers))
    row["step"], row["auto"] = repeated(runs["step"]), repeated(runs["auto"])
    s, a = row["step"], row["auto"]
    row["makespan_ratio"] = (a["makespan_s"] / s["makespan_s"]
                             if a["makespan_s"] and s["makespan_s"] else None)
    row["time_ratio"] = a["planning_s"] / s["planning_s"] if s["planning_s"] > 0 else None
    row["cpu_ratio"] = a["cpu_s"] / s["cpu_s"] if s["cpu_s"] > 0 else None
    log(f"{fl.name}: step {_h(s['makespan_s'])} in {s['planning_s']:.1f} s, auto "
        f"{_h(a['makespan_s'])} in {a['planning_s']:.1f} s ({a['island_jobs']} job(s) on "
        f"islands), valid {s['valid']}/{a['valid']}")
    return row


def _h(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds / 3600:.2f} h"


def summary(rows: list[dict]) -> dict:
    ratios = [r["makespan_ratio"] for r in rows if r["makespan_ratio"] is not None]
    times = [r["time_ratio"] for r in rows if r["time_ratio"] is not None]
    return {
        "fleets": len(rows),
        "all_valid": all(r["step"]["valid"] and r["auto"]["valid"] for r in rows),
        "auto_not_longer": sum(r["makespan_ratio"] is not None and r["makespan_ratio"]
                               <= 1 + 1e-9 for r in rows),
        "auto_shorter": sum(r["makespan_ratio"] is not None and r["makespan_ratio"] < 1 - 1e-9
                            for r in rows),
        "geomean_makespan_ratio": _geomean(ratios),
        "best_makespan_ratio": min(ratios, default=None),
        "max_time_ratio": max(times, default=None),
        "max_cpu_ratio": max((r["cpu_ratio"] for r in rows if r["cpu_ratio"] is not None),
                             default=None),
        "makespans_agree": all(r[k]["makespans_agree"] for r in rows for k in ("step", "auto")),
        "geomean_time_ratio": _geomean(times),
        "time_target_met": bool(times) and max(times) <= TARGET_TIME_RATIO,
    }


def _geomean(xs: list[float]) -> float | None:
    xs = [x for x in xs if x and x > 0]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def run(out_dir: Path, quick: bool = False, fleets=None, log=print,
        command: str | None = None, workers: int | None = None, repeats: int = 1) -> dict:
    from rich.progress import Progress

    fleets = list(fleets if fleets is not None else (QUICK_FLEETS if quick else FLEETS))
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = []
    load_before = os.getloadavg()[0]
    with Progress(transient=True) as bar:
        task = bar.add_task("sync: step and sync: auto", total=len(fleets))
        for fl in fleets:
            bar.update(task, description=fl.name)
            rows.append(run_fleet(fl, log, workers, repeats))
            bar.advance(task)
    doc = {
        "benchmark": "diloco", "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "command": command or "python -m bench.diloco_bench" + (" --quick" if quick else ""),
        "quick": quick, "python": platform.python_version(), "machine": platform.machine(),
        "cores": os.cpu_count(), "load_1min_before": load_before,
        "load_1min_after": os.getloadavg()[0],
        "method": "portfolio (the default of `plan`), "
                  + ("every core" if workers is None else f"{workers} worker(s)"),
        "cost_model": "reference (docs/COSTMODEL.md; section 8 for islands)",
        "auto_limits": {**AUTO_LIMITS, "compressions": list(AUTO_LIMITS["compressions"])},
        "target_time_ratio": TARGET_TIME_RATIO, "repeats": repeats,
        "results": rows, "summary": summary(rows),
    }
    (out_dir / "diloco.json").write_text(json.dumps(doc, indent=2) + "\n")
    return doc


def summarize(doc: dict) -> str:
    """A markdown table of ``doc``."""
    lines = ["| fleet | step: makespan, planning | auto: makespan, planning | auto / step "
             "| jobs on islands | valid |", "|---|---|---|---|---|---|"]
    for r in doc["results"]:
        s, a = r["step"], r["auto"]
        ratio = "-" if r["makespan_ratio"] is None else f"{r['makespan_ratio']:.3f}"
        lines.append(f"| {r['fleet']} | {_h(s['makespan_s'])}, {s['planning_s']:.1f} s | "
                     f"{_h(a['makespan_s'])}, {a['planning_s']:.1f} s | {ratio} "
                     f"(time {r['time_ratio']:.2f}x, CPU {r['cpu_ratio']:.2f}x) | {a['island_jobs']} of {r['jobs']} | "
                     f"{s['valid'] and a['valid']} |")
    s = doc["summary"]
    gm = s["geomean_makespan_ratio"]
    lines += ["", f"auto shorter on {s['auto_shorter']} of {s['fleets']} fleets, never longer "
              f"on {s['auto_not_longer']}; geometric mean auto / step "
              f"{'-' if gm is None else f'{gm:.3f}'}; planning time at most "
              f"{s['max_time_ratio'] or 0:.2f}x step's in wall time, "
              f"{s['max_cpu_ratio'] or 0:.2f}x in CPU time (target {TARGET_TIME_RATIO}x); "
              f"every plan valid: {s['all_valid']}."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    parser.add_argument("--quick", action="store_true",
                        help=f"{len(QUICK_FLEETS)} small region fleets only")
    parser.add_argument("--repeats", type=int, default=3,
                        help="plans of each fleet and mode, alternating; times are medians "
                             "(default 3)")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats: expected a whole number of at least 1")
    doc = run(args.out, quick=args.quick, repeats=args.repeats,
              command="python -m bench.diloco_bench " + " ".join(sys.argv[1:] if argv is None
                                                                  else argv))
    print(summarize(doc), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
