"""The search as it was on the day issue 14 was filed, run from its own commit, for the portfolio
benchmark's baseline ("today's search" in the issue's targets).

Issue 14 asks for a default `plan` at least 15% shorter than "today's search" at "the same wall
time as today or less". The portfolio benchmark also measures a stand-in inside this checkout
(today's search with stage ordering switched off: the same makespans as the issue's search, but
with every speed-up made since); this module measures the real thing: the source tree of
:data:`ISSUE_DAY_COMMIT` (the last commit before the session that first worked on issue 14,
which was open by then), taken with ``git archive`` into a temporary folder and run in a child
interpreter of this virtual environment with only that tree on its path, one fleet after another.

The child gets each fleet as plain values (the Network's nodes, RTT, bandwidth and imputed
matrices, the jobs' fields), plans it with ``--method search`` as `hulk-planner plan` of that day
would, and sends back each plan as node indices; the parent judges every plan with today's
reference cost model (``planner.core.evaluate.evaluate``; the cost model's formulas have not changed
since, only refactored). Timing is the plan call alone, as bench.portfolio_bench times its
methods, on a fresh Network each run; runs under ``repeat_below_s`` are timed twice and the
faster kept.

    python -m bench.issue_day        # the real-region fleets of bench.portfolio_bench, printed

The child side (``--child DIR``) imports nothing of today's tree: it runs under ``python -P``
with ``PYTHONPATH`` set to the old tree.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import pickle
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ISSUE_DAY_COMMIT = "633c2eaedf76df2347336fd117f10a7527f02c13"   # 2026-11-22, before issue 14's work
REPO = Path(__file__).resolve().parents[1]


class Unavailable(RuntimeError):
    """The old tree cannot be had here (no git, or a clone without that commit)."""


def export_tree(dest: Path, commit: str = ISSUE_DAY_COMMIT, repo: Path = REPO) -> Path:
    """``commit``'s hulk/ and planner/ extracted under ``dest`` (``git archive | tar``)."""
    dest.mkdir(parents=True, exist_ok=True)
    try:
        archive = subprocess.run(["git", "-C", str(repo), "archive", "--format=tar", commit,
                                  "hulk", "planner"], capture_output=True, check=True)
    except FileNotFoundError as err:
        raise Unavailable("git is not installed") from err
    except subprocess.CalledProcessError as err:
        raise Unavailable(f"commit {commit[:10]} is not in this clone: "
                          f"{err.stderr.decode(errors='replace').strip()}") from err
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive.stdout, check=True)
    return dest


def fleet_values(name: str, jobs, net) -> dict:
    """A fleet as plain values the old tree's classes are built from."""
    return {"name": name, "nodes": [dataclasses.asdict(n) for n in net.nodes],
            "rtt_ms": net.rtt_ms, "bw": net.bw, "imputed": net.imputed,
            "jobs": [dataclasses.asdict(j) for j in jobs]}


def measure_fleets(cases: list[tuple[str, list, object]], repeat_below_s: float = 5.0,
                   commit: str = ISSUE_DAY_COMMIT, log=print) -> dict[str, dict]:
    """``{name: {"makespan_s", "planning_s", "complete", "commit"}}`` for ``(name, jobs, net)``
    cases, each planned by ``commit``'s ``--method search`` and judged by today's cost model."""
    with tempfile.TemporaryDirectory(prefix="hulk-issue-day-") as tmp:
        tree = export_tree(Path(tmp) / "tree", commit)
        work = Path(tmp) / "fleets"
        work.mkdir()
        for i, (name, jobs, net) in enumerate(cases):
            (work / f"{i:03d}.pkl").write_bytes(pickle.dumps(fleet_values(name, jobs, net)))
        env = dict(os.environ, PYTHONPATH=str(tree))
        cmd = [sys.executable, "-P", str(Path(__file__).resolve()), "--child", str(work),
               "--repeat-below", str(repeat_below_s)]
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True)
        answers = {}
        for line in proc.stdout:
            doc = json.loads(line)
            answers[doc["index"]] = doc
            log(f"issue-day search ({commit[:7]}): {cases[doc['index']][0]}: "
                f"{doc['planning_s']:.2f} s", flush=True)
        if proc.wait() != 0:
            raise RuntimeError(f"the issue-day search failed (exit {proc.returncode})")
    out = {}
    for i, (name, jobs, net) in enumerate(cases):
        doc = answers[i]
        report = _judge(doc, jobs, net)
        ok = report.complete and math.isfinite(report.makespan_s)
        out[name] = {"makespan_s": report.makespan_s if ok else None,
                     "complete": report.complete, "planning_s": doc["planning_s"],
                     "commit": commit}
    return out


