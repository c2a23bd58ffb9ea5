"""Link-prediction benchmark: every model of planner.linkpred.models (the six controls and the
GNN when it is there) fitted on the same measured pairs, judged on the pairs hidden from it.

    .venv/bin/python -m bench.linkpred_bench --shared ../shared [--quick]

Networks (bench/linkpred_data.py): Skyplane's measured cloud regions and generated fleets of
100-200 sites with a ground truth that is none of the models. Splits and figures
(bench/linkpred_splits.py): 20/50/70% of pairs hidden (seeds 0-4), cold regions with 1, 3 or 5
measured pairs, a provider pair with none; p50/p90 of |ln(predicted / true)| for throughput and
RTT, the share of optimistic conservative figures; and plan regret with 70% hidden
(bench/linkpred_regret.py): the makespan, judged on the true links, of the plan made on the links
each model completed (its conservative figures where it predicted), over that of the plan made on
the true links, on several seeded plan cases (worst and mean; the target is judged on the worst),
beside the regret of its point figures and the floor: the true links planned by a wider search
(below 1 where the reference missed a better plan) or with small seeded noise on every link.

Writes bench/results/linkpred.json and bench/results/linkpred.png.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from collections.abc import Callable, Mapping
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from bench.linkpred_data import Dataset, generated_dataset, skyplane_dataset
from bench.linkpred_regret import CASE_SEEDS, regret_cases
from bench.linkpred_splits import (Split, cold_provider_splits, cold_region_splits, figures,
                                   hide_splits, judge)
from hulk.errors import InputError
from planner.linkpred.graph import LinkModel

REPO = Path(__file__).resolve().parents[1]
GENERATED = ((100, 0), (150, 1), (200, 2))          # (sites, seed) of the generated fleets
HIDE_SEEDS = range(5)
COLD_SEEDS = range(3)
REGRET_SHARE = 0.7
REGRET_SITES = 10
REGRET_JOBS = ("opt-175b", "t5-11b")
# --quick: one small job, one start, half a second of search, two cases (a check that it runs)
QUICK_REGRET = {"sites": 3, "jobs": ("bert-large",), "setting": {"starts": 1, "budget_s": 0.5},
                "cases": CASE_SEEDS[:2]}
KINDS = ("hide 20%", "hide 50%", "hide 70%", "cold region 1", "cold region 3", "cold region 5",
         "cold provider pair")
GRAPH_MODELS = ("gnn",)     # the rest are the non-graph controls the targets compare with
VS_CONTROL = 0.9            # the targets: p90 at least 10% below the best non-graph control


def bench_models() -> dict[str, LinkModel]:
    """The registry's models, and the GNN when planner/linkpred/gnn.py has one the registry
    does not list yet."""
    from planner.linkpred.models import MODELS

    models = dict(MODELS)
    if "gnn" not in models:
        try:
            from planner.linkpred.gnn import GnnLinkModel
        except ImportError:
            pass
        else:
            models["gnn"] = GnnLinkModel()
    return models


def datasets(shared: Path, quick: bool) -> list[Dataset]:
    if quick:
        return [skyplane_dataset(shared, regions=10), generated_dataset(24, 0)]
    return [skyplane_dataset(shared)] + [generated_dataset(s, seed) for s, seed in GENERATED]


def splits_for(dataset: Dataset, quick: bool) -> list[Split]:
    graph = dataset.truth
    if quick:
        return (hide_splits(graph, (0,), (0.5, 0.7)) + cold_region_splits(graph, (0,), (3,))
                + cold_provider_splits(graph)[:1])
    return (hide_splits(graph, HIDE_SEEDS) + cold_region_splits(graph, COLD_SEEDS)
            + cold_provider_splits(graph))


def evaluate_models(dataset: Dataset, splits: list[Split], models: Mapping[str, LinkModel],
                    advance: Callable[[str], None],
                    keep_seed: int = 0) -> tuple[list[dict], dict]:
    """Every model on every split: per-split figures, pooled figures per split kind, and the
    predictions of the REGRET_SHARE split of ``keep_seed`` (for the plans)."""
    rows, pooled, kept = [], {}, {}
    for split in splits:
        train = dataset.truth.masked(split.keep)
        row = {"kind": split.kind, "seed": split.seed, "detail": split.detail,
               "measured": int(split.keep.sum()), "judged": int(split.judge.sum()),
               "models": {}}
        for name, model in models.items():
            advance(f"{dataset.name}: {split.kind} seed {split.seed}: {name}")
            started = time.perf_counter()
            try:
                prediction = model.fit(train, seed=split.seed).predict(train)
            except Exception as exc:        # a model that fails is reported, not fatal
                row["models"][name] = {"error": f"{type(exc).__name__}: {exc}"}
                continue
            seconds = time.perf_counter() - started
            judged = judge(prediction, dataset.truth, split.judge)
            row["models"][name] = {**figures([judged]), "fit_predict_s": round(seconds, 3)}
            pooled.setdefault(split.kind, {}).setdefault(name, []).append(judged)
            if split.kind == f"hide {REGRET_SHARE:.0%}" and split.seed == keep_seed:
                kept[name] = prediction
        rows.append(row)
    summary = {kind: {name: figures(js) for name, js in by_model.items()}
               for kind, by_model in pooled.items()}
    return rows, {"summary": summary, "regret_predictions": kept}


# ------------------------------------------------------------------------------ run, report

def run(out_dir: Path, shared: Path, quick: bool = False, log=print,
        advance: Callable[[str], None] = lambda _: None,
        models: Mapping[str, LinkModel] | None = None) -> dict:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    models = dict(models or bench_models())
    doc = {"benchmark": "linkpred",
           "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
           "command": "python -m bench.linkpred_bench --shared ../shared"
                      + (" --quick" if quick else ""),
           "quick": quick, "python": platform.python_version(), "models": list(models),
           "error": "|ln(predicted / true)| per judged pair (point figures); optimistic: the "
                    "conservative figure (throughput 0.2 quantile, RTT 0.8 quantile) on the "
                    "wrong side of the truth; 'optimistic' pools both quantities",
           "datasets": {}}
    for dataset in datasets(shared, quick):
        splits = splits_for(dataset, quick)
        rows, pooled = evaluate_models(dataset, splits, models, advance)
        regret = (regret_cases(dataset, pooled["regret_predictions"], shared,
                               QUICK_REGRET["sites"], QUICK_REGRET["jobs"], QUICK_REGRET["setting"],
                               QUICK_REGRET["cases"])
                  if quick else regret_cases(dataset, pooled["regret_predictions"], shared,
                                             REGRET_SITES, REGRET_JOBS))
        doc["datasets"][dataset.name] = {
            "note": dataset.note, "sites": dataset.truth.n_sites,
            "pairs": int(len(dataset.truth.i)), "splits": rows, "summary": pooled["summary"],
            "regret_70": regret}
        log(f"{dataset.name}: {len(splits)} splits; p90 throughput error at 50% hidden: "
            + ", ".join(f"{m} {f['gbps_p90']}" for m, f in
                        pooled["summary"].get("hide 50%", {}).items()))
    doc["targets"] = targets(doc)
    doc["seconds"] = round(time.perf_counter() - started, 1)
    (out_dir / "linkpred.json").write_text(json.dumps(doc, indent=2) + "\n")
    plot(doc, out_dir / "linkpred.png")
    return doc


def best_control(summary: dict, kind: str, key: str = "gbps_p90") -> tuple[str, float] | None:
    """The non-graph control (not the formula) with the lowest ``key`` in ``kind``'s splits of a
    network's pooled ``summary``, and that figure."""
    scores = {m: f[key] for m, f in summary.get(kind, {}).items()
              if m not in GRAPH_MODELS and m != "formula" and f.get(key) is not None}
    return min(scores.items(), key=lambda kv: kv[1]) if scores else None


