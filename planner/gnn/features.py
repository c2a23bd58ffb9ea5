"""From (jobs, Network) to the tensors the GNN reads: nodes, edges, jobs and node-job pairs.

Nothing here reads the gazetteer: a node's place is described by what the RTT matrix says about
it (a classical-MDS embedding of the measured/completed RTTs against landmark nodes, how far it
sits from the fleet's centre, how much of the fleet's throughput lies within 3, 15 and 60 ms of
it), so a fleet of cloud regions or of unknown city names gets the same kind of features as a
fleet of gazetteer cities.

Jobs are a set, not slots: each job is one row of ``job_x`` (its size relative to the fleet), and
every (node, job) pair gets a row of ``pair_x`` (how many of the job's layers the node can hold).
There is no limit on the number of jobs. The only order-derived job feature is the job's FLOP
rank divided by the job count (ties: memory, name), which breaks the symmetry between otherwise
identical jobs; the rank does not depend on the order of the jobs list.

The graph is sparse so that 10,000-node fleets stay cheap: every node keeps edges to its
``k_near`` nearest nodes by RTT and its ``k_far`` nearest nodes in other clusters, made
symmetric. kNN and the throughput-within-radius features are computed in row blocks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from torch_geometric.data import Data

from planner.core.costmodel import layer_memory_bytes
from planner.core.fleet import GBIT, Network
from planner.core.jobs import Job

K_NEAR = 8
K_FAR = 4
RTT_WEIGHT_SCALE_MS = 20.0   # GCN edge weight 1 / (1 + rtt / scale): nearby servers weigh more
MDS_DIMS = 4
MDS_LANDMARKS = 48
RADII_MS = (3.0, 15.0, 60.0)

NODE_DIM = 9 + MDS_DIMS + len(RADII_MS)
JOB_DIM = 9
PAIR_DIM = 2
GLOBAL_DIM = 4
EDGE_DIM = 4


def job_rank(jobs: list[Job]) -> np.ndarray:
    """Rank of each job by size (0 = most FLOPs; ties: memory, then name), in ``jobs`` order."""
    order = sorted(range(len(jobs)), key=lambda i: (-jobs[i].total_flops, -jobs[i].state_bytes,
                                                     jobs[i].name))
    rank = np.empty(len(jobs), dtype=np.int64)
    rank[order] = np.arange(len(jobs))
    return rank


def _finite_rtt(rtt: np.ndarray) -> np.ndarray:
    """RTTs with unreachable pairs (inf) replaced by twice the largest finite RTT."""
    finite = np.isfinite(rtt)
    big = 2.0 * float(rtt[finite].max()) if finite.any() else 1.0
    return np.where(finite, rtt, big)


def rtt_coordinates(rtt_ms: np.ndarray, dims: int = MDS_DIMS,
                    landmarks: int = MDS_LANDMARKS) -> np.ndarray:
    r"""Landmark classical MDS of the RTT matrix: an (n, dims) embedding whose distances
    approximate the RTTs.

    Landmarks: farthest-point sampling from the node with the largest total RTT (ties: lowest
    index). With :math:`D` the squared RTTs among the m landmarks, :math:`B = -\tfrac12 J D J`
    (:math:`J` the centring matrix) is eigendecomposed, :math:`B = V \Lambda V^\top`; a node with
    squared RTTs :math:`d` to the landmarks gets :math:`x = -\tfrac12 \Lambda^{-1/2} V^\top
    (d - \bar d)` (de Silva and Tenenbaum's triangulation), :math:`\bar d` the landmarks' mean
    column. Axes are ordered by eigenvalue and their signs fixed so that the node farthest along
    each axis is on its positive side; the coordinates are in ms.
    """
    n = rtt_ms.shape[0]
    out = np.zeros((n, dims))
    if n < 2:
        return out
    m = min(landmarks, n)
    chosen = [int(np.argmax(_finite_rtt(rtt_ms[:, :min(n, 256)]).sum(axis=1)))]
    far = _finite_rtt(rtt_ms[chosen[0]]).astype(float)
    for _ in range(m - 1):
        nxt = int(np.argmax(far))
        if far[nxt] <= 0:
            break
        chosen.append(nxt)
        far = np.minimum(far, _finite_rtt(rtt_ms[nxt]))
    idx = np.array(chosen)
    d_land = _finite_rtt(rtt_ms[np.ix_(idx, idx)]) ** 2
    k = idx.size
    j = np.eye(k) - 1.0 / k
    b = -0.5 * j @ d_land @ j
    vals, vecs = np.linalg.eigh((b + b.T) / 2)
    top = np.argsort(-vals)[:dims]
    vals, vecs = vals[top], vecs[:, top]
    keep = vals > 1e-9
    d_all = _finite_rtt(rtt_ms[:, idx]) ** 2                     # (n, k)
    mean_col = d_land.mean(axis=0)
    proj = -0.5 * (d_all - mean_col) @ (vecs[:, keep] / np.sqrt(vals[keep]))
    # Sign convention: the node with the largest |coordinate| on an axis is on its + side.
    for a in range(proj.shape[1]):
        if proj[np.argmax(np.abs(proj[:, a])), a] < 0:
            proj[:, a] = -proj[:, a]
    out[:, : proj.shape[1]] = proj
    return out


def throughput_within(net: Network, radii_ms=RADII_MS, block: int = 1024) -> np.ndarray:
    """(n, len(radii)) share of the fleet's throughput within each RTT radius of every node."""
    thr = np.asarray(net.thr, dtype=float)
    total = max(float(thr.sum()), 1e-30)
    out = np.zeros((net.n, len(radii_ms)))
    for start in range(0, net.n, block):
        rows = net.rtt_ms[start:start + block]
        for c, r in enumerate(radii_ms):
            out[start:start + block, c] = (rows <= r) @ thr / total
    return out


def knn_edges(net: Network, k_near: int = K_NEAR, k_far: int = K_FAR, block: int = 1024,
              groups: np.ndarray | None = None) -> np.ndarray:
    """(2, E) symmetric edge index: each node's k nearest by RTT plus its k nearest outside its
    own group (``groups``: a label per node, default its city, else the node alone)."""
    n = net.n
    if n < 2:
        return np.zeros((2, 0), dtype=np.int64)
    if groups is None:
        ids: dict[str, int] = {}
        groups = np.array([ids.setdefault(nd.city_key, len(ids)) if nd.city_key else -1 - i
                           for i, nd in enumerate(net.nodes)])
    src_parts, dst_parts = [], []
    for start in range(0, n, block):
        stop = min(n, start + block)
        rows = np.arange(start, stop)
        d = np.array(net.rtt_ms[start:stop], dtype=np.float64, copy=True)
        d[rows - start, rows] = np.inf
        for k, mask in ((k_near, None), (k_far, groups[None, :] == groups[rows, None])):
            if k <= 0:
                continue
            dd = d if mask is None else np.where(mask, np.inf, d)
            kk = min(k, n - 1)
            nearest = np.argpartition(dd, kk - 1, axis=1)[:, :kk]
            ok = np.isfinite(np.take_along_axis(dd, nearest, axis=1))
            src_parts.append(np.repeat(rows, kk)[ok.ravel()])
            dst_parts.append(nearest.ravel()[ok.ravel()])
    src = np.concatenate(src_parts)
    dst = np.concatenate(dst_parts)
    pairs = np.unique(np.concatenate([np.stack([src, dst], 1), np.stack([dst, src], 1)]), axis=0)
    return pairs.T.astype(np.int64)


@dataclass
class Featurized:
    """Raw (unnormalised) features of one (jobs, network) instance."""

    x: np.ndarray            # (n, NODE_DIM)
    edge_index: np.ndarray   # (2, E)
    edge_attr: np.ndarray    # (E, EDGE_DIM)
    edge_weight: np.ndarray  # (E,)
    job_x: np.ndarray        # (J, JOB_DIM), rows in the order of the jobs list
    pair_x: np.ndarray       # (n * J, PAIR_DIM), row i * J + k = (node i, job k)
    u: np.ndarray            # (GLOBAL_DIM,)

    @property
    def num_jobs(self) -> int:
        return self.job_x.shape[0]


def featurize(jobs: list[Job], net: Network, *, k_near: int = K_NEAR,
              k_far: int = K_FAR) -> Featurized:
    """Features of ``jobs`` on ``net`` (see the module docstring)."""
    from planner.search.clusters import network_clusters

    n, num = net.n, len(jobs)
    thr = net.thr / 1e12                      # TFLOP/s effective
    mem_gb = net.mem / 1e9
    gpus = np.array([nd.gpus for nd in net.nodes], dtype=float)
    cc = np.array([nd.compute_capability or 0.0 for nd in net.nodes], dtype=float)
    edges = knn_edges(net, k_near, k_far, groups=network_clusters(net) if n > 1 else None)
    src, dst = edges
    rtt = net.rtt_ms[src, dst].astype(float)
    bw = net.bw[src, dst].astype(float)
    near_rtt = np.zeros(n)
    if edges.shape[1]:
        sums = np.bincount(dst, weights=np.log1p(rtt), minlength=n)
        deg = np.bincount(dst, minlength=n)
        near_rtt = sums / np.maximum(deg, 1)
    coords = rtt_coordinates(net.rtt_ms)
    scale = max(float(np.abs(coords).max()), 1e-9)
    centre_dist = np.linalg.norm(coords - coords.mean(axis=0), axis=1)
    finite = np.isfinite(net.rtt_ms)
    reach = finite @ np.asarray(net.thr, dtype=float) / max(float(net.thr.sum()), 1e-30)
    base = np.column_stack([
        np.log10(np.maximum(thr, 1e-3)),
        np.log10(np.maximum(mem_gb, 1e-3)),
        np.log2(np.maximum(gpus, 1)),
        cc,
        np.log(np.maximum(thr, 1e-9) / max(thr.mean(), 1e-9)),
        np.log(np.maximum(mem_gb, 1e-9) / max(mem_gb.mean(), 1e-9)),
        near_rtt,
        np.log1p(centre_dist),
        reach,
        coords / scale,
        throughput_within(net),
    ])
    total_flops = sum(j.total_flops for j in jobs) or 1.0
    fleet_thr = max(float(net.thr.sum()), 1.0)
    fleet_mem = max(float(net.mem.sum()), 1.0)
    rank = job_rank(jobs)
    job_x = np.zeros((num, JOB_DIM))
    pair_x = np.zeros((n, num, PAIR_DIM))
    for k, job in enumerate(jobs):
        per_layer = layer_memory_bytes(job, job.micro_batch, 1, 1)   # one stage: min(M, K) = 1
        layers_fit = net.mem / per_layer
        pair_x[:, k, 0] = np.log2(np.clip(layers_fit, 1e-3, None) / job.layers)
        pair_x[:, k, 1] = (layers_fit >= job.layers).astype(float)
        job_x[k] = [
            math.log10(job.params),
            math.log2(job.layers),
            job.total_flops / total_flops,
            job.state_bytes / fleet_mem,
            math.log10(job.total_flops / fleet_thr + 1e-9),
            math.log10(job.activation_bytes()),
            math.log2(job.global_batch / job.micro_batch),
            rank[k] / max(num, 1),
            math.log2(num),
        ]
    u = np.array([
        math.log10(max(n, 1)),
        math.log2(max(num, 1)),
        math.log10(total_flops / fleet_thr + 1e-9),
        sum(j.state_bytes for j in jobs) / fleet_mem,
    ])
    edge_attr = np.column_stack([
        np.log1p(rtt),
        np.log10(np.maximum(bw, 1.0) / GBIT),
        net.imputed[src, dst].astype(float),
        (rtt <= 3.0).astype(float),
    ]) if edges.shape[1] else np.zeros((0, EDGE_DIM))
    return Featurized(base, edges, edge_attr, 1.0 / (1.0 + rtt / RTT_WEIGHT_SCALE_MS), job_x,
                      pair_x.reshape(n * num, PAIR_DIM), u)


@dataclass
class FeatureStats:
    """Mean and standard deviation of node, edge, job, pair and global features."""

    x_mean: np.ndarray
    x_std: np.ndarray
    e_mean: np.ndarray
    e_std: np.ndarray
    j_mean: np.ndarray
    j_std: np.ndarray
    p_mean: np.ndarray
    p_std: np.ndarray
    u_mean: np.ndarray
    u_std: np.ndarray

    KEYS = ("x_mean", "x_std", "e_mean", "e_std", "j_mean", "j_std", "p_mean", "p_std",
            "u_mean", "u_std")

    @classmethod
    def fit(cls, items: list[Featurized]) -> "FeatureStats":
        def ms(a):
            return a.mean(0), np.where(a.std(0) > 1e-6, a.std(0), 1.0)
        return cls(*ms(np.concatenate([f.x for f in items])),
                   *ms(np.concatenate([f.edge_attr for f in items])),
                   *ms(np.concatenate([f.job_x for f in items])),
                   *ms(np.concatenate([f.pair_x for f in items])),
                   *ms(np.stack([f.u for f in items])))

    def to_dict(self) -> dict:
        return {k: torch.tensor(getattr(self, k), dtype=torch.float32) for k in self.KEYS}

    @classmethod
    def from_dict(cls, d: dict) -> "FeatureStats":
        return cls(**{k: np.asarray(d[k], dtype=np.float64) for k in cls.KEYS})


class JobGraph(Data):
    """A PyG ``Data`` with jobs and node-job pairs: batching offsets ``pair_index`` row 0 by the
    node count and row 1 by the job count, and ``job_batch`` by one per graph."""

    def __inc__(self, key, value, *args, **kwargs):
        if key == "pair_index":
            return torch.tensor([[self.num_nodes], [self.job_x.size(0)]])
        if key == "job_batch":
            return 1
        return super().__inc__(key, value, *args, **kwargs)

    def __cat_dim__(self, key, value, *args, **kwargs):
        if key == "pair_index":
            return 1
        return super().__cat_dim__(key, value, *args, **kwargs)


def to_data(f: Featurized, stats: FeatureStats, groups: np.ndarray | None = None,
            shares: np.ndarray | None = None) -> JobGraph:
    """A normalised :class:`JobGraph`: x, edge_index, edge_attr, edge_weight, job_x, job_batch,
    pair_x, pair_index (2, n * J), u (1, GLOBAL_DIM), thr (n,); with labels, ``group`` (n,) (a
    group id per node, -1 idle) and ``share`` (J,) (each job's share of the fleet's throughput)."""
    n, num = f.x.shape[0], f.num_jobs
    nodes = np.repeat(np.arange(n), num)
    jobs = np.tile(np.arange(num), n)
    data = JobGraph(
        x=torch.tensor((f.x - stats.x_mean) / stats.x_std, dtype=torch.float32),
        edge_index=torch.from_numpy(f.edge_index),
        edge_attr=torch.tensor((f.edge_attr - stats.e_mean) / stats.e_std, dtype=torch.float32),
        edge_weight=torch.tensor(f.edge_weight, dtype=torch.float32),
        job_x=torch.tensor((f.job_x - stats.j_mean) / stats.j_std, dtype=torch.float32),
        job_batch=torch.zeros(num, dtype=torch.long),
        pair_x=torch.tensor((f.pair_x - stats.p_mean) / stats.p_std, dtype=torch.float32),
        pair_index=torch.from_numpy(np.stack([nodes, jobs]).astype(np.int64)),
        u=torch.tensor((f.u - stats.u_mean) / stats.u_std, dtype=torch.float32).unsqueeze(0),
        thr=torch.tensor(10 ** f.x[:, 0], dtype=torch.float32),
    )
    data.num_nodes = n
    if groups is not None:
        data.group = torch.from_numpy(np.asarray(groups, dtype=np.int64))
    if shares is not None:
        data.share = torch.tensor(np.asarray(shares, dtype=float), dtype=torch.float32)
    return data
