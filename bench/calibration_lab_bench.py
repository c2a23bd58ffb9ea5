"""Does the cost model hold in reality? Real training in a heterogeneous WAN lab, placement by
placement: measured iteration time against the reference model's estimate and the calibrated
model's, the calibration fitted on the other placements of the same lab (leave one out).

    python -m bench.calibration_lab_bench [--quick]      (root: it builds network namespaces)

Two lab topologies of 6-7 hosts in three sites each. Hosts differ in compute: every process a
host runs is held to its CPU quota (cgroup v1, lab/netns.py), and the quotas of all hosts sum to
under 1.5 cores, so a placement's compute is set by the quotas, not by contention on a 2-core
machine. Links differ in delay and rate (the lab switch's serialisation queue). The planner sees
the lab as a fleet: a host is a node whose "GPU model" names its quota class, with the reference
throughput ``cores x NOMINAL_FLOPS_PER_CORE`` (a nominal figure, never fitted); RTTs are the
configured ones; bandwidth is measured with the agent's throughput engine between one pair of
hosts of every directed site pair (lab/bandwidth.py) and wins over the formula, as in serve.

The job is examples/train_gpt.py (4 blocks of width 128, 64-token sequences, global batch 16);
node memory holds at most two blocks, so every placement is a pipeline. Per topology, in the
order a user meets them: first Hulk's plan with the reference model (the default method), the
DT-FM-style peer, System B and seeded random valid placements, each run for real (lab/train.py:
one process per node in its host, the median over steps of the slowest node's step); then the
calibration fitted on those runs (what serve would hold after them) is applied to the planning
network, Hulk plans again on it, and that plan is run too. Every placement's calibrated estimate
is leave-one-out. Reported per topology: median and largest absolute relative error of both
models, Kendall's tau of each model's estimates against the measurements, and each Hulk plan's
measured speed-up over each baseline against the speed-up its model predicted.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from bench.lab_bench import example_params
from lab import bandwidth as lab_bandwidth
from lab.matrix import Host, LatencyMatrix
from lab.netns import LabError, require_root
from lab.train import run_placement
from lab.wan import WanLab
from planner.core.calibration import Observation, fit
from planner.core.costmodel import Placement, Stage, estimate, micro_batches, problems
from planner.core.fleet import GBIT, Network, Node
from planner.core.jobs import Job

REPO = Path(__file__).resolve().parents[1]
LAYERS, DIM, SEQ_LEN, GLOBAL_BATCH, MICRO_BATCH = 4, 128, 64, 16, 2
# A core's fp32 FMA peak (about 40 GFLOP/s with AVX2) times the catalog's 0.4: the reference
# model's a-priori figure for one lab core. The calibration is what corrects it.
NOMINAL_FLOPS_PER_CORE = 16e9
INTRA_SITE = (1.0, 400.0)   # RTT ms, Mbit/s between two hosts of one site
BASELINES = ("dtfm", "system-b")
HULK_REF, HULK_CAL = "hulk-reference", "hulk-calibrated"


@dataclass(frozen=True)
class Site:
    name: str
    hosts: int
    cores: float   # CPU quota of each of its hosts


@dataclass(frozen=True)
class Topology:
    name: str
    sites: tuple[Site, ...]
    # (a, b) -> (RTT ms, a->b Mbit/s); b->a the same unless given too
    links: dict[tuple[str, str], tuple[float, float]]

    def hosts(self) -> list[tuple[str, Site]]:
        return [(f"{s.name}-{k + 1}", s) for s in self.sites for k in range(s.hosts)]

    def link(self, a: Site, b: Site) -> tuple[float, float]:
        if a.name == b.name:
            return INTRA_SITE
        return self.links.get((a.name, b.name)) or self.links[(b.name, a.name)]

    def matrix(self) -> LatencyMatrix:
        hosts = self.hosts()
        rtt = tuple(tuple(0.0 if i == j else self.link(a, b)[0] for j, (_, b) in enumerate(hosts))
                    for i, (_, a) in enumerate(hosts))
        return LatencyMatrix(tuple(Host(name, None) for name, _ in hosts), rtt)

    def rates(self) -> dict[tuple[str, str], float]:
        hosts = self.hosts()
        return {(x, y): self.link(a, b)[1] for x, a in hosts for y, b in hosts if x != y}

    def path_mtu(self, size: int | None) -> dict[tuple[str, str], int]:
        """Every pair of hosts in two different sites given a path MTU of ``size`` bytes (None:
        none, every pair keeps the lab's MTU)."""
        hosts = self.hosts()
        return {} if size is None else {(x, y): size for x, a in hosts for y, b in hosts
                                        if a.name != b.name}


TOPOLOGIES = (
    # A fast site near a middling one, a slow site far from the fast one.
    Topology("three-tiers", (Site("fast", 2, 0.35), Site("mid", 2, 0.2), Site("slow", 2, 0.15)),
             {("fast", "mid"): (8.0, 100.0), ("fast", "slow"): (30.0, 20.0),
              ("slow", "fast"): (30.0, 20.0), ("mid", "slow"): (16.0, 50.0)}),
    # Many slow hosts on good links, the fastest hosts behind a slow, asymmetric far link.
    Topology("far-fast", (Site("many", 3, 0.15), Site("far", 2, 0.3), Site("near", 2, 0.2)),
             {("many", "far"): (40.0, 10.0), ("far", "many"): (40.0, 30.0),
              ("many", "near"): (4.0, 200.0), ("far", "near"): (24.0, 25.0)}),
)


def the_job(steps: int) -> Job:
    return Job(name="train-gpt", params=example_params(LAYERS, DIM, seq_len=SEQ_LEN), layers=LAYERS,
               hidden=DIM, seq_len=SEQ_LEN, global_batch=GLOBAL_BATCH, micro_batch=MICRO_BATCH,
               steps=steps)


def quota_class(cores: float) -> str:
    return f"lab-cpu-{round(cores * 100)}"


def node_memory_gb(job: Job) -> float:
    """Room for two of the four blocks (with activations), not three: every plan is a pipeline."""
    return 0.6 * job.state_bytes / 1e9


def lab_network(topo: Topology, job: Job, gbps: dict[tuple[str, str], float]) -> Network:
    """The lab as the planner sees it: configured RTTs, measured site-pair bandwidth, nominal
    throughput per quota class."""
    hosts = topo.hosts()
    nodes = [Node(id=name, site=site.name, gpus=1, gpu_name=quota_class(site.cores),
                  memory_gb=node_memory_gb(job)) for name, site in hosts]
    bw = np.array([[gbps[(a.name, b.name)] * GBIT if x != y else np.inf for y, b in hosts]
                   for x, a in hosts])
    net = Network.from_matrix(nodes, np.array(topo.matrix().as_lists()), bw=bw)
    net.thr = np.array([site.cores * NOMINAL_FLOPS_PER_CORE for _, site in hosts])
    return net


def measure_site_bandwidth(lab: WanLab, topo: Topology, duration_s: float) -> dict:
    """Gbit/s per directed site pair (intra-site included), one test each between hosts chosen
    so that tests of one round share no host."""
    by_site = {s.name: [h for h, site in topo.hosts() if site.name == s.name] for s in topo.sites}
    pairs, which = [], {}
    for a in topo.sites:
        for b in topo.sites:
            if a.name == b.name:
                sender, receiver = by_site[a.name][0], by_site[a.name][1]
            else:
                used = {h for p in pairs for h in p}
                sender = min(by_site[a.name], key=lambda h: h in used)
                receiver = min(by_site[b.name], key=lambda h: h in used)
            pairs.append((sender, receiver))
            which[(sender, receiver)] = (a.name, b.name)
    out = {}
    for m in lab_bandwidth.measure(lab, pairs, duration_s=duration_s):
        site_pair = which[(m.sender, m.receiver)]
        configured = topo.link(*(next(s for s in topo.sites if s.name == n) for n in site_pair))[1]
        out[site_pair] = {"sender": m.sender, "receiver": m.receiver, "gbps": m.gbps, "ok": m.ok,
                          "detail": m.detail, "configured_gbps": configured / 1000}
    return out


def describe(p: Placement, net: Network) -> list[dict]:
    return [{"layers": [st.lo, st.hi], "hosts": [net.ids[i] for i in st.nodes]} for st in p.stages]


def key(p: Placement) -> tuple:
    return (p.micro_batch, tuple((st.lo, st.hi, st.nodes) for st in p.stages))


def hulk_plan(job: Job, net: Network) -> Placement:
    from planner.methods import DEFAULT_METHOD, plan_with

    return plan_with(DEFAULT_METHOD, [job], net, seed=0, budget_s=5.0, workers=1).placements[0]


def planned(job: Job, net: Network) -> list[tuple[str, Placement]]:
    from planner.methods import DEFAULT_METHOD, plan_with

    out = []
    for label, method, options in ((HULK_REF, DEFAULT_METHOD, {"budget_s": 5.0, "workers": 1}),
                                   ("dtfm", "dtfm", {}), ("system-b", "system-b", {})):
        plan = plan_with(method, [job], net, seed=0, **options)
        if plan.placements:
            out.append((label, plan.placements[0]))
    return out


def random_placement(job: Job, net: Network, rng: random.Random) -> Placement | None:
    """A valid placement drawn at random: stages, replicas, micro-batch, hosts, layer split."""
    k = rng.choice([2, 3, 4])
    d = rng.choice([d for d in (1, 2) if k * d <= net.n])
    b = rng.choice([b for b in (2, 4) if GLOBAL_BATCH % (d * b) == 0])
    hosts = rng.sample(range(net.n), k * d)
    cuts = sorted(rng.sample(range(1, job.layers), k - 1))
    bounds = [0, *cuts, job.layers]
    stages = tuple(Stage(bounds[s], bounds[s + 1], tuple(hosts[s * d:(s + 1) * d])) for s in range(k))
    p = Placement(job, stages, b)
    return None if problems(p, net) else p


def choose_placements(job: Job, net: Network, count: int, seed: int
                      ) -> tuple[list[tuple[str, Placement]], dict[str, str]]:
    """``count`` distinct placements (the planners' first, then random ones) and, for a planner
    whose placement equals an earlier one's, the name of that one (it is run once)."""
    chosen: list[tuple[str, Placement]] = []
    same: dict[str, str] = {}
    seen: dict[tuple, str] = {}
    for name, p in planned(job, net):
        if key(p) in seen:
            same[name] = seen[key(p)]
        else:
            seen[key(p)] = name
            chosen.append((name, p))
    rng = random.Random(seed)
    drawn = 0
    for _ in range(10_000):
        if len(chosen) >= count:
            break
        p = random_placement(job, net, rng)
        if p is not None and key(p) not in seen:
            drawn += 1
            seen[key(p)] = f"random-{drawn}"
            chosen.append((f"random-{drawn}", p))
    return chosen, same


def run_one(lab: WanLab, p: Placement, net: Network, steps: int, skip: int) -> dict:
    m = micro_batches(p.job, p.replicas, p.micro_batch)
    stages = [[net.ids[i] for i in st.nodes] for st in p.stages]
    t0 = time.monotonic()
    run = run_placement(stages, lab=lab, layers=LAYERS, steps=steps, micro_batch=p.micro_batch,
                        layer_ranges=[(st.lo, st.hi) for st in p.stages], timeout_s=600,
                        args=["--micro-batches", str(m), "--dim", str(DIM), "--seq-len", str(SEQ_LEN)])
    if not run.ok:
        raise RuntimeError(f"placement {stages} failed:\n{run.failure()}")
    return {"measured_s": run.iteration_s(skip), "micro_batches": m, "wall_s": time.monotonic() - t0,
            "step_s": [n.step_s for n in run.nodes]}


def leave_one_out(rows: list[dict], placements: dict[str, Placement], net: Network):
    """Each row's calibrated estimate, from a calibration fitted on the other rows; returns the
    calibration fitted on all of them (for the record)."""
    obs = [Observation(placements[r["name"]], net, r["measured_s"], r["name"]) for r in rows]
    for i, row in enumerate(rows):
        cal = fit(obs[:i] + obs[i + 1:], min_runs=3, seed=0)
        row["calibrated_s"] = estimate(placements[row["name"]], cal.apply(net)).iteration_s
        row["calibration"] = cal.to_json()
    return fit(obs, min_runs=3, seed=0)


def errors(rows: list[dict], model: str) -> dict:
    from scipy.stats import kendalltau

    rel = [abs(r[model] - r["measured_s"]) / r["measured_s"] for r in rows]
    tau = kendalltau([r[model] for r in rows], [r["measured_s"] for r in rows]).statistic
    return {"median_abs_rel_error": statistics.median(rel), "max_abs_rel_error": max(rel),
            "kendall_tau": float(tau) if tau == tau else None}


def speedups(rows: list[dict], same: dict[str, str], predicted: dict | None = None) -> dict:
    """Each Hulk plan's speed-up over each baseline: measured, and as each model predicted it
    (leave-one-out for the calibrated one; ``predicted``: {name: seconds} by the calibration Hulk
    planned with). A placement that equals another's shares that one's run."""
    by = {r["name"]: r for r in rows}
    by.update({name: by[other] for name, other in same.items() if other in by})
    out = {}
    for hulk in (HULK_REF, HULK_CAL):
        if hulk not in by:
            continue
        h, out[hulk] = by[hulk], {}
        for base in (b for b in BASELINES if b in by):
            b = by[base]
            entry = {"measured": b["measured_s"] / h["measured_s"]}
            for model in ("reference", "calibrated"):
                if f"{model}_s" in b and f"{model}_s" in h:
                    entry[model] = b[f"{model}_s"] / h[f"{model}_s"]
                    entry[f"measured_over_{model}"] = entry["measured"] / entry[model]
            if hulk == HULK_CAL and predicted:
                entry["planned"] = predicted[base] / predicted[HULK_CAL]
                entry["measured_over_planned"] = entry["measured"] / entry["planned"]
                entry["meets_target"] = (entry["measured"] > 1
                                         and entry["measured_over_planned"] >= 0.8)
            out[hulk][base] = entry
    return out


def fit_runs(rows: list[dict], placements: dict[str, Placement], net: Network):
    return fit([Observation(placements[r["name"]], net, r["measured_s"], r["name"]) for r in rows],
               min_runs=3, seed=0)


def run_topology(topo: Topology, *, count: int, steps: int, skip: int, seed: int,
                 log=print) -> tuple[dict, list[dict]]:
    job = the_job(steps)
    t0 = time.monotonic()
    with WanLab(topo.matrix(), hub=False, rate_mbps=topo.rates(),
                cpu_cores={h: s.cores for h, s in topo.hosts()}) as lab:
        measured_bw = measure_site_bandwidth(lab, topo, duration_s=2.0)
        bad = [f"{a}>{b}: {m['detail']}" for (a, b), m in measured_bw.items() if not m["ok"]]
        if bad:
            raise RuntimeError(f"throughput tests failed: {'; '.join(bad)}")
        net = lab_network(topo, job, {k: m["gbps"] for k, m in measured_bw.items()})
        chosen, same = choose_placements(job, net, count, seed)
        placements = dict(chosen)
        rows = []

        def run_row(name: str, p: Placement) -> None:
            run = run_one(lab, p, net, steps, skip)
            ref = estimate(p, net)
            rows.append({"name": name, "stages": describe(p, net), "micro_batch": p.micro_batch,
                         "reference_s": ref.iteration_s, "reference_compute_s": ref.compute_s,
                         **run})
            log(f"  {topo.name} {len(rows)}/{len(chosen) + 1} {name}: measured "
                f"{run['measured_s']:.3f} s, reference {ref.iteration_s:.3f} s "
                f"({run['wall_s']:.0f} s)")

        # Planned and random placements interleaved at random, so drift in the machine's load
        # does not line up with the kind of placement.
        order = list(range(len(chosen)))
        random.Random(seed + 1).shuffle(order)
        for i in order:
            run_row(*chosen[i])
        # What a user meets next: the calibration fitted on these runs, Hulk's plan made with it.
        planning = fit_runs(rows, placements, net)
        cal_net = planning.apply(net)
        again = hulk_plan(job, cal_net)
        twin = next((name for name, q in placements.items() if key(q) == key(again)), None)
        if twin:
            same[HULK_CAL] = twin
        else:
            placements[HULK_CAL] = again
            run_row(HULK_CAL, again)
        predicted = {name: estimate(placements[same.get(name, name)], cal_net).iteration_s
                     for name in (HULK_CAL, *BASELINES) if same.get(name, name) in placements}
        full = leave_one_out(rows, placements, net)
    result = {
        "topology": {"sites": [vars(s) for s in topo.sites],
                     "links": {f"{a}>{b}": {"rtt_ms": v[0], "mbit_s": v[1]}
                               for (a, b), v in topo.links.items()},
                     "intra_site": {"rtt_ms": INTRA_SITE[0], "mbit_s": INTRA_SITE[1]}},
        "bandwidth": {f"{a}>{b}": m for (a, b), m in measured_bw.items()},
        "placements": rows,
        "same_placement": same,
        "reference": errors(rows, "reference_s"),
        "calibrated": errors(rows, "calibrated_s"),
        "calibration_planned_with": planning.to_json(),
        "planned_with_predicted_s": predicted,
        "calibration_all_runs": full.to_json(),
        "hulk_speedup": speedups(rows, same, predicted),
        "wall_s": time.monotonic() - t0,
    }
    return result, rows


def picture(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(5.5 * len(results), 5), squeeze=False)
    for ax, (name, res) in zip(axes[0], results.items()):
        rows = res["placements"]
        meas = [r["measured_s"] for r in rows]
        ax.scatter(meas, [r["reference_s"] for r in rows], marker="o", label="reference", alpha=0.8)
        if rows and "calibrated_s" in rows[0]:
            ax.scatter(meas, [r["calibrated_s"] for r in rows], marker="^",
                       label="calibrated (leave one out)", alpha=0.8)
        for r in rows:
            if not r["name"].startswith("random"):
                ax.annotate(r["name"], (r["measured_s"], r.get("calibrated_s", r["reference_s"])),
                            fontsize=7, xytext=(3, 3), textcoords="offset points")
        values = meas + [r["reference_s"] for r in rows] + [r.get("calibrated_s", 0) for r in rows]
        top = max(values) * 1.1 if values else 1.0
        ax.plot([0, top], [0, top], color="grey", lw=1, label="y = x")
        ax.set_xlim(0, top)
        ax.set_ylim(0, top)
        ax.set_xlabel("measured iteration (s)")
        ax.set_ylabel("estimated iteration (s)")
        ax.set_title(f"{name}: {len(rows)} placements")
        ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run(out_dir: Path, quick: bool = False, placements: int | None = None) -> dict:
    require_root()
    count = placements or (3 if quick else 12)
    steps, skip = (5, 2) if quick else (12, 3)
    started = datetime.now(timezone.utc)
    results = {}
    for n, topo in enumerate(TOPOLOGIES):
        print(f"[calibration_lab] {topo.name}: {count} placements", flush=True)
        results[topo.name], _ = run_topology(topo, count=count, steps=steps, skip=skip, seed=n,
                                             log=lambda s: print(s, flush=True))
    out = {
        "date": started.strftime("%Y-%m-%d %H:%M UTC"),
        "command": "python -m bench.calibration_lab_bench" + (" --quick" if quick else "")
                   + (f" --placements {placements}" if placements else ""),
        "job": {"script": "examples/train_gpt.py", "layers": LAYERS, "dim": DIM, "seq_len": SEQ_LEN,
                "global_batch": GLOBAL_BATCH, "steps": steps, "warmup_steps_skipped": skip},
        "nominal_flops_per_core": NOMINAL_FLOPS_PER_CORE,
        "targets": {"calibrated_median_error": 0.10, "calibrated_max_error": 0.25,
                    "kendall_tau": 0.8, "hulk_measured_over_predicted": 0.8,
                    "hulk_measured_speedup_above": 1.0},
        "topologies": results,
    }
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "calibration_lab.json").write_text(json.dumps(out, indent=1))
    picture(results, out_dir / "calibration_lab.png")
    return out


