"""Plan regret of link prediction with the exact search: no search noise in the reference.

    .venv/bin/python -m bench.linkpred_regret_exact --shared ../shared [--quick] [--models M,..]

The regret of bench/linkpred_regret.py (70% of a network's pairs hidden; the makespan, judged on
the true links, of the plan made on the links a model completed, over that of the plan made on
the true links), with every plan made by planner.search.exact instead of the default search, on
cases small enough for it: SITES seeded sites (bench/linkpred_regret.case_network, the same
site choice for the same case seed) of SERVERS_PER_SITE servers each. Every plan is then the
best plan of one space (planner/search/exact.py's docstring: allocations by server class and
phases, each job arranged by the per-job solver), searched from scratch (no incumbent from the
default search) and bounded by solver calls, so the same links always give the same plan.

Per network (bench/linkpred_data.py) and HIDE_SEEDS split (bench/linkpred_splits.hide_splits,
70%): every model of bench/linkpred_bench.bench_models fitted on the measured pairs by
bench/linkpred_bench.evaluate_models (which also gives that split's prediction errors). Per case:
- the reference: the exact plan on the true links;
- per model, its regret (the exact plan on its conservative links, ``rtt_hi_ms`` / ``gbps_lo``)
  and its point regret (on ``rtt_ms`` / ``gbps``), each judged on the true links;
- the floor: exact plans on the true links times seeded log-normal noise of NOISE_SIGMAS
  (every pair, both quantities; NOISE_DRAWS draws), judged the same way;
- per exact search: whether it proved its optimum, else the gap it left.

On the generated networks one more "model", ``oracle``, bounds what any predictor could reach:
per pair the median throughput of bench/linkpred_floor.oracle_log_gbps (every site's draws
known, only the pair's own randomness not) and the TRUE RTT of every pair (which no predictor
has), measured pairs kept as measured, no spread (its conservative and point links are one).
Skyplane's links are measured, with no generator behind them: no oracle there.
``--models`` picks the models (``oracle`` among them); a network with none to run is skipped.

``below_one`` counts model plans judged shorter than a proved reference. The proof covers
allocations and phases; each job's arrangement is the per-job solver's on the links it is given,
so links other than the true ones can lead to an arrangement the true links' solver missed.
Writes bench/results/linkpred_regret_exact.json (with ``--models``,
linkpred_regret_exact_<models>.json, so a partial run leaves the full results alone).
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import re
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from bench.linkpred_bench import (REGRET_JOBS, REGRET_SHARE, bench_models, datasets,
                                  evaluate_models)
from bench.linkpred_data import Dataset, GeneratedTruth, generated_truth
from bench.linkpred_floor import oracle_log_gbps
from bench.linkpred_regret import case_network, symmetric_noise
from bench.linkpred_splits import hide_splits
from hulk.errors import InputError
from planner.linkpred.controls_base import assemble
from planner.linkpred.graph import LinkModel, LinkPrediction, SiteGraph

REPO = Path(__file__).resolve().parents[1]
SITES = 6                   # 6 sites x 2 servers: 12 servers, 6 server classes (3^6 vectors)
SERVERS_PER_SITE = 2
HIDDEN = REGRET_SHARE
HIDE_SEEDS = (0, 1)
CASE_SEEDS = (5, 1, 2, 3, 4)        # 5, 1, 2 first: the site choice of bench/linkpred_regret.py
JOBS = REGRET_JOBS
NOISE_SIGMAS = (0.01, 0.05)
NOISE_DRAWS = 2
# --quick: the quick networks of bench/linkpred_bench, three small models, one small job
QUICK = {"sites": 3, "jobs": ("t5-11b",), "hide_seeds": (0,), "case_seeds": (5, 1),
         "noise_draws": 1, "models": ("formula", "provider median", "distance")}
REL = 1e-9
TARGET_REGRET = 1.02    # issue 30's target: every case's regret at most this
ORACLE = "oracle"
ORACLE_DRAWS = 400      # Monte Carlo samples per pair: bench/linkpred_floor's default
NO_ORACLE = "none: measured links, no generator whose draws an oracle could know"


@dataclass(frozen=True)
class OracleLinks:
    """The generated network's oracle as a link model (module docstring): the same links
    whatever was measured, except that measured pairs keep their measured figures."""

    truth: GeneratedTruth
    log_gbps: np.ndarray        # per pair of ``truth.graph``: the oracle's median ln(Gbit/s)
    name: str = ORACLE

    def fit(self, graph: SiteGraph, seed: int = 0) -> "OracleLinks":
        if graph.sites != self.truth.graph.sites:
            raise ValueError("the oracle knows one generated network's sites, not these")
        return self

    def predict(self, graph: SiteGraph) -> LinkPrediction:
        full = self.truth.graph
        rtt = _square(full, full.rtt_ms)
        gbps = _square(full, np.exp(self.log_gbps))
        return assemble(self.name, graph, rtt, rtt, gbps, gbps)


def _square(graph: SiteGraph, values: np.ndarray) -> np.ndarray:
    out = np.full((graph.n_sites,) * 2, np.nan)
    out[graph.i, graph.j] = out[graph.j, graph.i] = values
    return out


def oracle_for(dataset: Dataset, draws: int = ORACLE_DRAWS) -> OracleLinks | None:
    """The oracle of a generated network (bench/linkpred_data.generated_dataset's name tells its
    sites and seed; the regenerated truth must equal the dataset's), else None."""
    named = re.fullmatch(r"generated-(\d+)-s(\d+)", dataset.name)
    if named is None:
        return None
    truth = generated_truth(int(named[1]), int(named[2]))
    g, d = truth.graph, dataset.truth
    if not (g.sites == d.sites and np.array_equal(g.i, d.i) and np.array_equal(g.j, d.j)
            and np.array_equal(g.rtt_ms, d.rtt_ms) and np.array_equal(g.gbps, d.gbps)):
        return None
    return OracleLinks(truth, oracle_log_gbps(truth, draws))


def network_models(dataset: Dataset, models: Mapping[str, LinkModel],
                   oracle: bool) -> dict[str, LinkModel]:
    """``models``, and the oracle where asked for and the network has one."""
    found = oracle_for(dataset) if oracle else None
    return {**models, ORACLE: found} if found is not None else dict(models)


def load_case_jobs(shared: Path, names) -> list:
    from bench.skyplane_bench import JOBS as JOB_FILE
    from planner.files.jobs import load_jobs

    jobs = [j for j in load_jobs(Path(shared) / JOB_FILE) if j.name in names]
    if len(jobs) != len(names):
        raise InputError(f"{Path(shared) / JOB_FILE}: jobs: expected {', '.join(names)}")
    return jobs


class Case:
    """One plan case of a network: its true fleet and the exact search on any links of it."""

    def __init__(self, dataset: Dataset, jobs: list, case_seed: int, sites: int,
                 evaluations: int):
        self.network = case_network(dataset, sites, case_seed,
                                    (SERVERS_PER_SITE, SERVERS_PER_SITE + 1))
        self.jobs, self.case_seed, self.evaluations = jobs, case_seed, evaluations
        self.truth = self.network.fleet(self.network.true_rtt, self.network.true_bw)

    def solve(self, rtt: np.ndarray, bw: np.ndarray) -> dict:
        """The exact plan on these links, its makespan believed (on them) and judged (on the
        true links), and whether the search proved it optimal."""
        from planner.core.costmodel import estimate_plan
        from planner.search import exact

        result = exact.solve_exact(self.jobs, self.network.fleet(rtt, bw),
                                   evaluations=self.evaluations)
        if result is None or result.placements is None:
            return {"judged_makespan_s": None, "proved": False, "gap": None,
                    "error": "no plan (a job fits nowhere or the budget found none)"}
        return {"judged_makespan_s": estimate_plan(result.placements, self.truth).makespan_s,
                "believed_makespan_s": result.makespan_s, "proved": result.proved,
                "gap": None if result.proved else round(result.gap, 6),
                "evaluations": result.evaluations}

    def reference_and_floor(self, noise_draws: int) -> dict:
        true_rtt, true_bw = self.network.true_rtt, self.network.true_bw
        reference = self.solve(true_rtt, true_bw)
        floor = {}
        for sigma in NOISE_SIGMAS:
            draws = []
            for draw in range(noise_draws):
                rng = np.random.default_rng([self.case_seed, int(sigma * 1000), draw])
                rtt_f, bw_f = (symmetric_noise(rng, sigma, true_rtt.shape) for _ in range(2))
                draws.append(self.solve(true_rtt * rtt_f, true_bw * bw_f))
            floor[f"noise {sigma:.0%}"] = draws
        return {"case_seed": self.case_seed, "sites": self.network.sites,
                "servers": len(self.network.nodes), "reference": reference, "floor": floor}

    def model_plans(self, prediction: LinkPrediction) -> dict:
        conservative = self.solve(prediction.rtt_hi_ms, prediction.gbps_lo)
        # The exact search gives one plan per links: no spread, no second search.
        same = (np.array_equal(prediction.rtt_hi_ms, prediction.rtt_ms, equal_nan=True)
                and np.array_equal(prediction.gbps_lo, prediction.gbps, equal_nan=True))
        return {"conservative": conservative,
                "point": {**conservative, "same_links_as": "conservative"} if same
                else self.solve(prediction.rtt_ms, prediction.gbps)}


def regret(solved: dict, reference: dict) -> float | None:
    judged, best = solved.get("judged_makespan_s"), reference.get("judged_makespan_s")
    if judged is None or not best or not math.isfinite(judged):
        return None
    return round(judged / best, 6)


def network_regret(dataset: Dataset, models: Mapping[str, LinkModel], jobs: list, *,
                   sites: int, hide_seeds, case_seeds, noise_draws: int, evaluations: int,
                   advance: Callable[[str], None]) -> dict:
    """Every case's reference and floor, every split's fitted models and their plans, and per
    model the worst and mean regret over splits x cases."""
    cases = [Case(dataset, jobs, seed, sites, evaluations) for seed in case_seeds]
    case_rows = []
    for case in cases:
        advance(f"{dataset.name}: case {case.case_seed}: reference and floor")
        row = case.reference_and_floor(noise_draws)
        for key, draws in row["floor"].items():
            for d in draws:
                d["regret"] = regret(d, row["reference"])
        case_rows.append(row)
    splits = []
    for split in hide_splits(dataset.truth, hide_seeds, (HIDDEN,)):
        fitted, kept = evaluate_models(dataset, [split], models, lambda _: None,
                                       keep_seed=split.seed)
        row = {"seed": split.seed, "measured": int(split.keep.sum()),
               "errors": fitted[0]["models"], "cases": []}
        for case, ref in zip(cases, case_rows):
            per_model = {}
            for name, prediction in kept["regret_predictions"].items():
                advance(f"{dataset.name}: split {split.seed}, case {case.case_seed}: {name}")
                plans = case.model_plans(prediction)
                for plan in plans.values():
                    plan["regret"] = regret(plan, ref["reference"])
                per_model[name] = plans
            row["cases"].append({"case_seed": case.case_seed, "models": per_model})
        splits.append(row)
    return {"cases": case_rows, "splits": splits,
            "models": summarize_models(models, splits, case_rows),
            "floor": summarize_floor(case_rows), "proved": proved_share(case_rows, splits)}


def _spread(values: list) -> dict:
    known = [v for v in values if v is not None]
    return {"worst": max(known) if known else None,
            "mean": round(sum(known) / len(known), 6) if known else None,
            "plans": len(values), "missing": len(values) - len(known),
            "above_target": sum(1 for v in known if v > TARGET_REGRET + REL)}


def summarize_models(models, splits: list[dict], case_rows: list[dict]) -> dict:
    proved_ref = {c["case_seed"]: c["reference"]["proved"] for c in case_rows}
    out = {}
    for name in models:
        entry = {}
        for kind in ("conservative", "point"):
            plans = [(c["case_seed"], c["models"][name][kind]) for s in splits
                     for c in s["cases"] if name in c["models"]]
            values = [p["regret"] for _, p in plans]
            entry[kind] = {**_spread(values),
                           "proved": sum(p["proved"] for _, p in plans),
                           "below_one": sum(1 for seed, p in plans if proved_ref[seed]
                                            and p["regret"] is not None
                                            and p["regret"] < 1 - REL)}
        out[name] = entry
    return out


def summarize_floor(case_rows: list[dict]) -> dict:
    keys = case_rows[0]["floor"] if case_rows else {}
    return {key: _spread([d["regret"] for c in case_rows for d in c["floor"][key]])
            for key in keys}


def proved_share(case_rows: list[dict], splits: list[dict]) -> dict:
    searches = [c["reference"] for c in case_rows]
    searches += [d for c in case_rows for draws in c["floor"].values() for d in draws]
    searches += [p for s in splits for c in s["cases"] for plans in c["models"].values()
                 for p in plans.values() if "same_links_as" not in p]
    gaps = [s["gap"] for s in searches if not s["proved"] and s.get("gap") is not None]
    return {"searches": len(searches), "proved": sum(s["proved"] for s in searches),
            "references_proved": sum(c["reference"]["proved"] for c in case_rows),
            "references": len(case_rows), "largest_gap": max(gaps, default=0.0)}


# ------------------------------------------------------------------------------ run, report

def run(out_dir: Path, shared: Path, quick: bool = False,
        advance: Callable[[str], None] = lambda _: None, log=print,
        models: Mapping[str, LinkModel] | None = None, oracle: bool = True,
        selection: str | None = None) -> dict:
    """``selection``: the ``--models`` given, if any (it names the output file and the
    command); ``models`` and ``oracle`` say what runs."""
    from planner.search import exact

    started = time.perf_counter()
    models = bench_models() if models is None else dict(models)
    if quick:
        models = {k: v for k, v in models.items() if k in QUICK["models"]}
    setting = ({"sites": QUICK["sites"], "hide_seeds": QUICK["hide_seeds"],
                "case_seeds": QUICK["case_seeds"], "noise_draws": QUICK["noise_draws"]}
               if quick else {"sites": SITES, "hide_seeds": HIDE_SEEDS,
                              "case_seeds": CASE_SEEDS, "noise_draws": NOISE_DRAWS})
    job_names = QUICK["jobs"] if quick else JOBS
    jobs = load_case_jobs(shared, job_names)
    doc = {"benchmark": "linkpred_regret_exact",
           "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
           "command": "python -m bench.linkpred_regret_exact --shared ../shared"
                      + (" --quick" if quick else "")
                      + (f" --models {selection}" if selection else ""),
           "quick": quick, "python": platform.python_version(), "models": list(models),
           "oracle": ({"draws": ORACLE_DRAWS, "links": "true RTT of every pair; throughput the "
                       "median of bench/linkpred_floor.oracle_log_gbps; measured pairs as "
                       "measured; conservative = point", "where": "generated networks only"}
                      if oracle else None),
           "target_regret": TARGET_REGRET,
           "jobs": list(job_names), "hidden": HIDDEN, "servers_per_site": SERVERS_PER_SITE,
           **{k: list(v) if isinstance(v, tuple) else v for k, v in setting.items()},
           "noise_sigmas": list(NOISE_SIGMAS), "evaluations": exact.EVALUATIONS,
           "regret": "exact plan's makespan judged on the true links / the exact plan's on the "
                     "true links (planner.core.costmodel.estimate_plan)",
           "datasets": {}}
    name = _file_name(selection)
    for dataset in datasets(shared, quick):
        here = network_models(dataset, models, oracle)
        note = {"oracle": ORACLE in here} if ORACLE in here or not oracle \
            else {"oracle": NO_ORACLE}
        if not here:
            doc["datasets"][dataset.name] = {"sites": dataset.truth.n_sites, **note,
                                             "skipped": "no model to run on this network"}
            continue
        result = network_regret(dataset, here, jobs, evaluations=exact.EVALUATIONS,
                                advance=advance, **setting)
        doc["datasets"][dataset.name] = {"sites": dataset.truth.n_sites, **note, **result}
        worst = {m: r["conservative"]["worst"] for m, r in result["models"].items()}
        log(f"{dataset.name}: worst regret " + ", ".join(f"{m} {v}" for m, v in worst.items()))
        # Each network's figures are kept as soon as they are known: a long run cut short
        # leaves the networks it finished (``complete`` says whether all of them are there).
        _write(out_dir, name, {**doc, "complete": False,
                               "seconds": round(time.perf_counter() - started, 1)})
    doc.update(complete=True, seconds=round(time.perf_counter() - started, 1))
    _write(out_dir, name, doc)
    return doc


def _file_name(selection: str | None) -> str:
    if not selection:
        return "linkpred_regret_exact.json"
    return "linkpred_regret_exact_" + re.sub(r"[^a-z0-9]+", "_", selection.lower()) + ".json"


def _write(out_dir: Path, name: str, doc: dict) -> None:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / name).write_text(json.dumps(doc, indent=2) + "\n")


