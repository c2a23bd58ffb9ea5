"""The paper's baselines, exactly as docs/COSTMODEL.md section 6 defines them (pure).

Each job runs alone on the whole fleet; jobs run one after another, shortest first. Systems A and
B are written as Placements whose phases 0, 1, 2, ... follow that order, so ``estimate_plan``
gives the sequential totals. System C (tensor parallel) cannot be written as pipeline stages: its
per-job times travel in ``Plan.job_s_override`` (and the breakdown in ``estimate_override``).
"""

from __future__ import annotations

import math

import numpy as np

from hulk.plural import count as plural
from planner.core import costmodel as cm
from planner.core.costmodel import (Estimate, Placement, Stage, estimate, micro_batches,
                                    sequential_totals)
from planner.core.fleet import Network
from planner.core.jobs import Job
from planner.core.plan import Plan, Unplaced

GB = 1e9


def nearest_neighbour_chain(net: Network, nodes: list[int] | np.ndarray) -> list[int]:
    """Order ``nodes`` starting from the lowest index, each next the nearest (lowest RTT) unvisited
    one; ties go to the lower index."""
    remaining = sorted(int(i) for i in nodes)
    if not remaining:
        return []
    left = np.array(remaining, dtype=np.int64)
    alive = np.ones(len(left), dtype=bool)
    chain = [int(left[0])]
    alive[0] = False
    for _ in range(len(left) - 1):
        row = net.rtt_ms[chain[-1], left]
        row = np.where(alive, row, np.inf)
        candidates = np.flatnonzero(alive)
        pick = candidates[np.argmin(row[candidates])]   # argmin takes the first (lowest index) tie
        chain.append(int(left[pick]))
        alive[pick] = False
    return chain


def _order_shortest_first(placements: list[Placement], times: dict[str, float]) -> list[Placement]:
    order = sorted(placements, key=lambda p: (times[p.job.name], p.job.name))
    return [Placement(p.job, p.stages, p.micro_batch, phase=k) for k, p in enumerate(order)]


# ----------------------------------------------------------------------------------- System A

def system_a_placement(job: Job, net: Network) -> Placement | Unplaced:
    """Data parallel: every node holding the whole model (16 P + A L bytes) is a replica, K = 1."""
    need = cm.whole_model_bytes(job)
    holders = np.flatnonzero(net.mem >= need).tolist()
    if not holders:
        biggest = float(net.mem.max()) if net.n else 0.0
        return Unplaced(job.name, f"System A: no node holds the whole model ({need / GB:.1f} GB "
                                  f"needed, the largest node has {biggest / GB:.1f} GB)")
    placement = Placement(job, (Stage(0, job.layers, tuple(holders)),), job.micro_batch)
    if not math.isfinite(estimate(placement, net).iteration_s):
        return Unplaced(job.name, "System A: the nodes that hold the model cannot all "
                                  "communicate (the fleet is split)")
    return placement


# ----------------------------------------------------------------------------------- System B

def _per_layer_bytes(job: Job, num_stages: int) -> float:
    """One layer's memory on a GPipe stage (D = 1): 16 P / L + A min(M, K)."""
    m = micro_batches(job, 1, job.micro_batch)
    return cm.layer_memory_bytes(job, job.micro_batch, m, num_stages)


def _proportional_layers(total: int, weights: np.ndarray, caps: np.ndarray) -> np.ndarray | None:
    """Integers >= 1 and <= caps summing to ``total``, as close to proportional to ``weights`` as
    the caps allow (capped entries fixed, the rest re-shared; largest remainder rounding)."""
    k = len(weights)
    if k == 0 or caps.sum() < total or (caps < 1).any() or total < k:
        return None
    share = np.zeros(k)
    free = np.ones(k, dtype=bool)
    remaining = float(total)
    while True:  # water-filling: fix entries whose share exceeds their cap
        ideal = np.where(free, remaining * weights / weights[free].sum(), share)
        over = free & (ideal > caps)
        if not over.any():
            share = np.where(free, ideal, share)
            break
        share[over] = caps[over]
        free &= ~over
        remaining = total - share[~free].sum()
    layers = np.clip(np.floor(share).astype(int), 1, caps)
    # Largest remainder first (ties: lower position), within caps; take back from smallest if over.
    while layers.sum() < total:
        room = layers < caps
        gap = np.where(room, share - layers, -np.inf)
        layers[int(np.argmax(gap))] += 1
    while layers.sum() > total:
        spare = layers > 1
        gap = np.where(spare, layers - share, -np.inf)
        layers[int(np.argmax(gap))] -= 1
    return layers


