"""The golden set: every deterministic method's plan on the portfolio bench's fleets, as a digest.

    .venv/bin/python -m bench.golden --shared ../shared            # compare with the stored set
    .venv/bin/python -m bench.golden --shared ../shared --write    # store the set anew

A refactor that must not change plans is checked by this: the makespan (to every digit) and a
digest of each plan's placements (stages, layer ranges, node ids, micro-batch, phase) per fleet
and method. The portfolio runs in this process with a fixed number of starts and no time budget
that could stop a start, so its answer depends only on its inputs. Stored in
bench/results/golden.json.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "bench" / "results" / "golden.json"
METHODS = ("search", "search-unordered", "portfolio", "system-a", "system-b", "system-c", "dtfm",
           "gnn-raw", "gnn")
NO_STOP_S = 3600.0


def digest(plan, net) -> str:
    """sha256 of the plan's placements and unplaced jobs, node ids in pipeline order."""
    rows = []
    for p in sorted(plan.placements, key=lambda p: p.job.name):
        rows.append([p.job.name, p.phase, p.micro_batch,
                     [[s.lo, s.hi, [net.nodes[i].id for i in s.nodes]] for s in p.stages]])
    rows.append(sorted(u.name for u in plan.unplaced))
    return hashlib.sha256(json.dumps(rows, sort_keys=True).encode()).hexdigest()[:16]


def plan_with(method: str, jobs, net):
    """``search-unordered``: the search without stage ordering and chains of relocations."""
    from planner.methods import planner_for
    from planner.search import plan_search
    from planner.search.options import SearchOptions

    if method == "search-unordered":
        return plan_search(jobs, net, options=SearchOptions(stage_order=False, chains=False))
    return planner_for(method)(jobs, net, seed=0, budget_s=NO_STOP_S, workers=1, starts=8)


def collect(shared: Path, log=print) -> dict:
    from bench.portfolio_bench import fleets, load
    from planner.core.evaluate import evaluate

    out: dict[str, dict] = {}
    for fl in fleets(quick=True):
        if fl.kind == "example" and not (REPO / fl.path).exists():
            continue
        jobs, net = load(fl, shared)
        row = {}
        for method in METHODS:
            t = time.perf_counter()
            plan = plan_with(method, jobs, net)
            report = evaluate(plan, net)
            ms = report.makespan_s
            row[method] = {"makespan_s": repr(ms) if not math.isfinite(ms) else ms,
                           "digest": digest(plan, net)}
            log(f"{fl.name[:48]:48s} {method:13s} {ms:14.4f} s  {row[method]['digest']}  "
                f"({time.perf_counter() - t:.1f} s)")
        out[fl.name] = row
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shared", default=str(REPO.parent / "shared"))
    ap.add_argument("--write", action="store_true", help="store the set instead of comparing")
    args = ap.parse_args(argv)
    got = collect(Path(args.shared))
    if args.write:
        OUT.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")
        print(f"wrote {OUT}")
        return 0
    want = json.loads(OUT.read_text())
    bad = [(fleet, m, want[fleet][m], got.get(fleet, {}).get(m))
           for fleet in want for m in want[fleet] if got.get(fleet, {}).get(m) != want[fleet][m]]
    for fleet, m, w, g in bad:
        print(f"DIFFERS {fleet} / {m}: stored {w}, now {g}")
    print(f"golden: {sum(len(v) for v in want.values()) - len(bad)} same, {len(bad)} differ")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