def _fmt(x) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.2f}"


def summarize(result: dict) -> str:
    lines = [f"Real examples/train_gpt.py runs in the heterogeneous lab ({result['command']}, "
             f"{result['date']}); calibrated = fitted on the other placements of the same topology.",
             "", "| topology | placements | model | median error | max error | Kendall tau |",
             "|---|---|---|---|---|---|"]
    for name, res in result["topologies"].items():
        for model in ("reference", "calibrated"):
            e = res[model]
            if e:
                lines.append(f"| {name} | {len(res['placements'])} | {model} | "
                             f"{e['median_abs_rel_error']:.1%} | {e['max_abs_rel_error']:.1%} | "
                             f"{_fmt(e['kendall_tau'])} |")
    lines += ["", "Each Hulk plan's speed-up over each baseline: measured / predicted by the model "
              "it was planned with (reference; for hulk-calibrated the calibration fitted on the "
              "runs before it) / calibrated leave-one-out:", ""]
    for name, res in result["topologies"].items():
        by = {r["name"]: r for r in res["placements"]}
        times = {h: by[res["same_placement"].get(h, h)]["measured_s"] for h in (HULK_REF, HULK_CAL)
                 if res["same_placement"].get(h, h) in by}
        lines.append(f"- {name}: measured " + ", ".join(f"{h} {t:.3f} s" for h, t in times.items()))
        for hulk, over in res["hulk_speedup"].items():
            twin = res["same_placement"].get(hulk)
            for base, s in over.items():
                planned = s.get("planned", s.get("reference"))
                met = ("" if "meets_target" not in s else
                       f"; measured/predicted {s['measured_over_planned']:.2f}, target "
                       + ("met" if s["meets_target"] else "MISSED"))
                lines.append(f"- {name}, {hulk} over {base}: {_fmt(s['measured'])}x / "
                             f"{_fmt(planned)}x / {_fmt(s.get('calibrated'))}x{met}"
                             + (f" (placed as {twin})" if twin else "")
                             + (f" ({base} placed as {res['same_placement'][base]})"
                                if base in res["same_placement"] else ""))
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.calibration_lab_bench")
    p.add_argument("--quick", action="store_true", help="3 placements per topology, 5 steps")
    p.add_argument("--placements", type=int, help="per topology (default 12, 3 with --quick)")
    p.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    a = p.parse_args(argv)
    if a.placements is not None and a.placements < 2:
        p.error("--placements must be at least 2 (the calibration leaves one out)")
    try:
        result = run(a.out, quick=a.quick, placements=a.placements)
    except LabError as err:
        print(f"calibration_lab_bench: {err}", file=sys.stderr)
        return 2
    print(summarize(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
