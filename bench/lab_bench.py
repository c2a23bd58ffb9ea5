"""WAN lab benchmark: the example job's real iteration time under a Hulk-style and a System-B-style
placement, each measured in the lab, beside the reference cost model's prediction for both.

    python -m bench.lab_bench [--quick]      (root: it builds network namespaces)

Setup. Eight lab hosts in eight of the paper's Table 1 cities, RTTs from :mod:`lab.matrix` scaled
by ``SCALE`` to fit a 2-core machine. The job is examples/train_gpt.py with 4 blocks as 4
pipeline stages (one block each), 1 replica, GPipe, 4 micro-batches of 2 sequences per step.

- Hulk-style: the pipeline stays inside the low-latency cluster (Beijing, Neimeng, Nanjing,
  Quanzhou), ordered as the shortest chain.
- System-B-style: one stage per node, chained nearest-neighbour first from the first host across
  hosts on four continents (Beijing, New Delhi, Berlin, Brasilia), as GPipe over a world-wide fleet
  does.

Both run the same 4 processes on the same 2 cores, so compute contention is the same; only the
links differ. The cost model (planner/core/costmodel.py ``estimate``) gets a ``Network`` built with
``Network.from_matrix`` from the same scaled matrix and tiny nodes whose throughput is calibrated so
its compute term equals the job's measured iteration on loopback (zero latency): the prediction's
compute part is then the measured one, and the comparison is about the communication model.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from lab import matrix as lab_matrix
from lab.accuracy import measure as measure_accuracy
from lab.netns import LabError, require_root
from lab.train import run_placement
from lab.wan import WanLab
from planner.core.costmodel import Placement, Stage, estimate
from planner.core.fleet import Network, Node
from planner.core.jobs import Job

REPO = Path(__file__).resolve().parents[1]
SCALE = 0.25
LAYERS = 4
MICRO_BATCH = 2
MICRO_BATCHES = 4
DIM, SEQ_LEN = 64, 32
CLUSTER = ["Beijing", "Neimeng", "Nanjing", "Quanzhou"]
WORLD = ["Beijing", "New Delhi", "Berlin", "Brasilia"]
CITIES = ["Beijing", "Neimeng", "Nanjing", "Quanzhou", "Tokyo", "New Delhi", "Berlin", "Brasilia"]


def example_params(layers: int = LAYERS, dim: int = DIM, vocab: int = 40, seq_len: int = SEQ_LEN) -> float:
    """Parameters of examples/train_gpt.py's model: blocks (12 d^2 + 13 d each) and embeddings/head."""
    return layers * (12 * dim * dim + 13 * dim) + vocab * dim + seq_len * dim + 2 * dim + dim * vocab + vocab


def nearest_neighbour_chain(matrix: lab_matrix.LatencyMatrix, hosts: list[str]) -> list[str]:
    """``hosts`` reordered: start at the first, always go to the closest not yet used."""
    idx = {n: i for i, n in enumerate(matrix.names)}
    chain, left = [hosts[0]], list(hosts[1:])
    while left:
        here = idx[chain[-1]]
        nxt = min(left, key=lambda h: matrix.rtt(here, idx[h]))
        chain.append(nxt)
        left.remove(nxt)
    return chain


