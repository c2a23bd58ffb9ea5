"""The reference cost model of docs/COSTMODEL.md (sections 3-5, 7), over node indices of a Network.

Every number a plan prints comes from :func:`estimate` and :func:`estimate_plan`; every planner
(baselines, DT-FM-style peer, search, GNN) is judged by them. Keep this module a literal reading of
the document: richer models go beside it as options, never into it.

It is also the only home of the formulas' building blocks (stage and layer memory, micro-batch
count, stage compute, pipeline hop, pipeline time, ring all-reduce, compute floor): the search's screens, the
baselines, Algorithm 1 and the GNN features call them, so they cannot drift from estimate().
The per-layer forms the screens use (:func:`layer_memory_bytes`, :func:`allreduce_terms`) agree
with it up to rounding; tests/planner/core/test_costmodel_agreement.py checks every promise.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from hulk.plural import count
from planner.core.fleet import Network
from planner.core.jobs import COMPRESSION_BYTES, DTYPE_BYTES, Job

BYTES_PER_OUTER_STATE = 8   # fp32 anchor + fp32 outer Nesterov momentum per parameter


@dataclass(frozen=True)
class Stage:
    """Pipeline stage owning layers [lo, hi) on ``nodes``; the p-th node is in replica p."""

    lo: int
    hi: int
    nodes: tuple[int, ...]

    @property
    def layers(self) -> int:
        return self.hi - self.lo


@dataclass(frozen=True)
class OuterSync:
    """What a plan chose for a low-communication job (docs/COSTMODEL.md section 9): islands
    average their pseudo-gradients every ``inner_steps`` steps at ``compression``'s bytes per
    value, in ``streaming_fragments`` staggered fragments (0: the whole model at once)."""

    inner_steps: int
    compression: str
    streaming_fragments: int = 0


@dataclass(frozen=True)
class Placement:
    """One job's placement: K stages in pipeline order, the same D nodes per stage.

    ``islands``: replicas per island, the replica columns 0..D-1 split into contiguous blocks
    (empty: one synchronous group); ``outer``: the islands' outer sync (None: ``sync: step``)."""

    job: Job
    stages: tuple[Stage, ...]
    micro_batch: int
    phase: int = 0
    islands: tuple[int, ...] = ()
    outer: OuterSync | None = None

    def island_sizes(self) -> tuple[int, ...]:
        """Replicas per island; one island of every replica when ``islands`` is empty."""
        return self.islands or (self.replicas,)

    def island_columns(self) -> list[tuple[int, int]]:
        """[lo, hi) replica columns of each island."""
        out, lo = [], 0
        for size in self.island_sizes():
            out.append((lo, lo + size))
            lo += size
        return out

    @property
    def num_stages(self) -> int:
        return len(self.stages)

    @property
    def replicas(self) -> int:
        return len(self.stages[0].nodes) if self.stages else 0

    @property
    def nodes(self) -> list[int]:
        return [i for st in self.stages for i in st.nodes]

    def node_matrix(self) -> np.ndarray:
        """(K, D) array of node indices."""
        return np.array([st.nodes for st in self.stages], dtype=np.int64)


@dataclass(frozen=True)
class Estimate:
    """docs/COSTMODEL.md section 4 for one placement; times in seconds."""

    iteration_s: float
    compute_s: float
    communication_s: float
    job_s: float
    micro_batches: int
    pipeline_s: float          # max over replicas of T_pipe
    allreduce_s: float         # max over stages of T_ar
    memory_ok: bool
    peak_memory_fraction: float  # worst node's need / its memory
    outer_sync_s: float = 0.0  # one outer all-reduce of a low-communication job (section 9)
    inner_step_s: float = 0.0  # its step without the outer sync (0: a sync: step placement)
    inner_steps: int = 1       # H: its steps per outer sync

    @property
    def median_step_s(self) -> float:
        """The step time a median over a run's steps measures (:func:`median_is_inner`)."""
        return self.inner_step_s if median_is_inner(self.inner_steps) else self.iteration_s

    @property
    def feasible(self) -> bool:
        return self.memory_ok and math.isfinite(self.iteration_s)


def median_is_inner(inner_steps: int) -> bool:
    """Whether the median over a run's steps of a job syncing every ``inner_steps`` steps is an
    inner step, with no outer sync in it: for H > 2 (only every H-th step pays the outer sync);
    with H = 2 the median of alternating short and long steps is their mean, the iteration."""
    return inner_steps > 2