def targets(doc: dict) -> dict:
    """The issue's targets per network, for every model that is not the formula."""
    out = {}
    for name, d in doc["datasets"].items():
        s = d["summary"]
        half, cold = s.get("hide 50%", {}), s.get("cold region 3", {})
        formula = half.get("formula", {})
        best_half, best_cold = best_control(s, "hide 50%"), best_control(s, "cold region 3")
        rows = {}
        for model, f in half.items():
            if model == "formula" or f.get("gbps_p90") is None:
                continue
            row = {"p90_vs_formula": _ratio(f["gbps_p90"], formula.get("gbps_p90")),
                   "p90_vs_best_control": _ratio(f["gbps_p90"], best_half and best_half[1]),
                   "cold3_p90_vs_best_control": _ratio(cold.get(model, {}).get("gbps_p90"),
                                                       best_cold and best_cold[1]),
                   "optimistic": f.get("optimistic"),
                   "formula_optimistic": formula.get("optimistic"),
                   "regret_70": d["regret_70"]["models"].get(model, {}).get("regret"),
                   "regret_70_mean": d["regret_70"]["models"].get(model, {}).get("regret_mean")}
            row["met"] = {
                "p90 at 50% hidden >= 60% below the formula":
                    row["p90_vs_formula"] is not None and row["p90_vs_formula"] <= 0.4,
                "p90 at 50% hidden >= 10% below the best non-graph control":
                    row["p90_vs_best_control"] is not None and row["p90_vs_best_control"] <= VS_CONTROL,
                "cold region (3 pairs) p90 >= 10% below the best non-graph control":
                    row["cold3_p90_vs_best_control"] is not None
                    and row["cold3_p90_vs_best_control"] <= VS_CONTROL,
                "optimistic no more often than the formula":
                    row["optimistic"] is not None and row["formula_optimistic"] is not None
                    and row["optimistic"] <= row["formula_optimistic"],
                "plan regret at 70% hidden <= 1.02":
                    row["regret_70"] is not None and row["regret_70"] <= 1.02}
            rows[model] = row
        out[name] = {"best_control_50": best_half, "best_control_cold3": best_cold,
                     "models": rows}
    return out


