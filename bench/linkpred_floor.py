"""How well any model could predict the generated fleets' hidden throughputs: the error floor
under the link-prediction benchmark's figures (bench/linkpred_bench.py).

    .venv/bin/python -m bench.linkpred_floor [--draws N] [--results bench/results/linkpred.json]

The generated fleets (bench/linkpred_data.py) draw every pair's throughput from per-site values
(egress caps, access delays, places, providers) and per-pair randomness (route inflation, RTT
noise, throughput noise) that no measured pair reveals about another. The oracle knows every
per-site value and the generator's formula, and predicts a hidden pair by the median of its
throughput over the per-pair randomness (Monte Carlo, ``draws`` samples per pair). No model fitted
on measured pairs can do better than the oracle except by chance, so its p90 error is the floor.

Judged as the benchmark judges a model: |ln(predicted / true)| on the pairs the ``hide 50%``
splits hide (seeds 0-4, pooled) and on the cold sites' hidden pairs of the ``cold region 3``
splits (seeds 0-2, pooled): the two splits the issue's targets name. Beside each, from the benchmark's results when given: the boosted
trees' and the GNN's p90 on the same splits, the issue's target (10% below the best non-graph
control) and whether any predictor could reach it (the floor below the target), and the share of
the gap from the boosted trees down to the floor that the GNN closed.

Writes bench/results/linkpred_floor.json.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from bench.linkpred_bench import COLD_SEEDS, GENERATED, HIDE_SEEDS, VS_CONTROL, best_control
from bench.linkpred_data import (INFLATION, KM_PER_MS_RTT, RTT_NOISE, RTT_SCALE_MS,
                                 THROUGHPUT_NOISE, GeneratedTruth, generated_truth)
from bench.linkpred_splits import cold_region_splits, hide_splits

REPO = Path(__file__).resolve().parents[1]
KINDS = ("hide 50%", "cold region 3")     # the two the targets name


def oracle_log_gbps(truth: GeneratedTruth, draws: int, seed: int = 0) -> np.ndarray:
    """Per pair, the median over ``draws`` samples of the generator's per-pair randomness of
    ln(throughput), given every per-site value."""
    g = truth.graph
    i, j = g.i, g.j
    rng = np.random.default_rng(seed)
    median = np.where(truth.same, INFLATION["same"][0], INFLATION["cross"][0])
    sigma = np.where(truth.same, INFLATION["same"][1], INFLATION["cross"][1])
    scale = np.where(truth.same, RTT_SCALE_MS["same"], RTT_SCALE_MS["cross"])
    base = np.log(np.minimum(truth.cap_gbps[i], truth.cap_gbps[j]))
    access = 2 * (truth.access_ms[i] + truth.access_ms[j])
    out = np.empty(len(i))
    chunk = max(1, 2_000_000 // draws)
    for start in range(0, len(i), chunk):
        part = slice(start, start + chunk)
        n = len(base[part])
        inflation = median[part, None] * np.exp(rng.normal(0.0, 1.0, (n, draws))
                                                * sigma[part, None])
        rtt = (access[part, None] + truth.km[part, None] / KM_PER_MS_RTT * inflation) \
            * np.exp(rng.normal(0.0, RTT_NOISE, (n, draws)))
        logs = base[part, None] - np.log1p(rtt / scale[part, None]) \
            + rng.normal(0.0, THROUGHPUT_NOISE, (n, draws))
        out[part] = np.median(logs, axis=1)
    return out


def floor_of(sites: int, seed: int, draws: int) -> dict:
    """The oracle's p50/p90 throughput error on the hidden pairs of the benchmark's ``hide 50%``
    splits (seeds 0-4) and ``cold region 3`` splits (seeds 0-2), each pooled."""
    truth = generated_truth(sites, seed)
    g = truth.graph
    errors = np.abs(oracle_log_gbps(truth, draws) - np.log(g.gbps))
    splits = {"hide 50%": hide_splits(g, HIDE_SEEDS, (0.5,)),
              "cold region 3": cold_region_splits(g, COLD_SEEDS, (3,))}
    out = {"all_pairs_gbps_p90": round(float(np.quantile(errors, 0.9)), 4),
           "noise_only_p90": round(float(1.6449 * THROUGHPUT_NOISE), 4)}
    for kind in KINDS:
        judged = np.concatenate([errors[s.judge] for s in splits[kind]])
        out[kind] = {"pairs": int(len(judged)),
                     "gbps_p50": round(float(np.quantile(judged, 0.5)), 4),
                     "gbps_p90": round(float(np.quantile(judged, 0.9)), 4)}
    return out


def compared(floor: float, results: dict | None, name: str, kind: str) -> dict:
    """The ``floor`` p90 beside the benchmark's figures of ``kind`` splits for network ``name``
    (empty without them)."""
    if not results:
        return {}
    summary = results.get("datasets", {}).get(name, {}).get("summary", {})
    best = best_control(summary, kind)
    if best is None:
        return {}
    best_name, best_p90 = best
    target = VS_CONTROL * best_p90
    out = {"best_control": best_name, "best_control_p90": best_p90,
           "target_p90": round(target, 4), "target_reachable": floor < target}
    gnn = summary[kind].get("gnn", {}).get("gbps_p90")
    if gnn is not None:
        gap = best_p90 - floor
        out["gnn_p90"] = gnn
        out["gnn_share_of_gap_closed"] = round((best_p90 - gnn) / gap, 3) if gap > 0 else None
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.linkpred_floor",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--draws", type=int, default=400)
    parser.add_argument("--results", type=Path, default=REPO / "bench" / "results" / "linkpred.json",
                        help="the link-prediction benchmark's results to compare with")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    args = parser.parse_args(argv)
    if not 10 <= args.draws <= 100_000:
        print(f"error: --draws: expected 10 to 100000, got {args.draws}", file=sys.stderr)
        return 2
    results = None
    if args.results.is_file():
        results = json.loads(args.results.read_text())
    started = time.perf_counter()
    networks = {}
    for sites, seed in GENERATED:
        name = f"generated-{sites}-s{seed}"
        floor = floor_of(sites, seed, args.draws)
        networks[name] = {"oracle": floor}
        for kind in KINDS:
            row = compared(floor[kind]["gbps_p90"], results, name, kind)
            networks[name][kind] = row
            print(f"{name}, {kind}: oracle p90 {floor[kind]['gbps_p90']:.3f}"
                  + (f"; best control {row['best_control']} {row['best_control_p90']:.3f}, "
                     f"target {row['target_p90']:.3f} ("
                     + ("reachable" if row["target_reachable"] else "below the floor") + ")"
                     if row else "")
                  + (f"; gnn {row['gnn_p90']:.3f}, {row['gnn_share_of_gap_closed']:.0%} of the "
                     "gap to the floor" if row.get("gnn_share_of_gap_closed") is not None else ""))
    out = {"benchmark": "linkpred_floor",
           "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
           "command": "python -m bench.linkpred_floor " + " ".join(argv or sys.argv[1:]),
           "python": platform.python_version(), "draws": args.draws,
           "judged": {"hide 50%": f"seeds {list(HIDE_SEEDS)}",
                      "cold region 3": f"seeds {list(COLD_SEEDS)}"},
           "compared_with": str(args.results) if results else None,
           "results_date": results.get("date") if results else None,
           "networks": networks, "seconds": round(time.perf_counter() - started, 1)}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "linkpred_floor.json").write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