INFEASIBLE = Estimate(math.inf, math.inf, math.inf, math.inf, 0, math.inf, math.inf, False, math.inf)


def micro_batches(job: Job, replicas: int, micro_batch: int) -> int:
    """M = ceil(B / D / b)."""
    return math.ceil(job.global_batch / replicas / micro_batch)


def stage_memory_bytes(job: Job, layers, micro_batch: int, num_micro_batches: int,
                       num_stages: int):
    """Bytes every node of a stage with ``layers`` layers (an int or an array of them) holds:
    16 P l/L + A l min(M, K)."""
    return (job.state_bytes * layers / job.layers
            + job.activation_bytes(micro_batch) * layers * min(num_micro_batches, num_stages))


def layer_memory_bytes(job: Job, micro_batch: int, num_micro_batches: int,
                       num_stages: int) -> float:
    """Bytes one layer adds on every node of its stage: 16 P / L + A min(M, K), the slope of
    :func:`stage_memory_bytes` (a node of memory m holds floor(m / this) layers, up to
    rounding)."""
    return (job.state_bytes / job.layers
            + job.activation_bytes(micro_batch) * min(num_micro_batches, num_stages))


def outer_state_bytes(job: Job, layers):
    """8 P l / L: the outer optimizer's state (fp32 anchor and momentum) of ``layers`` layers,
    which every node of a low-communication job holds beside its training state (section 9)."""
    return BYTES_PER_OUTER_STATE * job.params * layers / job.layers


def pseudo_gradient_bytes(job: Job, layers, compression: str):
    """c P l / L: bytes of the pseudo-gradients of ``layers`` layers at ``compression``'s c bytes
    per value (section 9)."""
    return COMPRESSION_BYTES[compression] * job.params * layers / job.layers


def whole_model_bytes(job: Job) -> float:
    """Bytes one node holding every layer needs at the job's micro-batch: 16 P + A L, that is
    :func:`stage_memory_bytes` with l = L and K = 1 (without the l / L, which can round)."""
    return job.state_bytes + job.activation_bytes() * job.layers