def system_b_placement(job: Job, net: Network) -> Placement | Unplaced:
    """GPipe: one stage per node over all nodes (the L fastest if there are more nodes than layers;
    nodes that cannot hold one layer left out), layers in proportion to throughput within memory,
    nodes chained nearest-neighbour first from the lowest index."""
    if net.n == 0:
        return Unplaced(job.name, "System B: the fleet has no nodes")
    # The largest K such that at least K nodes hold one layer when there are K stages.
    k = min(job.layers, net.n)
    while k >= 1:
        eligible = np.flatnonzero(net.mem >= _per_layer_bytes(job, k))
        if len(eligible) >= k:
            break
        k -= 1
    if k < 1:
        return Unplaced(job.name, f"System B: no node holds one layer "
                                  f"({_per_layer_bytes(job, 1) / GB:.1f} GB needed)")
    # The k fastest eligible nodes (ties: lower index).
    order = sorted(eligible.tolist(), key=lambda i: (-net.thr[i], i))
    chosen = nearest_neighbour_chain(net, order[:k])
    per_layer = _per_layer_bytes(job, k)
    caps = np.floor(net.mem[chosen] / per_layer).astype(int)
    layers = _proportional_layers(job.layers, net.thr[chosen], caps)
    if layers is None:
        return Unplaced(job.name, f"System B: the pipeline's {plural(k, 'node')} cannot hold the model "
                                  f"({job.layers} layers, room for {int(caps.sum())})")
    stages, lo = [], 0
    for node, count in zip(chosen, layers.tolist()):
        stages.append(Stage(lo, lo + count, (node,)))
        lo += count
    placement = Placement(job, tuple(stages), job.micro_batch)
    if not math.isfinite(estimate(placement, net).iteration_s):
        return Unplaced(job.name, "System B: the pipeline's nodes cannot all communicate "
                                  "(the fleet is split)")
    return placement


# ----------------------------------------------------------------------------------- System C

def ring_allreduce_s(net: Network, ring: list[int], nbytes: float) -> float:
    """2 (n - 1) (a_max + S / (n bw_min)) over the cyclic ring (docs/COSTMODEL.md section 4)."""
    n = len(ring)
    if n <= 1:
        return 0.0
    a_max, bw_min = (float(x[0]) for x in cm.ring_links(net, np.array(ring)[None, :]))
    if not math.isfinite(a_max) or bw_min <= 0:
        return math.inf
    return cm.allreduce_s(n, a_max, nbytes, bw_min)


def system_c_estimate(job: Job, net: Network, ring: list[int] | None = None) -> Estimate | Unplaced:
    """Megatron tensor parallel over all n nodes: compute 6 P s B / (n min thr) per iteration plus,
    for each of ceil(B / b) micro-batches and each layer, 4 ring all-reduces of A bytes."""
    n = net.n
    if n == 0:
        return Unplaced(job.name, "System C: the fleet has no nodes")
    share = job.state_bytes / n
    short = int(np.argmin(net.mem))
    if share > net.mem[short]:
        return Unplaced(job.name, f"System C: each node must hold {share / GB:.1f} GB, node "
                                  f"{net.nodes[short].id} has {net.mem[short] / GB:.1f} GB")
    ring = ring if ring is not None else nearest_neighbour_chain(net, range(n))
    # Every node computes 1/n of the iteration's 6 P s B FLOPs at the slowest node's pace.
    compute = cm.compute_floor_s(6.0 * job.params * job.seq_len * job.global_batch,
                                 n * float(net.thr.min()))
    m = micro_batches(job, 1, job.micro_batch)
    communication = m * job.layers * 4 * ring_allreduce_s(net, ring, job.activation_bytes())
    if not math.isfinite(communication):
        return Unplaced(job.name, "System C: the nodes cannot all communicate (the fleet is split)")
    iteration = compute + communication
    return Estimate(iteration_s=iteration, compute_s=compute, communication_s=communication,
                    job_s=job.steps * iteration, micro_batches=m, pipeline_s=iteration,
                    allreduce_s=communication, memory_ok=True,
                    peak_memory_fraction=float((share / net.mem).max()))


# ----------------------------------------------------------------------------------- plans

def _staged_plan(method: str, jobs: list[Job], net: Network, place) -> Plan:
    placements: list[Placement] = []
    unplaced: list[Unplaced] = []
    times: dict[str, float] = {}
    for job in jobs:
        result = place(job, net)
        if isinstance(result, Unplaced):
            unplaced.append(result)
        else:
            placements.append(result)
            times[job.name] = estimate(result, net).job_s
    return Plan(method, _order_shortest_first(placements, times), unplaced,
                notes=["each job alone on the whole fleet; jobs one after another, shortest first"])


def plan_system_a(jobs: list[Job], net: Network, *, progress=None) -> Plan:
    return _staged_plan("system-a", jobs, net, system_a_placement)


def plan_system_b(jobs: list[Job], net: Network, *, progress=None) -> Plan:
    return _staged_plan("system-b", jobs, net, system_b_placement)


def plan_system_c(jobs: list[Job], net: Network, *, progress=None) -> Plan:
    ring = nearest_neighbour_chain(net, range(net.n)) if net.n else []
    plan = Plan("system-c", [], notes=[
        "tensor parallel over all nodes; not expressible as pipeline stages",
        "each job alone on the whole fleet; jobs one after another, shortest first"])
    for job in jobs:
        result = system_c_estimate(job, net, ring)
        if isinstance(result, Unplaced):
            plan.unplaced.append(result)
        else:
            plan.job_s_override[job.name] = result.job_s
            plan.estimate_override[job.name] = result
    return plan


def system_c_totals(plan: Plan) -> tuple[float, float]:
    """Makespan and sum of completion times of the override jobs run shortest first."""
    return sequential_totals(plan.job_s_override)
