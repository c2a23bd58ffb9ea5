"""How long `hulk-planner fleet complete` takes on a 200-site fleet (target: under 5 s).

    .venv/bin/python -m bench.fleet_complete_bench [--sites 200] [--measured 0.3] [--seed 0]
        [--models all|default] [--repeat 3]

The fleet: the link-prediction benchmark's generated ground truth (bench/linkpred_data.py,
``generated_dataset``) at ``--sites`` sites, one 8-GPU server each, with a seeded ``--measured``
share of the site pairs given as measured site links (RTT and throughput). Each run is the real
command in a fresh process (interpreter start and imports included), once with the default
model and once per model of planner.linkpred.models.MODELS (``--model``; ``--models default``:
the default only), each stopped after ``--timeout`` seconds; the command's own figure (load,
fit, predict, write) is read from its summary line beside the wall time. Each model runs
``--repeat`` times and its row gives the median of both figures beside every run's. The machine's
load average is recorded before and after: timings on a shared machine are upper bounds.

Writes bench/results/fleet_complete.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "bench" / "results" / "fleet_complete.json"
TARGET_S = 5.0


def fleet_json(sites: int, measured: float, seed: int) -> dict:
    """The fleet JSON of the benchmark (see the module's docstring)."""
    from bench.linkpred_data import generated_dataset

    truth = generated_dataset(sites, seed).truth
    rng = np.random.default_rng(seed)
    keep = rng.random(len(truth.i)) < measured
    nodes = [{"id": f"n{k:03d}", "site": name, "gpus": 8, "gpu_name": "A100",
              "memory_gb": 640} for k, name in enumerate(truth.sites)]
    located = [{"id": name, "lat": float(lat), "lon": float(lon)}
               for name, lat, lon in zip(truth.sites, truth.latitude, truth.longitude)]
    links = [{"src": truth.sites[a], "dst": truth.sites[b], "rtt_ms": round(float(r), 3),
              "bandwidth_gbps": round(float(g), 4) if g == g else None}
             for a, b, r, g in zip(truth.i[keep].tolist(), truth.j[keep].tolist(),
                                   truth.rtt_ms[keep].tolist(), truth.gbps[keep].tolist())]
    return {"name": f"complete-bench-{sites}-s{seed}", "nodes": nodes, "sites": located,
            "links": [], "site_links": links}


def run_once(fleet: Path, out: Path, model: str | None, timeout_s: float) -> dict:
    command = [sys.executable, "-m", "planner.cli", "fleet", "complete", str(fleet), "--out",
               str(out)] + (["--model", model] if model else [])
    start = time.perf_counter()
    try:
        done = subprocess.run(command, cwd=REPO, capture_output=True, text=True,
                              timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {"model": model or "(default)", "error": f"stopped after {timeout_s:g} s"}
    wall = time.perf_counter() - start
    if done.returncode != 0:
        return {"model": model or "(default)", "error": done.stderr.strip()}
    head = done.stdout.splitlines()[0]
    inner = re.search(r"; model (.+); ([0-9.]+) s$", head)
    return {"model": model or "(default)", "used": inner.group(1) if inner else None,
            "command_s": float(inner.group(2)) if inner else None, "wall_s": round(wall, 3),
            "summary": done.stdout.strip().splitlines()}


def repeated(fleet: Path, out: Path, model: str | None, timeout_s: float, repeat: int) -> dict:
    """``run_once`` ``repeat`` times: the first failure, or the last run's row with the medians
    of the command and wall seconds and every run's figures."""
    rows = []
    for _ in range(repeat):
        row = run_once(fleet, out, model, timeout_s)
        if "error" in row:
            return row
        rows.append(row)
    commands = [r["command_s"] for r in rows if r["command_s"] is not None]
    walls = [r["wall_s"] for r in rows]
    return {**rows[-1], "command_s": float(np.median(commands)) if commands else None,
            "wall_s": round(float(np.median(walls)), 3), "command_runs_s": commands,
            "wall_runs_s": walls}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sites", type=int, default=200)
    ap.add_argument("--measured", type=float, default=0.3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--models", default="all", help="'all' (every model of MODELS after the "
                    "default), or 'default'")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds a run may take")
    ap.add_argument("--repeat", type=int, default=3, help="runs per model (medians reported)")
    args = ap.parse_args(argv)
    if args.repeat < 1:
        ap.error("--repeat: expected at least 1")
    load_before = list(os.getloadavg())
    from planner.linkpred.models import MODELS

    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        fleet = Path(tmp) / "fleet.json"
        fleet.write_text(json.dumps(fleet_json(args.sites, args.measured, args.seed)))
        for model in [None, *(MODELS if args.models == "all" else ())]:
            row = repeated(fleet, Path(tmp) / "completed.json", model, args.timeout,
                           args.repeat)
            runs.append(row)
            print(f"{row['model']:>16}: " + (row.get("error") or
                  f"command {row['command_s']:.2f} s, wall {row['wall_s']:.2f} s "
                  f"(model used: {row['used']})"), flush=True)
            _write(args, argv, runs, load_before)   # after every model: a slow one leaves the rest
    print(f"wrote {OUT.relative_to(REPO)}")
    return 0


def _write(args: argparse.Namespace, argv: list[str] | None, runs: list[dict],
           load_before: list[float]) -> None:
    result = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
              "command": "python -m bench.fleet_complete_bench " + " ".join(
                  sys.argv[1:] if argv is None else argv),
              "host": platform.node(), "python": platform.python_version(),
              "load_average_before": load_before, "load_average": list(os.getloadavg()),
              "repeat": args.repeat, "sites": args.sites, "measured_share": args.measured, "seed": args.seed,
              "target_s": TARGET_S, "runs": runs}
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    sys.exit(main())