def steps(shared: Path, quick: bool, models: int, oracle: bool = True) -> int:
    """How many progress steps run() reports (the bar's total)."""
    n_cases = len(QUICK["case_seeds"] if quick else CASE_SEEDS)
    n_splits = len(QUICK["hide_seeds"] if quick else HIDE_SEEDS)
    per_network = [models + (oracle and d.name.startswith("generated-"))
                   for d in datasets(shared, quick)]
    return sum(n_cases * (1 + n_splits * n) for n in per_network if n)


def choose_models(selection: str, available: Mapping[str, LinkModel]
                  ) -> tuple[dict[str, LinkModel], bool]:
    """``--models a,b,oracle``: those models, and whether the oracle runs."""
    names = [n.strip() for n in selection.split(",") if n.strip()]
    known = [*available, ORACLE]
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        raise InputError(f"--models: expected names among {', '.join(known)}, "
                         f"got {selection!r}")
    return {n: available[n] for n in names if n != ORACLE}, ORACLE in names


def table(doc: dict):
    """A rich table: per network and model the worst / mean regret (conservative, point)."""
    from rich.table import Table

    t = Table(title="plan regret at 70% hidden, exact search (worst / mean)")
    above = f"above {doc.get('target_regret', TARGET_REGRET)}"
    for col in ("network", "model", "regret", "point regret", "proved plans", "below 1", above):
        t.add_column(col)
    for name, d in doc["datasets"].items():
        if "skipped" in d:
            t.add_row(name, f"skipped: {d['skipped']}", "", "", "", "", "", end_section=True)
            continue
        for model, r in d["models"].items():
            c, p = r["conservative"], r["point"]
            t.add_row(name, model, _pair(c), _pair(p),
                      f"{c['proved'] + p['proved']}/{c['plans'] + p['plans']}",
                      str(c["below_one"] + p["below_one"]),
                      f"{c.get('above_target', '-')}/{c['plans']}")
        for key, f in d["floor"].items():
            t.add_row(name, f"floor: {key}", _pair(f), "", "", "",
                      f"{f.get('above_target', '-')}/{f['plans']}")
        pr = d["proved"]
        t.add_row(name, "all searches", "", "", f"{pr['proved']}/{pr['searches']}", "", "",
                  end_section=True)
    return t