def max_replicas(job: Job, total_memory: float) -> int:
    """Most data-parallel replicas ``total_memory`` bytes can hold: each replica holds the
    model's whole state, 16 P (activations left out, so an upper bound)."""
    return int(total_memory // job.state_bytes)


def problems(placement: Placement, net: Network) -> list[str]:
    """Why a placement is not a valid plan (empty when it is). Pure structure and memory."""
    job, stages = placement.job, placement.stages
    out: list[str] = []
    if not stages:
        return [f"{job.name}: no stages"]
    if stages[0].lo != 0 or stages[-1].hi != job.layers:
        out.append(f"{job.name}: layers must cover [0, {job.layers})")
    for a, b in zip(stages, stages[1:]):
        if a.hi != b.lo:
            out.append(f"{job.name}: layer ranges [{a.lo},{a.hi}) and [{b.lo},{b.hi}) are not contiguous")
    if any(st.layers <= 0 for st in stages):
        out.append(f"{job.name}: a stage has no layers")
    widths = {len(st.nodes) for st in stages}
    if len(widths) != 1 or 0 in widths:
        out.append(f"{job.name}: every stage must list the same, non-zero number of nodes")
        return out
    used = placement.nodes
    if len(set(used)) != len(used):
        out.append(f"{job.name}: a node appears twice")
    if placement.micro_batch < 1:
        out.append(f"{job.name}: micro-batch must be at least 1")
        return out
    islands = placement.island_sizes()
    if min(islands) < 1 or sum(islands) != placement.replicas:
        out.append(f"{job.name}: islands {list(islands)} must be positive and sum to the "
                   f"{count(placement.replicas, 'replica')}")
    if placement.outer is None and len(islands) > 1:
        out.append(f"{job.name}: {len(islands)} islands need an outer sync")
    m = micro_batches(job, placement.replicas, placement.micro_batch)
    for k, st in enumerate(stages):
        need = stage_memory_bytes(job, st.layers, placement.micro_batch, m, len(stages))
        if placement.outer is not None:
            need += outer_state_bytes(job, st.layers)
        for i in st.nodes:
            if need > net.mem[i]:
                out.append(f"{job.name}: stage {k} needs {need / 1e9:.1f} GB on node "
                           f"{net.nodes[i].id}, which has {net.mem[i] / 1e9:.1f} GB")
    return out


def transfer_s(net: Network, src, dst, act: float):
    """Seconds of one pipeline hop from ``src`` to ``dst`` (node indices or arrays of them):
    :func:`hop_s` over their link. Between components bw is 0 and RTT inf: inf, with numpy's
    divide warning unless the caller silences it. Every planner's hop goes through here."""
    return hop_s(net.rtt_ms[src, dst], net.bw[src, dst], act, net.hop_overhead_s)


def hop_s(rtt_ms, bw, act: float, overhead_s: float = 0.0):
    """2 (a + A / bw) + h, a = RTT / 2, for activations of ``act`` bytes over a link of ``rtt_ms``
    and ``bw`` bytes/s (section 4), h the network's ``hop_overhead_s`` (0 in the reference model,
    where it is not even added, so every number stays bit for bit)."""
    hop = 2.0 * (rtt_ms / 2000.0 + act / bw)
    return hop + overhead_s if overhead_s else hop


def stage_compute_s(flops_per_layer: float, layers, thr, net: Network):
    """Seconds one stage of ``layers`` layers (a number or an array) computes one micro-batch
    on nodes of throughput ``thr``: f l / thr + o, o the network's ``micro_batch_overhead_s``
    (0 in the reference model, where it is not even added, so every number stays bit for
    bit). Every planner's stage time goes through here."""
    c = flops_per_layer * layers / thr
    return c + net.micro_batch_overhead_s if net.micro_batch_overhead_s else c


def replica_step_s(pipe, net: Network):
    """A replica's iteration before the all-reduce: its pipeline time (a number or an array)
    plus s, the network's ``step_overhead_s``, the per-iteration work no micro-batch count
    scales (optimizer step, framework); 0 in the reference model, where it is not even added,
    so every number stays bit for bit."""
    return pipe + net.step_overhead_s if net.step_overhead_s else pipe


def pipeline_s(compute, transfer, num_micro_batches: int):
    """T_pipe = sum_k c_k + sum_k x_k + (M - 1) max(max_k c_k, max_k x_k) over the stages
    (axis 0) of ``compute`` (K, ...) and ``transfer`` (K - 1, ...): one time per replica.
    ``transfer`` None leaves the hops out (the compute part of the pipeline)."""
    if transfer is None:
        return compute.sum(axis=0) + (num_micro_batches - 1) * compute.max(axis=0)
    longest = np.maximum(compute.max(axis=0), transfer.max(axis=0, initial=0.0))
    return compute.sum(axis=0) + transfer.sum(axis=0) + (num_micro_batches - 1) * longest


def ring_links(net: Network, grid: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(a_max, bw_min) of each row of ``grid`` (K, D) taken as a cyclic ring: the largest
    one-way latency a = RTT / 2 (seconds) and the smallest bandwidth between ring neighbours."""
    ring_next = np.concatenate((grid[:, 1:], grid[:, :1]), axis=1)   # np.roll(grid, -1, 1)
    a_max = (net.rtt_ms[grid, ring_next] / 2000.0).max(axis=1)
    bw_min = net.bw[grid, ring_next].min(axis=1)
    return a_max, bw_min


def gradient_bytes(job: Job, layers):
    """S = g P l / L: bytes of the gradients of ``layers`` layers, g the bytes of the job's
    ``gradient_dtype`` (2 for fp16, the default; 4 for fp32)."""
    return float(DTYPE_BYTES[job.gradient_dtype]) * job.params * layers / job.layers


def allreduce_s(replicas: int, a_max, nbytes, bw_min):
    """Ring all-reduce of ``nbytes`` over ``replicas`` nodes: 2 (D - 1) (a_max + S / (D bw_min))."""
    return 2.0 * (replicas - 1) * (a_max + nbytes / (replicas * bw_min))


def allreduce_terms(replicas: int, a_max, layer_bytes, bw_min):
    """:func:`allreduce_s` split as base + per_layer * l for screens that vary a stage's layer
    count l (equal up to rounding): (2 (D - 1) a_max, 2 (D - 1) S_1 / (D bw_min)), S_1 the
    bytes of one layer."""
    base = 2.0 * (replicas - 1) * a_max
    per_layer = 2.0 * (replicas - 1) * layer_bytes / (replicas * bw_min)
    return base, per_layer


def compute_floor_s(flops: float, throughput: float) -> float:
    """Least seconds ``flops`` FLOPs take on nodes of summed ``throughput`` FLOP/s: within an
    iteration every node computes its share of the micro-batches, so no placement is faster."""
    return flops / throughput


def memory_fraction(need, mem: np.ndarray) -> float:
    """Peak memory use: the worst node's need / its memory, for per-stage ``need`` (K,) over
    the (K, D) memories of the nodes holding each stage; inf when a node has no memory."""
    return float((need[:, None] / mem).max()) if mem.min() > 0 else math.inf


def estimate(placement: Placement, net: Network) -> Estimate:
    """Iteration time T = max_p T_pipe(p) + max_k T_ar(k), its compute and communication parts;
    a placement with an outer sync is priced by section 9 (planner/core/costmodel_sync.py)."""
    # Links between components have bw 0 and rtt inf: the division gives inf, which is the answer.
    with np.errstate(divide="ignore", invalid="ignore"):
        if placement.outer is not None:
            from planner.core.costmodel_sync import estimate_outer   # it builds on this module
            return estimate_outer(placement, net)
        return _estimate(placement, net)


def _estimate(placement: Placement, net: Network) -> Estimate:
    job, b = placement.job, placement.micro_batch
    nodes = placement.node_matrix()                     # (K, D)
    k_stages, d = nodes.shape
    m = micro_batches(job, d, b)
    layers = np.array([st.layers for st in placement.stages], dtype=float)  # (K,)

    f = job.flops_per_layer(b)
    act = job.activation_bytes(b)
    compute = stage_compute_s(f, layers[:, None], net.thr[nodes], net)   # c_k, (K, D)

    if k_stages > 1:
        src, dst = nodes[:-1], nodes[1:]                # (K-1, D)
        transfer = transfer_s(net, src, dst, act)
    else:
        transfer = np.zeros((0, d))
    pipe = replica_step_s(pipeline_s(compute, transfer, m), net)   # T_pipe(p) + s, (D,)
    pipe_compute = replica_step_s(pipeline_s(compute, None, m), net)

    if d > 1:
        a_max, bw_min = ring_links(net, nodes)          # (K,)
        allreduce = allreduce_s(d, a_max, gradient_bytes(job, layers), bw_min)
    else:
        allreduce = np.zeros(k_stages)

    pipe_max = float(pipe.max())
    allreduce_max = float(allreduce.max())
    iteration = pipe_max + allreduce_max
    compute_s = float(pipe_compute.max())

    fraction = memory_fraction(stage_memory_bytes(job, layers, b, m, k_stages), net.mem[nodes])
    return Estimate(
        iteration_s=iteration,
        compute_s=compute_s,
        communication_s=iteration - compute_s,
        job_s=job.steps * iteration,
        micro_batches=m,
        pipeline_s=pipe_max,
        allreduce_s=allreduce_max,
        memory_ok=fraction <= 1.0,
        peak_memory_fraction=fraction,
    )


@dataclass(frozen=True)
class PlanEstimate:
    """docs/COSTMODEL.md section 5: phases run one after another, jobs of a phase side by side."""

    estimates: dict[str, Estimate]
    start_s: dict[str, float]
    end_s: dict[str, float]
    makespan_s: float
    sum_jct_s: float
    phase_end_s: list[float] = field(default_factory=list)


def estimate_plan(placements: list[Placement], net: Network) -> PlanEstimate:
    """Makespan and sum of job completion times of placements grouped in phases."""
    estimates = {p.job.name: estimate(p, net) for p in placements}
    phases = sorted({p.phase for p in placements})
    start: dict[str, float] = {}
    end: dict[str, float] = {}
    phase_end: list[float] = []
    t = 0.0
    for phase in phases:
        longest = 0.0
        for p in placements:
            if p.phase == phase:
                start[p.job.name] = t
                end[p.job.name] = t + estimates[p.job.name].job_s
                longest = max(longest, estimates[p.job.name].job_s)
        t += longest
        phase_end.append(t)
    return PlanEstimate(estimates, start, end, makespan_s=t if placements else 0.0,
                        sum_jct_s=sum(end.values()), phase_end_s=phase_end)


def sequential_totals(job_times: dict[str, float]) -> tuple[float, float]:
    """Jobs one after another, shortest first: (makespan, sum of completion times)."""
    t, total = 0.0, 0.0
    for duration in sorted(job_times.values()):
        t += duration
        total += t
    return t, total


def compute_bound_s(jobs: list[Job], net: Network) -> float:
    """docs/COSTMODEL.md section 7: all jobs' FLOPs over the whole fleet's summed throughput."""
    return compute_floor_s(sum(j.total_flops for j in jobs), float(net.thr.sum()))
