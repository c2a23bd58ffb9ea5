"""docs/COSTMODEL.md section 9: the cost of a low-communication (DiLoCo) placement.

A literal reading of the section, built only from planner/core/costmodel.py's building blocks
(micro-batch count, stage compute, pipeline hop, pipeline time, ring all-reduce, memory), so the
two cannot drift. estimate() dispatches here when a placement has an outer sync.
"""

from __future__ import annotations

import math

import numpy as np

from planner.core.costmodel import (
    Estimate, Placement, allreduce_s, gradient_bytes, micro_batches, outer_state_bytes,
    pipeline_s, pseudo_gradient_bytes, ring_links, stage_compute_s, stage_memory_bytes,
    transfer_s,
)
from planner.core.fleet import Network


def outer_group(placement: Placement) -> np.ndarray:
    """(K, I) node indices: per stage, the node of each island's first replica, the ring the
    outer all-reduce runs over (within an island every replica of a stage holds the same
    pseudo-gradient, so one node per island speaks for it)."""
    nodes = placement.node_matrix()
    return nodes[:, [lo for lo, _ in placement.island_columns()]]


def outer_allreduce_s(placement: Placement, net: Network) -> float:
    """T_outer: the slowest stage's ring all-reduce of its c P l / L pseudo-gradient bytes over
    its outer group; 0 with one island."""
    group = outer_group(placement)
    islands = group.shape[1]
    if islands < 2:
        return 0.0
    layers = np.array([st.layers for st in placement.stages], dtype=float)
    a_max, bw_min = ring_links(net, group)
    nbytes = pseudo_gradient_bytes(placement.job, layers, placement.outer.compression)
    return float(allreduce_s(islands, a_max, nbytes, bw_min).max())


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
    pipe = pipeline_s(compute, transfer, m)             # (D,)
    pipe_compute = pipeline_s(compute, None, m)

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

    outer_s = outer_allreduce_s(placement, net)
    h = outer.inner_steps
    exposed = exposed_outer_s(outer_s, inner, h, outer.streaming_fragments)
    iteration = inner + exposed / h
    compute_s = float(pipe_compute.max())

    need = (stage_memory_bytes(job, layers, b, m, k_stages) + outer_state_bytes(job, layers))
    mem = net.mem[nodes]
    fraction = float((need[:, None] / mem).max()) if mem.min() > 0 else math.inf
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
    )