def _pair(r: dict) -> str:
    return "-" if r["worst"] is None else f"{r['worst']:.4f} / {r['mean']:.4f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.linkpred_regret_exact",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--shared", type=Path, default=REPO / ".." / "shared")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    parser.add_argument("--quick", action="store_true",
                        help="the quick networks, three models, 3 sites, one small job")
    parser.add_argument("--models", metavar="M,..",
                        help="comma-separated models to run (the benchmark's, or 'oracle'); "
                             "default: all of them and the oracle")
    args = parser.parse_args(argv)
    from rich.console import Console
    from rich.progress import Progress
    from threadpoolctl import threadpool_limits

    try:
        models, oracle = bench_models(), True
        if args.models is not None:
            models, oracle = choose_models(args.models, models)
        with Progress(transient=True) as progress, threadpool_limits(1):
            count = len([m for m in models if not args.quick or m in QUICK["models"]])
            task = progress.add_task("exact regret",
                                     total=steps(args.shared, args.quick, count, oracle))

            def advance(what: str) -> None:
                progress.update(task, advance=1, description=what[:60])

            doc = run(args.out, args.shared, args.quick, advance=advance,
                      log=progress.console.print, models=models, oracle=oracle,
                      selection=args.models)
    except InputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    Console().print(table(doc))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