def _judge(doc: dict, jobs, net):
    """The child's plan, rebuilt from node indices, judged by today's reference cost model (a
    job the old search left unplaced makes the report incomplete, with no makespan to compare)."""
    from planner.core.costmodel import Placement, Stage
    from planner.core.plan import Plan, Unplaced
    from planner.core.evaluate import evaluate

    by_name = {j.name: j for j in jobs}
    placements = [Placement(by_name[p["job"]],
                            tuple(Stage(lo, hi, tuple(nodes)) for lo, hi, nodes in p["stages"]),
                            p["micro_batch"], p["phase"])
                  for p in doc["placements"]]
    unplaced = [Unplaced(name, "not placed by the search of issue 14's day")
                for name in doc["unplaced"]]
    return evaluate(Plan("search", placements, unplaced), net)


# --- the child: runs with the old tree only --------------------------------------------------

def _child(folder: Path, repeat_below_s: float) -> int:
    from planner.commands.plan import planner_for
    from planner.core.fleet import Network, Node
    from planner.core.jobs import Job

    node_fields = {f.name for f in dataclasses.fields(Node)}
    job_fields = {f.name for f in dataclasses.fields(Job)}
    fn = planner_for("search")
    for path in sorted(folder.glob("*.pkl")):
        d = pickle.loads(path.read_bytes())
        nodes = tuple(Node(**{k: v for k, v in n.items() if k in node_fields}) for n in d["nodes"])
        jobs = [Job(**{k: tuple(v) if isinstance(v, list) else v for k, v in j.items()
                       if k in job_fields}) for j in d["jobs"]]
        best = None
        for _ in range(2):
            net = Network(nodes, d["rtt_ms"].copy(), d["bw"].copy(), d["imputed"].copy())
            t = time.perf_counter()
            plan = fn(jobs, net, seed=0)
            seconds = time.perf_counter() - t
            if best is None or seconds < best[1]:
                best = (plan, seconds)
            if seconds >= repeat_below_s:
                break
        plan, seconds = best
        print(json.dumps({
            "index": int(path.stem), "planning_s": seconds,
            "placements": [{"job": p.job.name, "micro_batch": p.micro_batch, "phase": p.phase,
                            "stages": [[s.lo, s.hi, [int(i) for i in s.nodes]] for s in p.stages]}
                           for p in plan.placements],
            "unplaced": [u.name for u in plan.unplaced],
        }), flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.issue_day",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--repeat-below", type=float, default=5.0, help=argparse.SUPPRESS)
    parser.add_argument("--shared", type=Path, default=REPO / ".." / "shared")
    parser.add_argument("--quick", action="store_true", help="leave out the 1,000-server fleet")
    args = parser.parse_args(argv)
    if args.child:
        return _child(args.child, args.repeat_below)
    from bench.portfolio_bench import fleets, load

    cases = [(fl.name, *load(fl, args.shared)) for fl in fleets(args.quick) if fl.kind == "regions"]
    for name, doc in measure_fleets(cases).items():
        print(f"{name}: {doc['makespan_s'] / 3600:.3f} h in {doc['planning_s']:.2f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
