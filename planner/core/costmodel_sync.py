"""docs/COSTMODEL.md section 9: the cost of a low-communication (DiLoCo) placement.

A literal reading of the section, built only from planner/core/costmodel.py's building blocks
(micro-batch count, stage compute, pipeline hop, pipeline time, ring all-reduce, memory), so the
two cannot drift; the outer exchange is priced as examples/diloco.py runs it. estimate()
dispatches here when a placement has an outer sync.
"""

from __future__ import annotations

import math

import numpy as np

from planner.core.costmodel import (
    Estimate, Placement, allreduce_s, gradient_bytes, memory_fraction, micro_batches,
    outer_state_bytes,
    pipeline_s, pseudo_gradient_bytes, replica_step_s, ring_links, stage_compute_s,
    stage_memory_bytes, transfer_s,
)
from planner.core.fleet import Network


def outer_group(placement: Placement) -> np.ndarray:
    """(K, I) node indices: per stage, the node of each island's first replica, the ring the
    outer exchange runs over (within an island every replica of a stage holds the same
    pseudo-gradient, so one node per island speaks for it)."""
    nodes = placement.node_matrix()
    return nodes[:, [lo for lo, _ in placement.island_columns()]]


def allgather_s(members: int, a_max, nbytes, bw_min):
    """Ring all_gather of ``nbytes`` from each of ``members`` nodes: (n - 1) (a_max + S / bw_min)
    (every node receives the n - 1 others' whole buffers, one neighbour hop at a time)."""
    return (members - 1) * (a_max + nbytes / bw_min)


def broadcast_s(members: int, a_max, nbytes, bw_min):
    """Binomial-tree broadcast of ``nbytes`` to ``members`` nodes: ceil(log2 n) (a_max + S /
    bw_min); 0 for one node."""
    rounds = math.ceil(math.log2(members)) if members > 1 else 0
    return rounds * (a_max + nbytes / bw_min)


def outer_exchange_s(placement: Placement, net: Network) -> float:
    """The slowest stage's exchange of its c P l / L pseudo-gradient bytes among its outer group,
    as the trainer runs it: a ring all-reduce of fp32 for ``none``; for ``bf16`` and ``int8``
    an all_gather (each leader averages the gathered copies itself); 0 with one island."""
    group = outer_group(placement)
    islands = group.shape[1]
    if islands < 2:
        return 0.0
    layers = np.array([st.layers for st in placement.stages], dtype=float)
    a_max, bw_min = ring_links(net, group)
    nbytes = pseudo_gradient_bytes(placement.job, layers, placement.outer.compression)
    if placement.outer.compression == "none":
        return float(allreduce_s(islands, a_max, nbytes, bw_min).max())
    return float(allgather_s(islands, a_max, nbytes, bw_min).max())


def island_broadcast_s(placement: Placement, net: Network) -> float:
    """The slowest broadcast of the averaged fp32 pseudo-gradient (4 P l / L bytes) from each
    island's leader to the island's other replicas of its stage; 0 when every island has one
    replica or there is one island (no outer step to share)."""
    nodes = placement.node_matrix()
    columns = placement.island_columns()
    if len(columns) < 2:
        return 0.0
    layers = np.array([st.layers for st in placement.stages], dtype=float)
    nbytes = pseudo_gradient_bytes(placement.job, layers, "none")
    worst = 0.0
    for lo, hi in columns:
        if hi - lo > 1:
            a_max, bw_min = ring_links(net, nodes[:, lo:hi])
            worst = max(worst, float(broadcast_s(hi - lo, a_max, nbytes, bw_min).max()))
    return worst


def outer_sync_s(placement: Placement, net: Network) -> float:
    """T_outer: the exchange among island leaders, then the broadcast within the islands, times
    the network's ``outer_sync_factor`` (1 in the reference model; section 8)."""
    priced = outer_exchange_s(placement, net) + island_broadcast_s(placement, net)
    return priced * net.outer_sync_factor if net.outer_sync_factor != 1.0 else priced


def exposed_outer_s(outer_s: float, inner_step_s: float, inner_steps: int,
                    fragments: int) -> float:
    """Seconds of one outer round that no inner step hides. Without streaming the islands wait
    for the whole all-reduce; with F fragments each fragment's all-reduce runs under the inner
    steps that follow it, but one fragment's worth stays exposed: max(T_outer / F,
    T_outer - H T_inner)."""
    if fragments <= 0:
        return outer_s
    return max(outer_s / fragments, outer_s - inner_steps * inner_step_s)


def estimate_outer(placement: Placement, net: Network) -> Estimate:
    """Section 8: T_inner = max over islands of (its pipeline + the all-reduce among its own
    replicas), M = ceil(B / D / b) with D every island's replicas; iteration_s = T_inner +
    exposed / H; job_s = steps T_inner + ceil(steps / H) exposed."""
    job, b, outer = placement.job, placement.micro_batch, placement.outer
    nodes = placement.node_matrix()                     # (K, D)
    k_stages, d = nodes.shape
    m = micro_batches(job, d, b)
    layers = np.array([st.layers for st in placement.stages], dtype=float)

    compute = stage_compute_s(job.flops_per_layer(b), layers[:, None], net.thr[nodes], net)
    if k_stages > 1:
        transfer = transfer_s(net, nodes[:-1], nodes[1:], job.activation_bytes(b))
    else:
        transfer = np.zeros((0, d))
    pipe = replica_step_s(pipeline_s(compute, transfer, m), net)   # every inner step pays s
    pipe_compute = replica_step_s(pipeline_s(compute, None, m), net)

    inner, pipe_max, allreduce_max = 0.0, 0.0, 0.0
    for lo, hi in placement.island_columns():
        size = hi - lo
        island_pipe = float(pipe[lo:hi].max())
        if size > 1:
            a_max, bw_min = ring_links(net, nodes[:, lo:hi])
            island_ar = float(allreduce_s(size, a_max, gradient_bytes(job, layers), bw_min).max())
        else:
            island_ar = 0.0
        inner = max(inner, island_pipe + island_ar)
        pipe_max = max(pipe_max, island_pipe)
        allreduce_max = max(allreduce_max, island_ar)

    outer_s = outer_sync_s(placement, net)
    h = outer.inner_steps
    exposed = exposed_outer_s(outer_s, inner, h, outer.streaming_fragments)
    iteration = inner + exposed / h
    compute_s = float(pipe_compute.max())

    need = (stage_memory_bytes(job, layers, b, m, k_stages) + outer_state_bytes(job, layers))
    fraction = memory_fraction(need, net.mem[nodes])
    return Estimate(
        iteration_s=iteration,
        compute_s=compute_s,
        communication_s=iteration - compute_s,
        job_s=job.steps * inner + math.ceil(job.steps / h) * exposed,
        micro_batches=m,
        pipeline_s=pipe_max,
        allreduce_s=allreduce_max,
        memory_ok=fraction <= 1.0,
        peak_memory_fraction=fraction,
        outer_sync_s=outer_s,
        inner_step_s=inner,
        inner_steps=h,
    )
