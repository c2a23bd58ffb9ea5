"""GNN ablation: is the GNN's start better than the starts that need no learning?

    .venv/bin/python -m bench.gnn_ablation --shared ../shared [--quick] [--cached]

On held-out fleets (generated ones with seeds the training never used, of varied size, city count,
missing links and job count; one fleet built from Azure's published inter-region latencies,
bench/data/azure_rtt_p95_2026.csv, CC BY 4.0; the paper's fleet with its 4- and 6-job sets)
every start is measured three ways: *raw*, Algorithm 1 on its scores with each group's best
placement (exactly the grouping the search's refinement starts from); *refined*, the search
refined from it (``plan_search(initial=scores)``); *decoded*, the same scores through
``gnn-raw``'s decoder (planner.gnn.starts.decode: cluster-coherent groups). Starts: the GNN's
probabilities, uniform scores, three seeded random groupings, the hand heuristic and the cluster
rule ("same locality cluster, same job", bench.gnn_ablation_controls). The controls the GNN has
to beat: the cluster rule's pair accuracy next to the GNN's, and the uniform scores' decoded plan
next to the GNN's (``gnn-raw``); the run counts the fleets where the two decoded plans are the
same plan. Makespans are
the cost model's (planner.core.costmodel, the reference implementation of docs/COSTMODEL.md;
/work/shared holds no second implementation), times are wall seconds on this machine. The
GNN's balanced same-group pair accuracy against the best refined plan is reported next to
always-idle's (0.5 by construction).

Every start is timed alike: before each one the per-process memos it could inherit from the
start before it are cleared and the fleet is built afresh (bench.gnn_ablation_controls.
reset_run_caches), and an untimed warm-up pays the imports first. ``--quick``: the first
:data:`QUICK_FLEETS` held-out fleets, the Azure fleet and the paper's 4-job set. ``--cached``
reuses the non-learned starts' results of an earlier run (~/.cache/hulk/gnn-ablation, keyed by
fleet, start and a digest of the code they depend on, :func:`code_key`); their times are then
that run's, not this one's.

Writes bench/results/gnn_ablation.json and bench/results/gnn_ablation.png.
"""

from __future__ import annotations

import argparse
import csv
import functools
import hashlib
import json
import os
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
AZURE_CSV = REPO / "bench" / "data" / "azure_rtt_p95_2026.csv"
CACHE_VERSION = 3           # 3: the solver orders stage groups (2: raw = Algorithm 1 on the
                            # scores; v1: the gnn-raw decoder only); code changes are keyed
                            # by code_key()
HELD_OUT_BASE_SEED = 910_000      # generated fleets: seeds 910000 + i (training: data seed 7)
RANDOM_SEEDS = (1, 2, 3)
NON_LEARNED = ("uniform", "random-1", "random-2", "random-3", "heuristic", "cluster-rule")
QUICK_FLEETS = 6


def load_azure_rtt(path: Path = AZURE_CSV) -> tuple[list[str], np.ndarray]:
    """Region names and a symmetric RTT matrix (ms): the mean of the two published directions,
    or the one that is published."""
    rows = [r for r in csv.reader(line for line in path.open() if not line.startswith("#"))]
    names = rows[0][1:]
    m = len(names)
    raw = np.full((m, m), np.nan)
    for i, row in enumerate(rows[1:]):
        if row[0] != names[i]:
            raise ValueError(f"{path}: row {i + 1} is {row[0]!r}, expected {names[i]!r}")
        for j, cell in enumerate(row[1:]):
            if cell.strip():
                raw[i, j] = float(cell)
    sym = np.nanmean(np.stack([raw, raw.T]), axis=0)
    np.fill_diagonal(sym, 0.0)
    if np.isnan(sym).any():
        raise ValueError(f"{path}: some region pairs have no RTT in either direction")
    return names, sym


