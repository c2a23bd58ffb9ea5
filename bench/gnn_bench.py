"""GNN benchmark: pair accuracy vs the teacher, makespan vs search, planning and inference time.

    .venv/bin/python -m bench.gnn_bench --shared ../shared [--quick]

Writes bench/results/gnn.json (``run`` is also what ``make bench`` calls). Held-out fleets come
from a data seed the shipped model never saw (HELD_OUT_SEED); their teacher labels share the
training label cache, so a rerun only re-plans with the GNN.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np
import torch

HELD_OUT_SEED = 1007
FULL_FLEETS, QUICK_FLEETS = 60, 20
SIZES_FULL, SIZES_QUICK = (100, 1000, 5000), (100, 1000)
SIZE_JOBS = 8


def _accuracy(model, examples) -> tuple[float, float]:
    """Mean balanced same-group pair accuracy of the GNN against the labels, and always-idle's
    (0.5 by construction; computed, not assumed)."""
    from planner.gnn import features as F
    from planner.gnn.train import pair_accuracy

    ours, idle = [], []
    with torch.no_grad():
        for ex in examples:
            data = F.to_data(ex.feats, model.stats)
            pair_p, idle_p = model.model.forward_data(data)
            probs = pair_p.numpy().reshape(ex.feats.x.shape[0], ex.feats.num_jobs)
            ours.append(pair_accuracy(probs, idle_p.numpy(), ex.groups))
            idle.append(pair_accuracy(np.zeros_like(probs), np.ones(len(ex.groups)), ex.groups))
    return float(np.mean(ours)), float(np.mean(idle))


def _summary(ratios: list[float]) -> dict:
    a = np.array(ratios)
    return {"mean": float(a.mean()), "median": float(np.median(a)), "p90": float(np.quantile(a, 0.9)),
            "max": float(a.max()), "min": float(a.min()),
            "within_2pct": float((a <= 1.02).mean()), "within_15pct": float((a <= 1.15).mean())}


def _makespans(jobs, net, model_path, search_makespan=None):
    from planner.core.costmodel import estimate_plan
    from planner.search import plan_search
    from planner.gnn.infer import plan_gnn

    out = {}
    if search_makespan is None:
        t = time.perf_counter()
        plan = plan_search(jobs, net)
        out["search_s"] = time.perf_counter() - t
        search_makespan = estimate_plan(plan.placements, net).makespan_s
    out["search"] = search_makespan
    for method, refine in (("gnn-raw", False), ("gnn", True)):
        t = time.perf_counter()
        plan = plan_gnn(jobs, net, checkpoint=model_path, refine=refine)
        out[f"{method}_s"] = time.perf_counter() - t
        out[method] = estimate_plan(plan.placements, net).makespan_s
    return out


def run(out_dir: Path, shared: Path, quick: bool = False) -> dict:
    from planner.core.fleet import complete
    from planner.core.generate import generate_jobs, generate_network
    from planner.files.fleet import load_fleet
    from planner.gnn import checkpoint as ckpt
    from planner.gnn import data as gdata
    from planner.gnn import features as F
    from planner.gnn.infer import load_cached, node_scores
    from planner.files.jobs import load_jobs

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    model_path = ckpt.default_path()
    model = load_cached(model_path)
    result: dict = {"model": str(model_path), "model_metrics": model.metrics,
                    "model_versions": model.meta.get("versions", {}), "quick": quick}

    # 1. Held-out generated fleets: accuracy and makespan relative to the teacher (search).
    count = QUICK_FLEETS if quick else FULL_FLEETS
    t0 = time.perf_counter()
    examples = gdata.load_examples(HELD_OUT_SEED, count)
    acc, acc_idle = _accuracy(model, examples)
    raw_ratio, gnn_ratio, times = [], [], {"search": [], "gnn-raw": [], "gnn": []}
    for ex in examples:
        jobs, net = gdata.build_instance(ex.spec)
        m = _makespans(jobs, net, model_path, search_makespan=ex.teacher_makespan_s)
        raw_ratio.append(m["gnn-raw"] / m["search"])
        gnn_ratio.append(m["gnn"] / m["search"])
        times["gnn-raw"].append(m["gnn-raw_s"])
        times["gnn"].append(m["gnn_s"])
    result["held_out"] = {
        "fleets": len(examples), "data_seed": HELD_OUT_SEED,
        "nodes": {"min": min(e.spec.nodes for e in examples), "max": max(e.spec.nodes for e in examples),
                  "total": int(sum(e.spec.nodes for e in examples))},
        "pair_accuracy": acc, "pair_accuracy_always_idle": acc_idle,
        "makespan_ratio_gnn_raw_vs_search": _summary(raw_ratio),
        "makespan_ratio_gnn_vs_search": _summary(gnn_ratio),
        "mean_planning_s": {k: float(np.mean(v)) for k, v in times.items() if v},
        "seconds": round(time.perf_counter() - t0, 1),
    }

    # 2. The paper's fleet with its job sets.
    paper = {}
    net = complete(load_fleet(shared / "data" / "hulk-upstream"))
    for name in ("paper-4-jobs", "paper-6-jobs"):
        jobs = load_jobs(shared / "bench" / f"{name}.yaml")
        from planner.search import plan_search

        from planner.gnn.train import pair_accuracy

        teacher = plan_search(jobs, net)
        groups, _ = gdata.labels_from_plan(teacher, jobs, net)
        scores = node_scores(jobs, net, model)
        m = _makespans(jobs, net, model_path)
        paper[name] = {"nodes": net.n, "jobs": len(jobs),
                       "pair_accuracy": pair_accuracy(scores[:, :-1], scores[:, -1], groups),
                       "pair_accuracy_always_idle": pair_accuracy(
                           np.zeros((net.n, len(jobs))), np.ones(net.n), groups),
                       "makespan_s": {k: m[k] for k in ("search", "gnn-raw", "gnn")},
                       "ratio_vs_search": {k: m[k] / m["search"] for k in ("gnn-raw", "gnn")},
                       "planning_s": {k: m[f"{k}_s"] for k in ("search", "gnn-raw", "gnn")}}
    result["paper_fleet"] = paper

    # 3. Planning time at scale (same job set per size).
    scale = {}
    for n in (SIZES_QUICK if quick else SIZES_FULL):
        net = generate_network(n, seed=n)
        jobs = generate_jobs(SIZE_JOBS, seed=n, max_params=float(net.mem.sum()) / 16 / 3)
        m = _makespans(jobs, net, model_path)
        scale[str(n)] = {"jobs": len(jobs),
                         "planning_s": {k: m[f"{k}_s"] for k in ("search", "gnn-raw", "gnn")},
                         "makespan_ratio_vs_search": {k: m[k] / m["search"] for k in ("gnn-raw", "gnn")},
                         "speedup_vs_search": {k: m["search_s"] / m[f"{k}_s"] for k in ("gnn-raw", "gnn")}}
    result["planning_time"] = scale

    # 4. The network alone on a 10,000-node graph (features built once, forward timed).
    n = 10_000
    net = generate_network(n, seed=10_000)
    jobs = generate_jobs(SIZE_JOBS, seed=10_000, max_params=float(net.mem.sum()) / 16 / 3)
    t = time.perf_counter()
    feats = F.featurize(jobs, net)
    featurize_s = time.perf_counter() - t
    data = F.to_data(feats, model.stats)
    with torch.no_grad():
        model.model.forward_data(data)                      # warm-up (allocations)
        runs = []
        for _ in range(3):
            t = time.perf_counter()
            model.model.forward_data(data)
            runs.append(time.perf_counter() - t)
    result["inference_10k"] = {"nodes": n, "edges": int(data.edge_index.shape[1]),
                               "forward_s": statistics.median(runs), "featurize_s": featurize_s,
                               "torch_threads": torch.get_num_threads()}

    held = result["held_out"]
    t1000 = scale.get("1000", {}).get("speedup_vs_search", {})
    s5000 = scale.get("5000")
    result["targets"] = {
        "gnn_raw_within_15pct_mean": held["makespan_ratio_gnn_raw_vs_search"]["mean"] <= 1.15,
        "gnn_within_2pct_mean": held["makespan_ratio_gnn_vs_search"]["mean"] <= 1.02,
        "gnn_3x_faster_at_1000": (t1000.get("gnn", 0) >= 3.0) if t1000 else None,
        # The target: at 5,000 servers, within 1.15x of search's makespan in at most 1/5 its time.
        "gnn_raw_5000_within_1_15x_in_a_fifth_of_the_time": (
            s5000["makespan_ratio_vs_search"]["gnn-raw"] <= 1.15
            and s5000["speedup_vs_search"]["gnn-raw"] >= 5.0) if s5000 else None,
        "inference_10k_under_2s": result["inference_10k"]["forward_s"] < 2.0,
    }
    (out_dir / "gnn.json").write_text(json.dumps(result, indent=2) + "\n")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shared", default="../shared")
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    result = run(Path(args.out), Path(args.shared), quick=args.quick)
    print(json.dumps({k: result[k] for k in ("held_out", "paper_fleet", "planning_time",
                                              "inference_10k", "targets")}, indent=2))


if __name__ == "__main__":
    main()