def _ratio(a, b) -> float | None:
    return round(a / b, 4) if a is not None and b else None


def plot(doc: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(doc["datasets"])
    fig, axes = plt.subplots(len(names), 1, figsize=(12, 3.2 * len(names)), squeeze=False)
    models = doc["models"]
    for ax, name in zip(axes[:, 0], names):
        summary = doc["datasets"][name]["summary"]
        kinds = [k for k in KINDS if k in summary]
        width = 0.8 / max(1, len(models))
        for m, model in enumerate(models):
            y = [summary[k].get(model, {}).get("gbps_p90") or np.nan for k in kinds]
            ax.bar(np.arange(len(kinds)) + (m - (len(models) - 1) / 2) * width, y, width,
                   label=model)
        ax.set_yscale("log")
        ax.set_xticks(np.arange(len(kinds)), kinds, fontsize=8)
        ax.set_ylabel("p90 |ln(pred / true)|\nthroughput")
        ax.set_title(f"{name}: {doc['datasets'][name]['sites']} sites", fontsize=9)
        ax.legend(fontsize=7, ncol=len(models))
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def summarize(doc: dict) -> str:
    """Markdown: p90 / p50 throughput error per model and split kind, per network; regret."""
    lines = []
    for name, d in doc["datasets"].items():
        s = d["summary"]
        kinds = [k for k in KINDS if k in s]
        lines += [f"{name} ({d['sites']} sites, {d['pairs']} pairs): throughput p50 / p90 of "
                  "|ln(pred/true)|, optimistic share (both quantities) at 50% hidden, "
                  "plan regret at 70% hidden (worst / mean of the plan cases; conservative "
                  "figures, then point figures)", "",
                  "| model | " + " | ".join(kinds) + " | RTT p90 50% | optimistic 50% | "
                  "regret | point regret |", "|---|" + "---|" * (len(kinds) + 4)]
        for model in doc["models"]:
            cells = [_pair(s[k].get(model)) for k in kinds]
            half = s.get("hide 50%", {}).get(model, {})
            r = d["regret_70"]["models"].get(model, {})
            lines.append(f"| {model} | " + " | ".join(cells)
                         + f" | {_num(half.get('rtt_p90'))} | {_num(half.get('optimistic'))} | "
                         + f"{_spread(r, '')} | {_spread(r, 'point_')} |")
        floor = d["regret_70"].get("floor", {})
        lines += ["", "floor (the true links planned otherwise, worst / mean): "
                  + ", ".join(f"{k} {_spread(f, '')}" for k, f in floor.items()), ""]
    return "\n".join(lines)


def _pair(f: dict | None) -> str:
    if not f or f.get("gbps_p90") is None:
        return "-"
    return f"{f['gbps_p50']:.2f} / {f['gbps_p90']:.2f}"


def _spread(r: dict, prefix: str) -> str:
    worst, mean = r.get(f"{prefix}regret"), r.get(f"{prefix}regret_mean")
    return "-" if worst is None else f"{worst:.3f} / {mean:.3f}"


def _num(x) -> str:
    return "-" if x is None else f"{x:.2f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.linkpred_bench",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--shared", type=Path, default=REPO / ".." / "shared")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    parser.add_argument("--quick", action="store_true",
                        help="10 Skyplane regions and one generated fleet of 24 sites, a few "
                             "splits, one small plan: a check that it runs, not figures")
    args = parser.parse_args(argv)
    from rich.progress import Progress
    from threadpoolctl import threadpool_limits

    models = bench_models()
    try:
        with Progress(transient=True) as progress, threadpool_limits(1):
            total = sum(len(splits_for(d, args.quick)) for d in datasets(args.shared, args.quick))
            task = progress.add_task("link prediction", total=total * len(models))

            def advance(what: str) -> None:
                progress.update(task, advance=1, description=what[:60])

            doc = run(args.out, args.shared, args.quick, log=progress.console.print,
                      advance=advance, models=models)
    except InputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(summarize(doc))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