def azure_network(seed: int = 0, per_region: tuple[int, int] = (2, 5)):
    """A fleet of servers in the Azure regions: 2-5 servers per region, GPUs drawn from the
    generator's mix (each region favours one model), RTT between regions from the table plus
    0.5-1.5 ms access, 0.3-1 ms inside a region. City names are region labels the gazetteer does
    not know ("azure:westeurope")."""
    from planner.core.fleet import Network, Node
    from planner.core.generate import GPU_MIX, GPUS_PER_NODE
    from planner.core.gpus import lookup_name

    names, region_rtt = load_azure_rtt()
    rng = np.random.default_rng(seed)
    gpus = [g for g, _ in GPU_MIX]
    mix = np.array([w for _, w in GPU_MIX]) / sum(w for _, w in GPU_MIX)
    counts = [c for c, _ in GPUS_PER_NODE]
    cp = np.array([w for _, w in GPUS_PER_NODE]) / sum(w for _, w in GPUS_PER_NODE)
    nodes, region_of = [], []
    for r, name in enumerate(names):
        favourite = rng.choice(len(gpus), p=mix)
        for s in range(int(rng.integers(per_region[0], per_region[1] + 1))):
            g = favourite if rng.random() < 0.7 else rng.choice(len(gpus), p=mix)
            _, cc, _, mem = lookup_name(gpus[g])
            k = int(rng.choice(counts, p=cp))
            city = "azure:" + name.lower().replace(" ", "")
            nodes.append(Node(id=f"{city}-{s}", city=city, gpus=k, gpu_name=gpus[g],
                              compute_capability=cc, memory_gb=k * mem))
            region_of.append(r)
    region_of = np.array(region_of)
    access = rng.uniform(0.25, 0.75, len(nodes))
    rtt = region_rtt[np.ix_(region_of, region_of)] + access[:, None] + access[None, :]
    same = region_of[:, None] == region_of[None, :]
    rtt = np.where(same, rng.uniform(0.3, 1.0, rtt.shape), rtt)
    rtt = np.triu(rtt, 1) + np.triu(rtt, 1).T
    return Network.from_matrix(nodes, rtt)


