"""DiLoCo across two lab continents against the best every-step placement of the same job.

    python -m bench.diloco_lab_bench [--quick] [--inner-steps H] [--outer-lr LR]
        [--outer-momentum MU] [--full-batch] [--idle-restart 0|1] [--wan-mtu BYTES]
        [--every-host-steps N] [--corpus builtin|markov]   (root: network namespaces)

Two "continents" of two hosts each, every host held to the same CPU quota (cgroup v1), joined
by a slow link (150 ms RTT, 4 Mbit/s each way, the lab switch's delay and serialisation queue);
hosts of one continent are 1 ms and 400 Mbit/s apart. The job is examples/train_gpt.py (4 blocks
of width 128, 64-token sequences, global batch 16: 1024 tokens a step), trained for real twice
for the same number of steps:

- ``sync: step`` placed by Hulk's planner (the default method) on the lab's fleet: configured
  RTTs, bandwidth measured between hosts of every continent pair (as
  bench/calibration_lab_bench.py does), the nominal throughput of each host's quota;
- ``sync: diloco``: one stage, every host a replica, one island per continent (inner AdamW
  within the island, an int8 outer all-reduce every H = 20 steps between the
  islands' first replicas, outer Nesterov).

- ``sync: step`` over all four hosts, one island (every step's all-reduce crosses the slow
  link), for ``--every-host-steps`` steps (12, 4 with --quick; the first 2 left out): what
  DiLoCo saves a job that must use both continents, and a check of the cost model's WAN
  all-reduce.

Measured per run: the iteration, wall seconds per step after the warm-up (from the trainers'
clocks at each step's end, the last node's; outer steps included), tokens per second (tokens per
step / that), the loss per step averaged over the replicas, and per outer step where its time
went (the island leaders' wait for one another, the exchange, the broadcast within the islands).
Beside it, ``step_max_mean_s``, the mean over steps of the slowest node's step time (this
bench's measure before 2026-11-27): with islands it counts their drift twice, once in the slower
island's steps and again in the other's wait at the outer step.
Compared with the targets: DiLoCo's tokens/s at least 3x the step plan's, its loss after the
same tokens (mean of the last tenth of the steps) within 5%, and the cost model's estimate of its
iteration (planner/core/costmodel.py estimate() on the same network) within 15% of measured,
three ways: (a) the nominal per-core throughput; (b) the throughput fitted on the step run (one
factor for every core, from that other placement's measured iteration); (c) the calibrated cost
model (planner/core/calibration.py fit(): a compute factor, the per-iteration step overhead,
the communication factor and the outer-sync factor) fitted on short calibration runs made before
the judged runs: the step plan's placement at global batches 16, 8 and 4 (M = 8, 4, 2
micro-batches per replica) and its first host alone at 8 and 4, 25 steps each, then the step job
over all four hosts for 6 steps, then the DiLoCo placement at H = 2, 5 and 10 (2 and 4 with
--quick) for four rounds each, the first left out, timed by the wall clock.
The step placement's runs, of different work per replica, tell the trainer's per-step cost
(optimizer step, Python, scheduling, the all-reduce's fixed part) from its per-sample compute;
their all-reduce costs the same at every batch, so alone a communication factor would move them
exactly as a step overhead does. The run over all four hosts spends most of its step in an
all-reduce over the slow link, which tells the communication factor (what the trainer's
transfers achieve against the throughput tests) apart. The one-host runs, fitted alone, say how
much of the per-step cost a replica pays with no all-reduce. The DiLoCo runs are the only ones
with outer syncs, which no other run prices (the islands' wait for one another, both directions
of the slow link at once, int8 packing under the quota): they fit the outer-sync factor, and
``calibrated_without_diloco_runs`` is the fit without them. None of the runs is a run judged. The 15% target is judged on (c).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import time
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from bench.calibration_lab_bench import (DIM, GLOBAL_BATCH, LAYERS, MICRO_BATCH, NOMINAL_FLOPS_PER_CORE,
                                         SEQ_LEN, Site, Topology, measure_site_bandwidth, quota_class)
from bench.lab_bench import example_params
from bench.diloco_lab_figures import figures, outer_phases
from bench.diloco_lab_report import picture, summarize
from lab.netns import LabError, require_root
from lab.train import JobRun, run_placement
from lab.wan import WanLab
from planner.core.calibration import Calibration, Observation, fit
from planner.core.costmodel import OuterSync, Placement, Stage, estimate, micro_batches, problems
from planner.core.fleet import GBIT, Network, Node
from planner.core.jobs import Job

REPO = Path(__file__).resolve().parents[1]
CORES = 0.3
# A text the small model cannot learn by heart (about 1.65 nats a character at best), so the
# loss of the two runs is compared while both still learn, not after both memorised a paragraph.
CORPUS = "markov"
WAN = (150.0, 4.0)      # RTT ms, Mbit/s each way between the continents
# The path MTU between continents: a real WAN's 1500 bytes, not the lab's 65 KB packets (which
# at 4 Mbit/s take 130 ms each, so TCP would probe a queue of a handful of packets).
WAN_MTU = 1500
TOPOLOGY = Topology("two-continents", (Site("east", 2, CORES), Site("west", 2, CORES)),
                    {("east", "west"): WAN})
INNER_STEPS, COMPRESSION = 20, "int8"
OUTER_LR, OUTER_MOMENTUM = 0.7, 0.9   # examples/diloco.py's defaults (the paper's)
# Calibration runs: this many steps, the first skipped; the global batches of the step
# placement's runs and of the one-host runs.
CALIBRATION_STEPS, CALIBRATION_SKIP = 25, 3
CALIBRATION_EVERY_HOST_STEPS = 6
QUICK_CALIBRATION_STEPS, QUICK_CALIBRATION_EVERY_HOST_STEPS = 12, 4     # --quick
STEP_BATCHES, ONE_HOST_BATCHES = (16, 8, 4), (8, 4)
# The step job over every host of both continents (each step's all-reduce crosses the slow
# link): a few steps tell its iteration; its loss is not compared.
EVERY_HOST_STEPS, EVERY_HOST_QUICK, EVERY_HOST_SKIP = 12, 3, 2
# The DiLoCo placement at these H (fewer with --quick), its first round left out and the next
# DILOCO_CALIBRATION_ROUNDS measured: what an outer sync costs, which no run above has.
DILOCO_CALIBRATION_H, QUICK_DILOCO_CALIBRATION_H = (2, 5, 10), (2, 4)
DILOCO_CALIBRATION_ROUNDS = 3
WIRE_DTYPE = "fp32"     # examples/train_gpt.py's gradients and activations (no autocast)
TARGETS = {"tokens_per_s_ratio": 3.0, "loss_rel_diff": 0.05, "estimate_rel_error": 0.15}


def the_job(steps: int, global_batch: int = GLOBAL_BATCH) -> Job:
    """examples/train_gpt.py as the planner sees it: it trains in fp32, so it all-reduces fp32
    gradients and sends fp32 activations (the cost model's default is fp16)."""
    return Job(name="train-gpt", params=example_params(LAYERS, DIM, seq_len=SEQ_LEN), layers=LAYERS,
               hidden=DIM, seq_len=SEQ_LEN, global_batch=global_batch, micro_batch=MICRO_BATCH,
               steps=steps, gradient_dtype=WIRE_DTYPE, activation_dtype=WIRE_DTYPE)


def lab_network(job: Job, gbps: dict[tuple[str, str], float]) -> Network:
    """The lab as the planner sees it; every host holds the whole model with room to spare, so
    the planner is free to choose data parallelism."""
    hosts = TOPOLOGY.hosts()
    nodes = [Node(id=name, site=site.name, gpus=1, gpu_name=quota_class(site.cores),
                  memory_gb=4 * job.state_bytes / 1e9) for name, site in hosts]
    bw = np.array([[gbps[(a.name, b.name)] * GBIT if x != y else np.inf for y, b in hosts]
                   for x, a in hosts])
    net = Network.from_matrix(nodes, np.array(TOPOLOGY.matrix().as_lists()), bw=bw)
    net.thr = np.array([site.cores * NOMINAL_FLOPS_PER_CORE for _, site in hosts])
    return net


def step_plan(job: Job, net: Network) -> Placement:
    from planner.methods import DEFAULT_METHOD, plan_with

    return plan_with(DEFAULT_METHOD, [job], net, seed=0, budget_s=5.0, workers=1).placements[0]


def diloco_placement(job: Job, net: Network, inner_steps: int, compression: str,
                     micro_batch: int) -> Placement:
    """One stage, every host a replica, the continents' hosts as contiguous islands."""
    hosts = TOPOLOGY.hosts()
    order = [net.ids.index(name) for name, _ in hosts]
    islands = tuple(site.hosts for site in TOPOLOGY.sites)
    p = Placement(job, (Stage(0, job.layers, tuple(order)),), micro_batch, islands=islands,
                  outer=OuterSync(inner_steps, compression))
    bad = problems(p, net)
    if bad:
        raise RuntimeError(f"the DiLoCo placement is invalid: {bad[0]}")
    return p


def every_host_step_placement(job: Job, net: Network, micro_batch: int) -> Placement:
    """``sync: step`` over every host: one stage, every host a replica, one island."""
    order = tuple(net.ids.index(name) for name, _ in TOPOLOGY.hosts())
    return Placement(job, (Stage(0, job.layers, order),), micro_batch)


def diloco_env(p: Placement, net: Network):
    """(stage, replica) -> the HULK_SYNC family the agent's launcher sets from the roles the
    planner gives the placement's nodes."""
    from agent.launcher import sync_env
    from planner.core.placements import placement_roles

    roles = placement_roles(p, list(net.ids), plan_id="lab", port=29500, addresses={})
    by = {(r.stage, r.replica): sync_env(r) for r in roles.values()}
    return lambda stage, replica: by[(stage, replica)]


def run(lab: WanLab, p: Placement, net: Network, steps: int, extra: list[str]) -> JobRun:
    m = micro_batches(p.job, p.replicas, p.micro_batch)
    stages = [[net.ids[i] for i in st.nodes] for st in p.stages]
    env_for = diloco_env(p, net) if p.outer is not None else None
    done = run_placement(stages, lab=lab, layers=LAYERS, steps=steps, micro_batch=p.micro_batch,
                         layer_ranges=[(st.lo, st.hi) for st in p.stages], timeout_s=900,
                         args=["--micro-batches", str(m), "--dim", str(DIM),
                               "--seq-len", str(SEQ_LEN), *extra],
                         env_for=env_for)
    if not done.ok:
        raise RuntimeError(f"placement {stages} failed:\n{done.failure()}")
    return done


def fitted_network(net: Network, p: Placement, measured_s: float) -> tuple[Network, float]:
    """``net`` with every host's throughput scaled by one factor so that ``p``'s estimate equals
    its measured iteration (compute scales as 1 / throughput; communication stays)."""
    est = estimate(p, net)
    spare = measured_s - (est.iteration_s - est.compute_s)
    factor = est.compute_s / spare if spare > 0 else 1.0
    fitted = copy.copy(net)
    fitted.thr = net.thr * factor
    return fitted, factor


def calibration_placements(step_p: Placement, net: Network | None = None,
                           every_host_steps: int = CALIBRATION_EVERY_HOST_STEPS,
                           steps: int = CALIBRATION_STEPS, dil_p: Placement | None = None,
                           inner_steps: tuple[int, ...] = DILOCO_CALIBRATION_H) -> list[Placement]:
    """The placements of the calibration runs: the step plan's at each of STEP_BATCHES, its
    first host holding every layer at each of ONE_HOST_BATCHES (``steps`` steps each),
    then, given ``net`` and ``every_host_steps``, the step job over every host for that many
    steps: its all-reduce crosses the slow link, which is what tells the communication factor
    (what training's transfers achieve against the throughput tests) from a per-step cost;
    then, given ``dil_p``, that DiLoCo placement at each H of ``inner_steps`` for one round
    more than DILOCO_CALIBRATION_ROUNDS: what its outer sync costs against its price."""
    host = step_p.stages[0].nodes[0]
    one = [Placement(the_job(steps, batch), (Stage(0, LAYERS, (host,)),),
                     step_p.micro_batch) for batch in ONE_HOST_BATCHES]
    wide = ([every_host_step_placement(the_job(every_host_steps), net, step_p.micro_batch)]
            if net is not None and every_host_steps else [])
    outer = ([replace(dil_p, job=the_job(h * (1 + DILOCO_CALIBRATION_ROUNDS),
                                         dil_p.job.global_batch),
                      outer=replace(dil_p.outer, inner_steps=h)) for h in inner_steps]
             if dil_p is not None else [])
    return [*(replace(step_p, job=the_job(steps, batch)) for batch in STEP_BATCHES),
            *one, *wide, *outer]


def warmup_steps(p: Placement) -> int:
    """Steps a run's figure leaves out: a step over the slow link is long enough to need fewer;
    a DiLoCo run leaves out its first round."""
    if p.outer is not None:
        return p.outer.inner_steps
    return EVERY_HOST_SKIP if p.replicas == len(TOPOLOGY.hosts()) else CALIBRATION_SKIP


def quick_calibration_placements(step_p: Placement, net: Network,
                                 dil_p: Placement) -> list[Placement]:
    return calibration_placements(step_p, net, QUICK_CALIBRATION_EVERY_HOST_STEPS,
                                  QUICK_CALIBRATION_STEPS, dil_p, QUICK_DILOCO_CALIBRATION_H)


def calibration_runs(lab: WanLab, placements: list[Placement], net: Network, extra: list[str],
                     log=print) -> list[dict]:
    """Each calibration placement run briefly: the figure the fit uses, and the mean beside it.
    Runs with no outer steps do the same work every step: their median step, so that a step
    stalled by other work on the machine does not move it. DiLoCo runs: wall seconds per step
    over whole rounds (the outer step is what they are run for)."""
    out = []
    for p in placements:
        done = run(lab, p, net, p.job.steps, extra)
        skip = warmup_steps(p)
        out.append({"placement": describe(p, net), "global_batch": p.job.global_batch,
                    "micro_batches": micro_batches(p.job, p.replicas, p.micro_batch),
                    "steps": p.job.steps, "warmup_steps_skipped": skip,
                    "iteration_s": (done.wall_iteration_s(skip) if p.outer is not None
                                    else done.iteration_s(skip)),
                    "mean_iteration_s": done.mean_iteration_s(skip)})
        kind = "median" if p.outer is None else f"H = {p.outer.inner_steps}, wall clock"
        log(f"[diloco_lab] calibration run {out[-1]['placement']['stages']}, global batch "
            f"{p.job.global_batch}: {out[-1]['iteration_s']:.3f} s/step ({kind}; mean "
            f"{out[-1]['mean_iteration_s']:.3f} s)")
    return out


def calibrated(placements: list[Placement], net: Network, runs: list[dict],
               one_host: bool = False, outer_runs: bool = True) -> Calibration:
    """fit() of the calibration runs (``runs`` measured ``placements``): the step placement's
    runs, the run over every host where it ran, with the communication factor fitted only
    beside it (the step placement's all-reduce is the same at every batch, so alone it moves
    every run as a step overhead does), and with ``outer_runs`` the DiLoCo runs, which fit the
    outer-sync factor; ``one_host``: the one-host runs alone."""
    named = [(f"calibration-{i}", p, r) for i, (p, r) in enumerate(zip(placements, runs))]
    if one_host:
        chosen, outer = [c for c in named if len(c[1].nodes) == 1], []
    else:
        chosen = [c for c in named if len(c[1].nodes) > 1 and c[1].outer is None]
        outer = [c for c in named if c[1].outer is not None] if outer_runs else []
    wide = any(p.replicas == len(TOPOLOGY.hosts()) for _, p, _ in chosen)
    obs = [Observation(p, net, r["iteration_s"], name) for name, p, r in chosen + outer]
    return fit(obs, seed=0, min_runs=len(chosen), communication=wide,
               min_outer_runs=max(1, len(outer)))


def calibration_json(cal: Calibration) -> dict:
    """The fitted factors that matter here: compute per GPU key and the overheads."""
    full = cal.to_json()
    return {k: full[k] for k in ("format", "compute", "hop_overhead_s", "micro_batch_overhead_s",
                                 "step_overhead_s", "communication", "outer_sync", "outliers")}


def describe(p: Placement, net: Network) -> dict:
    return {"stages": [{"layers": [st.lo, st.hi], "hosts": [net.ids[i] for i in st.nodes]}
                       for st in p.stages],
            "micro_batch": p.micro_batch, "islands": list(p.island_sizes()),
            "outer": None if p.outer is None else {"inner_steps": p.outer.inner_steps,
                                                   "compression": p.outer.compression}}


def slow_start_after_idle(lab: WanLab, value: int) -> None:
    """Set net.ipv4.tcp_slow_start_after_idle in every lab host (each namespace has its own):
    with 1, Linux's default, a connection idle for one retransmission timeout restarts from the
    initial window, which an outer step every H inner steps always is."""
    import subprocess

    for host, _ in TOPOLOGY.hosts():
        subprocess.run(["ip", "netns", "exec", lab.ns(host).netns, "sysctl", "-qw",
                        f"net.ipv4.tcp_slow_start_after_idle={value}"], check=True)


def bench(out_dir: Path, quick: bool = False, log=print, idle_restart: int = 1,
          outer_lr: float = OUTER_LR, outer_momentum: float = OUTER_MOMENTUM,
          inner_steps: int = INNER_STEPS, full_batch: bool = False,
          wan_mtu: int | None = WAN_MTU, every_host_steps: int | None = None,
          corpus: str = CORPUS) -> dict:
    """``full_batch``: each island takes the step plan's whole batch every inner step (the
    DiLoCo paper's setting, each worker its own batch), so the diloco job's batch is the
    islands' sum and it runs 1 / islands of the steps: the same tokens as the step plan."""
    require_root()
    steps, skip = (60, 3) if quick else (200, 5)
    wide_steps = every_host_steps if every_host_steps is not None else (
        EVERY_HOST_QUICK if quick else EVERY_HOST_STEPS)
    started = datetime.now(timezone.utc)
    load_before = list(os.getloadavg())
    t0 = time.monotonic()
    job = the_job(steps)
    hosts = TOPOLOGY.hosts()
    with WanLab(TOPOLOGY.matrix(), hub=False, rate_mbps=TOPOLOGY.rates(),
                cpu_cores={h: s.cores for h, s in hosts},
                path_mtu=TOPOLOGY.path_mtu(wan_mtu)) as lab:
        bw = measure_site_bandwidth(lab, TOPOLOGY, duration_s=2.0)
        bad = [f"{a}>{b}: {m['detail']}" for (a, b), m in bw.items() if not m["ok"]]
        if bad:
            raise RuntimeError(f"throughput tests failed: {'; '.join(bad)}")
        slow_start_after_idle(lab, idle_restart)
        net = lab_network(job, {k: m["gbps"] for k, m in bw.items()})
        t_plan = time.monotonic()
        step_p = step_plan(job, net)
        plan_s = time.monotonic() - t_plan
        # The step plan's micro-batch: the same work per forward pass on both.
        islands = len(TOPOLOGY.sites)
        dil_job = the_job(steps // islands, GLOBAL_BATCH * islands) if full_batch else job
        dil_p = diloco_placement(dil_job, net, inner_steps, COMPRESSION, step_p.micro_batch)
        runs, placements = {}, {"step": step_p, "diloco": dil_p}
        if wide_steps:
            placements["step_every_host"] = every_host_step_placement(
                the_job(wide_steps), net, step_p.micro_batch)
        extra = ["--outer-lr", str(outer_lr), "--outer-momentum", str(outer_momentum),
                 "--corpus", corpus]
        t_cal = time.monotonic()
        cal_ps = (quick_calibration_placements(step_p, net, dil_p) if quick
                  else calibration_placements(step_p, net, dil_p=dil_p))
        cal_runs = calibration_runs(lab, cal_ps, net, extra, log)
        cal_wall_s = time.monotonic() - t_cal
        for name, p in placements.items():
            log(f"[diloco_lab] {name}: {describe(p, net)}, {p.job.steps} steps")
            t_run = time.monotonic()
            done = run(lab, p, net, p.job.steps, extra)
            leaders = {net.ids[p.stages[0].nodes[lo]] for lo, _ in p.island_columns()}
            runs[name] = {"placement": describe(p, net), "outer_phases": outer_phases(done, leaders),
                          "hosts": sorted({net.ids[i] for st in p.stages for i in st.nodes}),
                          **figures(done, EVERY_HOST_SKIP if name == "step_every_host" else skip,
                                    p.job.global_batch * SEQ_LEN),
                          "wall_s": time.monotonic() - t_run}
            log(f"[diloco_lab] {name}: {runs[name]['iteration_s']:.3f} s/step, "
                f"{runs[name]['tokens_per_s']:.0f} tokens/s, loss {runs[name]['final_loss']:.4f}")
    fitted, factor = fitted_network(net, step_p, runs["step"]["iteration_s"])
    cal = calibrated(cal_ps, net, cal_runs)
    no_outer = calibrated(cal_ps, net, cal_runs, outer_runs=False)
    one_host = calibrated(cal_ps, net, cal_runs, one_host=True)
    est = {}
    for label, network in (("nominal", net), ("fitted_on_step_run", fitted),
                           ("calibrated", cal.apply(net)),
                           ("calibrated_without_diloco_runs", no_outer.apply(net))):
        e = {name: estimate(p, network) for name, p in placements.items()}
        est[label] = {name: {"iteration_s": v.iteration_s, "compute_s": v.compute_s,
                             "outer_sync_s": v.outer_sync_s,
                             "rel_error": abs(v.iteration_s - runs[name]["iteration_s"])
                             / runs[name]["iteration_s"]} for name, v in e.items()}
    ratio = runs["diloco"]["tokens_per_s"] / runs["step"]["tokens_per_s"]
    loss_diff = (runs["diloco"]["final_loss"] - runs["step"]["final_loss"]) / runs["step"]["final_loss"]
    out = {
        "date": started.strftime("%Y-%m-%d %H:%M UTC"),
        "command": "python -m bench.diloco_lab_bench" + (" --quick" if quick else "")
        + ("" if idle_restart else " --idle-restart 0")
        + (f" --outer-lr {outer_lr}" if outer_lr != OUTER_LR else "")
        + (f" --outer-momentum {outer_momentum}" if outer_momentum != OUTER_MOMENTUM else "")
        + (f" --inner-steps {inner_steps}" if inner_steps != INNER_STEPS else "")
        + (" --full-batch" if full_batch else "")
        + (f" --wan-mtu {wan_mtu or 0}" if wan_mtu != WAN_MTU else "")
        + (f" --every-host-steps {every_host_steps}" if every_host_steps is not None else "")
        + (f" --corpus {corpus}" if corpus != CORPUS else ""),
        "corpus": corpus,
        "diloco_batch": "full" if full_batch else "split",
        "tcp_slow_start_after_idle": idle_restart,
        "wan_path_mtu": wan_mtu,
        "outer": {"lr": outer_lr, "momentum": outer_momentum},
        "load_average_at_start": load_before,
        "lab": {"continents": [vars(s) for s in TOPOLOGY.sites],
                "wan": {"rtt_ms": WAN[0], "mbit_s": WAN[1]}, "intra": {"rtt_ms": 1.0, "mbit_s": 400.0}},
        "job": {"script": "examples/train_gpt.py", "layers": LAYERS, "dim": DIM, "seq_len": SEQ_LEN,
                "global_batch": GLOBAL_BATCH, "tokens_per_step": GLOBAL_BATCH * SEQ_LEN,
                "steps": steps, "warmup_steps_skipped": skip, "params": job.params,
                "gradient_dtype": job.gradient_dtype, "activation_dtype": job.activation_dtype},
        "bandwidth": {f"{a}>{b}": m for (a, b), m in bw.items()},
        "planning_s": plan_s,
        "runs": runs,
        "estimates": est,
        "throughput_factor_fitted": factor,
        "calibration": {"runs": cal_runs, "wall_s": cal_wall_s, "fitted": calibration_json(cal),
                        "without_diloco_runs": calibration_json(no_outer),
                        "one_host_fit": calibration_json(one_host),
                        "note": "fitted on the step placement's three calibration runs, "
                                "the run over every host (communication fitted beside it) and "
                                "the DiLoCo runs at small H (the outer-sync factor); "
                                "without_diloco_runs: the same but those; one_host_fit: the "
                                "two one-host runs alone (the per-step cost without an "
                                "all-reduce); none of the runs judged"},
        "estimate_target_judged_on": "calibrated",
        "tokens_per_s_ratio": ratio,
        "tokens_per_s_ratio_vs_step_every_host": (
            runs["diloco"]["tokens_per_s"] / runs["step_every_host"]["tokens_per_s"]
            if "step_every_host" in runs else None),
        "loss_rel_diff": loss_diff,
        "targets": TARGETS,
        "met": {"tokens_per_s_ratio": ratio >= TARGETS["tokens_per_s_ratio"],
                "loss_rel_diff": abs(loss_diff) <= TARGETS["loss_rel_diff"],
                "estimate_nominal": est["nominal"]["diloco"]["rel_error"] <= TARGETS["estimate_rel_error"],
                "estimate_fitted": est["fitted_on_step_run"]["diloco"]["rel_error"]
                <= TARGETS["estimate_rel_error"],
                "estimate_calibrated": est["calibrated"]["diloco"]["rel_error"]
                <= TARGETS["estimate_rel_error"]},
        "wall_s": time.monotonic() - t0,
    }
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "diloco_lab.json").write_text(json.dumps(out, indent=1))
    picture(out, out_dir / "diloco_lab.png")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.diloco_lab_bench")
    p.add_argument("--quick", action="store_true", help="60 steps instead of 200")
    p.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    p.add_argument("--idle-restart", type=int, choices=[0, 1], default=1,
                   help="net.ipv4.tcp_slow_start_after_idle in the lab's hosts (Linux's default is 1)")
    p.add_argument("--outer-lr", type=float, default=OUTER_LR)
    p.add_argument("--outer-momentum", type=float, default=OUTER_MOMENTUM)
    p.add_argument("--inner-steps", type=int, default=INNER_STEPS)
    p.add_argument("--full-batch", action="store_true",
                   help="each island the whole batch every inner step, half the steps")
    p.add_argument("--every-host-steps", type=int, default=None,
                   help=f"steps of the step job over all four hosts ({EVERY_HOST_STEPS}; "
                        f"{EVERY_HOST_QUICK} with --quick; 0: not run)")
    p.add_argument("--wan-mtu", type=int, default=WAN_MTU,
                   help="path MTU between the continents (0: the lab's own)")
    p.add_argument("--corpus", choices=["builtin", "markov"], default=CORPUS,
                   help="train_gpt.py's text (markov, the default: one the model cannot "
                        "memorise; builtin: the paragraph it learns by heart)")
    a = p.parse_args(argv)
    try:
        result = bench(a.out, quick=a.quick, log=lambda s: print(s, flush=True),
                       idle_restart=a.idle_restart, outer_lr=a.outer_lr,
                       outer_momentum=a.outer_momentum, inner_steps=a.inner_steps,
                       full_batch=a.full_batch, wan_mtu=a.wan_mtu or None,
                       every_host_steps=a.every_host_steps, corpus=a.corpus)
    except LabError as err:
        print(f"diloco_lab_bench: {err}", file=sys.stderr)
        return 2
    print(summarize(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