def predict(matrix: lab_matrix.LatencyMatrix, chain: list[str], job: Job, thr: float) -> dict:
    nodes = [Node(id=h.name, city=h.city, gpus=1) for h in matrix.hosts]
    net = Network.from_matrix(nodes, np.array(matrix.as_lists()))
    net.thr = np.full(net.n, thr)  # the calibrated CPU throughput of one lab process
    k = len(chain)
    stages = tuple(Stage(LAYERS * s // k, LAYERS * (s + 1) // k, (net.index[h],)) for s, h in enumerate(chain))
    est = estimate(Placement(job, stages, job.micro_batch), net)
    return {"iteration_s": est.iteration_s, "compute_s": est.compute_s,
            "communication_s": est.communication_s, "micro_batches": est.micro_batches}


def run(out_dir: Path, shared: Path | None = None, quick: bool = False) -> dict:
    require_root()
    steps = 6 if quick else 12
    rounds = 1 if quick else 3   # loopback, Hulk, System B in turn, so load drift hits all alike
    skip = 2  # the first steps include the shape exchange and warm-up
    args = ["--micro-batches", str(MICRO_BATCHES), "--dim", str(DIM), "--seq-len", str(SEQ_LEN)]
    matrix = lab_matrix.from_cities(CITIES).scaled(SCALE)
    names = {h.city: h.name for h in matrix.hosts}
    hulk_chain = nearest_neighbour_chain(matrix, [names[c] for c in CLUSTER])
    systemb_chain = nearest_neighbour_chain(matrix, [names[c] for c in WORLD])
    t0 = time.monotonic()
    # The switch's accuracy first, on the full Table 1 matrix at real scale, with real ping.
    with WanLab(lab_matrix.table1()) as lab:
        accuracy = measure_accuracy(lab, count=10, interval_s=0.2)
        accuracy.pop("rows")

    idx = {n: i for i, n in enumerate(matrix.names)}
    runs: dict[str, list[float]] = {"loopback": [], "hulk": [], "system_b": []}
    measured: dict[str, dict] = {}
    with WanLab(matrix) as lab:
        for _ in range(rounds):
            # Zero latency: the same 4 processes on loopback, for the compute calibration.
            zero = run_placement([[h] for h in hulk_chain], steps=steps, layers=LAYERS,
                                 micro_batch=MICRO_BATCH, args=args)
            if not zero.ok:
                raise RuntimeError(f"loopback run failed:\n{zero.failure()}")
            runs["loopback"].append(zero.iteration_s(skip))
            for label, chain in (("hulk", hulk_chain), ("system_b", systemb_chain)):
                before = lab.switch_stats()
                job_run = run_placement([[h] for h in chain], lab=lab, steps=steps, layers=LAYERS,
                                        micro_batch=MICRO_BATCH, args=args)
                if not job_run.ok:
                    raise RuntimeError(f"{label} run failed:\n{job_run.failure()}")
                after = lab.switch_stats()
                runs[label].append(job_run.iteration_s(skip))
                measured[label] = {
                    "chain": chain,
                    "chain_rtt_ms": [matrix.rtt(idx[a], idx[b]) for a, b in zip(chain, chain[1:])],
                    "step_s_last_run": [n.step_s for n in job_run.nodes],
                    "loss_last_run": job_run.loss,
                    "switch_packets_last_run": after["forwarded"] - before["forwarded"],
                    "switch_late_mean_ms": after["late_mean_ms"],
                    "switch_late_max_ms": after["late_max_ms"],
                }
    measured["loopback"] = {}
    for label, values in runs.items():
        # Each run's figure is already a median over steps; the median over rounds drops a round
        # that something else on the machine slowed down.
        measured[label]["runs_s"] = values
        measured[label]["iteration_s"] = statistics.median(values)
        measured[label]["best_s"] = min(values)

    job = Job(name="train-gpt", params=example_params(), layers=LAYERS, hidden=DIM, seq_len=SEQ_LEN,
              global_batch=MICRO_BATCH * MICRO_BATCHES, micro_batch=MICRO_BATCH, steps=steps)
    # Calibrate: with free links the cost model's pipeline time is (K + M - 1) * f * l / thr for
    # equal stages of l layers; set thr so that this equals the loopback iteration.
    k, m = len(hulk_chain), MICRO_BATCHES
    f_stage = job.flops_per_layer(MICRO_BATCH) * (LAYERS // k)
    thr = (k + m - 1) * f_stage / measured["loopback"]["iteration_s"]
    predicted = {label: predict(matrix, measured[label]["chain"], job, thr)
                 for label in ("hulk", "system_b")}

    result = {
        "scale": SCALE,
        "steps": steps, "rounds": rounds, "warmup_steps_skipped": skip,
        "layers": LAYERS, "stages": k, "micro_batches": m, "micro_batch": MICRO_BATCH,
        "calibrated_thr_flops": thr,
        "switch_accuracy_table1_scale1": accuracy,
        "measured": measured,
        "predicted": predicted,
        "ratio_system_b_over_hulk": {
            "measured": measured["system_b"]["iteration_s"] / measured["hulk"]["iteration_s"],
            "predicted": predicted["system_b"]["iteration_s"] / predicted["hulk"]["iteration_s"],
        },
        "measured_over_predicted": {
            label: measured[label]["iteration_s"] / predicted[label]["iteration_s"]
            for label in ("hulk", "system_b")
        },
        "wall_s": time.monotonic() - t0,
    }
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "lab.json").write_text(json.dumps(result, indent=1))
    return result


def summarize(result: dict) -> str:
    m, p = result["measured"], result["predicted"]
    lines = [
        f"Example job, {result['stages']} stages x 1 replica, {result['micro_batches']} micro-batches, "
        f"RTTs x{result['scale']:g}; iteration time (s):",
        "",
        "| placement | chain | measured | cost model | measured / model |",
        "|---|---|---|---|---|",
    ]
    for label in ("hulk", "system_b"):
        lines.append(f"| {label} | {' > '.join(m[label]['chain'])} | {m[label]['iteration_s']:.3f} | "
                     f"{p[label]['iteration_s']:.3f} | {result['measured_over_predicted'][label]:.2f} |")
    r = result["ratio_system_b_over_hulk"]
    acc = result["switch_accuracy_table1_scale1"]
    lines += ["", f"- switch accuracy (Table 1, 66 pairs, real ping): per-pair median error mean "
              f"{acc['median_error_mean_ms']:+.2f} ms, max |{acc['median_error_max_abs_ms']:.2f}| ms; "
              f"{acc['pairs_within_max_1ms_5pct']}/{acc['pairs']} pairs within max(1 ms, 5%)"]
    lines += ["", f"- loopback (no latency): {m['loopback']['iteration_s']:.3f} s",
              f"- System B / Hulk: measured {r['measured']:.2f}x, cost model {r['predicted']:.2f}x", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.lab_bench")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    a = p.parse_args(argv)
    try:
        result = run(a.out, quick=a.quick)
    except LabError as err:
        print(f"lab_bench: {err}", file=sys.stderr)
        return 2
    print(summarize(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