def held_out_fleets(count: int) -> list[dict]:
    """Fleet specs: sizes 16-120, 2-24 cities, 0-40% missing links, 2-10 jobs."""
    sizes = (16, 24, 32, 48, 64, 80, 96, 120)
    out = []
    for i in range(count):
        rng = np.random.default_rng([HELD_OUT_BASE_SEED, i])
        n = sizes[i % len(sizes)]
        out.append({"key": f"gen-{i}", "nodes": n, "seed": HELD_OUT_BASE_SEED + i,
                    "cities": int(rng.integers(2, max(3, min(24, n // 2)) + 1)),
                    "missing": round(float(rng.uniform(0.0, 0.4)), 2),
                    "jobs": int(rng.integers(2, min(10, max(2, n // 6)) + 1))})
    return out


def build(spec: dict, shared: Path):
    from planner.core.fleet import complete
    from planner.core.generate import generate_fleet, generate_jobs
    from planner.files.fleet import load_fleet
    from planner.files.jobs import load_jobs

    if spec["key"].startswith("paper"):
        net = complete(load_fleet(shared / "data" / "hulk-upstream"))
        return load_jobs(shared / "bench" / f"{spec['key']}.yaml"), net
    if spec["key"].startswith("azure"):
        net = azure_network(spec["seed"])
    else:
        net = complete(generate_fleet(spec["nodes"], seed=spec["seed"], n_cities=spec["cities"],
                                      missing_fraction=spec["missing"]))
    jobs = generate_jobs(spec["jobs"], seed=spec["seed"] + 1, max_params=float(net.mem.sum()) / 48)
    return jobs, net


def start_scores(name: str, jobs, net, model):
    from planner.gnn.infer import node_scores
    from planner.gnn.starts import random_scores, uniform_scores
    from planner.search import heuristic_scores

    if name == "gnn":
        return node_scores(jobs, net, model)
    if name == "uniform":
        return uniform_scores(jobs, net)
    if name == "heuristic":
        return heuristic_scores(jobs, net)
    if name == "cluster-rule":
        from bench.gnn_ablation_controls import cluster_rule_scores

        return cluster_rule_scores(jobs, net)
    return random_scores(jobs, net, int(name.split("-")[1]))


def run_start(name: str, jobs, net, model) -> dict:
    """One start: *raw* is Algorithm 1 on its scores with each group's best placement (what the
    search's refinement starts from), *refined* is the search refined from it; *decoded* is the
    same scores through ``gnn-raw``'s decoder (cluster-coherent groups)."""
    from planner.core.costmodel import estimate_plan
    from bench.gnn_ablation_controls import plan_digest
    from planner.gnn.infer import grouping_plan
    from planner.gnn.starts import decode
    from planner.search import plan_search

    t = time.perf_counter()
    scores = start_scores(name, jobs, net, model)
    raw, _ = grouping_plan(jobs, net, scores, method="raw")
    raw_s = time.perf_counter() - t
    t = time.perf_counter()
    refined = plan_search(jobs, net, initial=scores)
    refine_s = time.perf_counter() - t
    out = {"raw_h": float(estimate_plan(raw.placements, net).makespan_s) / 3600,
           "refined_h": float(estimate_plan(refined.placements, net).makespan_s) / 3600,
           "raw_s": raw_s, "refine_s": refine_s}
    t = time.perf_counter()
    plan, _ = decode(jobs, net, scores)
    out["decoded_s"] = time.perf_counter() - t
    out["decoded_h"] = float(estimate_plan(plan.placements, net).makespan_s) / 3600
    out["decoded_digest"] = plan_digest(plan)
    out["scores"], out["refined_plan"] = scores, refined
    return out


def code_key(root: Path = REPO) -> str:
    """A digest of the code a non-learned start's result depends on (the search, the cost
    model, the fleet and job generators, the starts' scores and decoder), so that a cached
    result never outlives a change to it (a bumped CACHE_VERSION alone once let results of
    the search before its chains of relocations stand in for today's)."""
    digest = hashlib.sha256()
    for folder in ("planner/search", "planner/core"):
        for path in sorted((root / folder).glob("*.py")):
            digest.update(path.name.encode() + b"\0" + path.read_bytes())
    for path in ("planner/gnn/starts.py", "bench/gnn_ablation.py",
                 "bench/gnn_ablation_controls.py"):
        digest.update((root / path).read_bytes())
    return digest.hexdigest()[:12]


@functools.lru_cache(maxsize=None)   # the code is hashed once per run, not once per start
def _cache_dir(version: int = CACHE_VERSION) -> Path:
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "hulk" / "gnn-ablation" / f"v{version}-{code_key()}"


def _cache_file(key: str, start: str, version: int = CACHE_VERSION) -> Path:
    return _cache_dir(version) / f"{key}-{start}.json"


ENTRY_KEYS = ("raw_h", "refined_h", "raw_s", "refine_s", "decoded_h", "decoded_s",
              "decoded_digest")


def fresh_start(spec: dict, shared: Path):
    """(jobs, net) built afresh with every per-process memo cleared: what each start gets."""
    from bench.gnn_ablation_controls import reset_run_caches

    reset_run_caches()
    return build(spec, shared)


def fleet_row(spec: dict, shared: Path, model, log=print, cached: bool = False) -> dict:
    from bench.gnn_ablation_controls import cluster_rule_accuracy
    from planner.core.costmodel import estimate_plan
    from planner.gnn.data import labels_from_plan
    from planner.gnn.train import pair_accuracy
    from planner.search import network_clusters, plan_search

    jobs, net = fresh_start(spec, shared)
    row = {**{k: v for k, v in spec.items()}, "nodes": net.n, "jobs": len(jobs), "starts": {}}
    t = time.perf_counter()
    search = plan_search(jobs, net)
    row["search"] = {"makespan_h": float(estimate_plan(search.placements, net).makespan_s) / 3600,
                     "seconds": time.perf_counter() - t}
    best_plan, best_h = search, row["search"]["makespan_h"]
    gnn_scores = None
    for start in ("gnn",) + NON_LEARNED:
        cache_file = _cache_file(spec["key"], start)
        if cached and start != "gnn" and cache_file.is_file():
            entry = json.loads(cache_file.read_text())
            if all(k in entry for k in ENTRY_KEYS):
                row["starts"][start] = entry
                continue
        jobs, net = fresh_start(spec, shared)   # nothing memoised by the start before
        result = run_start(start, jobs, net, model)
        if start == "gnn":
            gnn_scores = result["scores"]
        if result["refined_h"] < best_h:
            best_h, best_plan = result["refined_h"], result["refined_plan"]
        entry = {k: result[k] for k in ENTRY_KEYS}
        row["starts"][start] = entry
        if start != "gnn":
            cache_file.parent.mkdir(parents=True, exist_ok=True)
            cache_file.write_text(json.dumps(entry))
    # Accuracy of the GNN and of the cluster rule against the best refined plan found here
    # (same-group pairs).
    groups, _ = labels_from_plan(best_plan, jobs, net)
    row["gnn_pair_accuracy"] = pair_accuracy(gnn_scores[:, :-1], gnn_scores[:, -1], groups)
    row["cluster_rule_pair_accuracy"] = cluster_rule_accuracy(network_clusters(net), groups)
    row["always_idle_pair_accuracy"] = pair_accuracy(np.zeros((net.n, len(jobs))),
                                                     np.ones(net.n), groups)
    s = row["starts"]
    row["gnn_decoded_is_uniform_decoded"] = (s["gnn"]["decoded_digest"]
                                             == s["uniform"]["decoded_digest"])
    best_nl = min(NON_LEARNED, key=lambda k: s[k]["raw_h"])
    row["best_non_learned_raw"] = best_nl
    row["gnn_raw_beats_best_non_learned"] = s["gnn"]["raw_h"] < s[best_nl]["raw_h"] * (1 - 1e-9)
    log(f"[gnn_ablation] {spec['key']}: {net.n} nodes, {len(jobs)} jobs; raw h: "
        + ", ".join(f"{k} {v['raw_h']:.3f}" for k, v in s.items())
        + f"; refined gnn {s['gnn']['refined_h']:.3f} vs best other "
        f"{min(s[k]['refined_h'] for k in NON_LEARNED):.3f}")
    return row


def summarize_rows(rows: list[dict]) -> dict:
    held = [r for r in rows if r["key"].startswith(("gen", "azure"))]
    def ratio(start, kind):
        return [r["starts"][start][kind] / r["search"]["makespan_h"] for r in held]
    out = {"held_out_fleets": len(held),
           "gnn_raw_beats_best_non_learned_raw": int(sum(r["gnn_raw_beats_best_non_learned"]
                                                         for r in held)),
           "gnn_raw_ties_best_non_learned_raw": int(sum(
               abs(r["starts"]["gnn"]["raw_h"] - r["starts"][r["best_non_learned_raw"]]["raw_h"])
               <= 1e-9 * r["starts"]["gnn"]["raw_h"] for r in held)),
           "gnn_decoded_beats_best_non_learned_decoded": int(sum(
               r["starts"]["gnn"]["decoded_h"] < min(r["starts"][k]["decoded_h"]
                                                     for k in NON_LEARNED) * (1 - 1e-9)
               for r in held)),
           "mean_ratio_vs_search": {f"{s}/{k}": float(np.mean(ratio(s, k)))
                                    for s in ("gnn",) + NON_LEARNED
                                    for k in ("raw_h", "refined_h", "decoded_h")},
           "wins_raw": {}, "mean_seconds": {}}
    for r in held:
        best = min(r["starts"], key=lambda k: r["starts"][k]["raw_h"])
        out["wins_raw"][best] = out["wins_raw"].get(best, 0) + 1
    for s in ("gnn",) + NON_LEARNED:
        out["mean_seconds"][s] = {k: float(np.mean([r["starts"][s][k] for r in rows]))
                                  for k in ("raw_s", "refine_s", "decoded_s")}
    out["mean_seconds"]["search"] = float(np.mean([r["search"]["seconds"] for r in rows]))
    out["gnn_pair_accuracy_mean"] = float(np.mean([r["gnn_pair_accuracy"] for r in rows]))
    out["cluster_rule_pair_accuracy_mean"] = float(np.mean([r["cluster_rule_pair_accuracy"]
                                                            for r in rows]))
    out["always_idle_pair_accuracy"] = 0.5
    out["fleets"] = len(rows)
    out["gnn_decoded_is_uniform_decoded"] = int(sum(r["gnn_decoded_is_uniform_decoded"]
                                                    for r in rows))
    out["gnn_decoded_ties_uniform_decoded"] = int(sum(
        abs(r["starts"]["gnn"]["decoded_h"] - r["starts"]["uniform"]["decoded_h"])
        <= 1e-9 * r["starts"]["uniform"]["decoded_h"] for r in rows))
    out["gnn_decoded_beats_uniform_decoded"] = int(sum(
        r["starts"]["gnn"]["decoded_h"] < r["starts"]["uniform"]["decoded_h"] * (1 - 1e-9)
        for r in rows))
    frac = out["gnn_raw_beats_best_non_learned_raw"] / max(len(held), 1)
    out["target_gnn_raw_beats_best_non_learned_on_80pct"] = {"fraction": frac, "met": frac >= 0.8}
    return out


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    starts = ("gnn",) + NON_LEARNED
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)
    x = np.arange(len(rows))
    for ax, kind in zip(axes, ("raw_h", "refined_h")):
        for k, s in enumerate(starts):
            y = [r["starts"][s][kind] / r["search"]["makespan_h"] for r in rows]
            ax.scatter(x + (k - 3) * 0.1, y, s=14 if s != "gnn" else 30,
                       marker="o" if s != "gnn" else "*", label=s)
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set_xticks(x, [r["key"] for r in rows], rotation=90, fontsize=7)
        ax.set_title(f"{kind.split('_')[0]} start: makespan / search's")
        ax.set_yscale("log")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def specs_for(quick: bool) -> list[dict]:
    held = held_out_fleets(20)[:QUICK_FLEETS] if quick else held_out_fleets(20)
    paper = ["paper-4-jobs"] if quick else ["paper-4-jobs", "paper-6-jobs"]
    return (held + [{"key": "azure-25-regions", "seed": 0, "jobs": 8}]
            + [{"key": key} for key in paper])


def warm_up(model) -> None:
    """One untimed start on a small fleet: the imports and first calls are paid here, not by
    whichever start is timed first."""
    from planner.core.fleet import complete
    from planner.core.generate import generate_fleet, generate_jobs

    net = complete(generate_fleet(8, seed=1, n_cities=2))
    run_start("gnn", generate_jobs(2, seed=1, max_params=float(net.mem.sum()) / 48), net, model)


def run(out_dir: Path, shared: Path, quick: bool = False, log=print,
        cached: bool = False) -> dict:
    import torch

    from planner.gnn import checkpoint as ckpt

    torch.set_num_threads(1)
    model = ckpt.load()
    specs = specs_for(quick)
    warm_up(model)
    started = time.perf_counter()
    rows = [fleet_row(spec, Path(shared), model, log, cached) for spec in specs]
    result = {"model": str(model.path), "model_metrics": model.metrics,
              "cost_model": "planner.core.costmodel (docs/COSTMODEL.md)",
              "decoder": "planner.gnn.starts.decode (gnn-raw's decoder) for every start",
              "azure_data": str(AZURE_CSV.relative_to(REPO)),
              "mode": "quick" if quick else "full",
              "timing": ("each start on a freshly built fleet with the per-process memos "
                         "cleared (bench.gnn_ablation_controls.reset_run_caches), after an "
                         "untimed warm-up" + ("; non-learned starts from an earlier run's "
                                              "cache where present" if cached else "")),
              "summary": summarize_rows(rows), "fleets": rows,
              "seconds": round(time.perf_counter() - started, 1),
              "load_average": os.getloadavg()}
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "gnn_ablation.json").write_text(json.dumps(result, indent=2) + "\n")
    plot(rows, out_dir / "gnn_ablation.png")
    return result


def summarize(result: dict) -> str:
    s = result["summary"]
    lines = ["| start | raw / search | refined / search | decoded / search | raw s | refine s "
             "| decoded s |", "|---|---|---|---|---|---|---|"]
    for k in ("gnn",) + NON_LEARNED:
        r, t = s["mean_ratio_vs_search"], s["mean_seconds"][k]
        lines.append(f"| {k} | {r[k + '/raw_h']:.3f} | {r[k + '/refined_h']:.3f} | "
                     f"{r[k + '/decoded_h']:.3f} | {t['raw_s']:.2f} | {t['refine_s']:.2f} | "
                     f"{t['decoded_s']:.2f} |")
    t = s["target_gnn_raw_beats_best_non_learned_on_80pct"]
    lines.append(f"\n`gnn-raw` beats the best non-learned start (raw) on "
                 f"{s['gnn_raw_beats_best_non_learned_raw']}/{s['held_out_fleets']} held-out fleets "
                 f"(target 80%: {'met' if t['met'] else 'NOT met'}); GNN balanced pair accuracy "
                 f"{s['gnn_pair_accuracy_mean']:.3f}, the cluster rule's "
                 f"{s['cluster_rule_pair_accuracy_mean']:.3f} (always-idle 0.5); the GNN's "
                 f"decoded plan is the uniform scores' on {s['gnn_decoded_is_uniform_decoded']}"
                 f"/{s['fleets']} fleets, as long on {s['gnn_decoded_ties_uniform_decoded']} and "
                 f"shorter on {s['gnn_decoded_beats_uniform_decoded']}.")
    return "\n".join(lines) + "\n"


def scale_row(n: int, jobs_count: int = 20, seed: int = 3) -> dict:
    """At ``n`` servers (plan_bench's 5,000-node fleet for n=5000): the search against the GNN's
    start, raw (Algorithm 1 on its scores, and gnn-raw's decoder), wall times and makespans."""
    import torch

    from planner.core.costmodel import estimate_plan
    from planner.core.generate import generate_jobs, generate_network
    from planner.gnn import checkpoint as ckpt
    from planner.gnn.infer import grouping_plan, node_scores
    from planner.gnn.starts import decode
    from planner.search import plan_search

    torch.set_num_threads(1)
    model = ckpt.load()
    net = generate_network(n, seed=seed)
    jobs = generate_jobs(jobs_count, seed=seed)
    out = {"nodes": n, "jobs": len(jobs), "load_average_before": os.getloadavg()}
    t = time.perf_counter()
    plan = plan_search(jobs, net)
    out["search"] = {"seconds": time.perf_counter() - t,
                     "makespan_h": estimate_plan(plan.placements, net).makespan_s / 3600}
    t = time.perf_counter()
    scores = node_scores(jobs, net, model)
    out["gnn_scores_s"] = time.perf_counter() - t
    raw, _ = grouping_plan(jobs, net, scores, method="raw")
    out["gnn_raw_algorithm1"] = {"seconds": time.perf_counter() - t,
                                 "makespan_h": estimate_plan(raw.placements, net).makespan_s / 3600}
    t = time.perf_counter()
    scores = node_scores(jobs, net, model)
    plan, _ = decode(jobs, net, scores)
    out["gnn_raw_decoded"] = {"seconds": time.perf_counter() - t,
                              "makespan_h": estimate_plan(plan.placements, net).makespan_s / 3600}
    from planner.search import heuristic_scores

    t = time.perf_counter()
    raw, _ = grouping_plan(jobs, net, heuristic_scores(jobs, net), method="raw")
    out["heuristic_raw_algorithm1"] = {"seconds": time.perf_counter() - t,
                                       "makespan_h": estimate_plan(raw.placements,
                                                                   net).makespan_s / 3600}
    for k in ("gnn_raw_algorithm1", "gnn_raw_decoded", "heuristic_raw_algorithm1"):
        r = out[k]
        r["makespan_vs_search"] = r["makespan_h"] / out["search"]["makespan_h"]
        r["time_vs_search"] = r["seconds"] / out["search"]["seconds"]
        r["target_within_1_15x_in_a_fifth_of_the_time"] = (r["makespan_vs_search"] <= 1.15
                                                           and r["time_vs_search"] <= 0.2)
    out["load_average_after"] = os.getloadavg()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shared", default=str(REPO / ".." / "shared"))
    parser.add_argument("--out", default=str(REPO / "bench" / "results"))
    parser.add_argument("--quick", action="store_true",
                        help=f"the first {QUICK_FLEETS} held-out fleets, Azure, paper 4 jobs")
    parser.add_argument("--cached", action="store_true",
                        help="reuse an earlier run's non-learned starts (their times too)")
    parser.add_argument("--scale", type=int, default=None,
                        help="only the scale comparison at this many servers "
                             "(writes gnn_ablation_scale.json)")
    args = parser.parse_args()
    if args.scale:
        row = scale_row(args.scale)
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "gnn_ablation_scale.json").write_text(json.dumps(row, indent=2) + "\n")
        print(json.dumps(row, indent=2))
        return
    result = run(Path(args.out), Path(args.shared), quick=args.quick, cached=args.cached)
    print(summarize(result))


if __name__ == "__main__":
    main()

