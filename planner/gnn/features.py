"""From (jobs, Network) to the tensors the GNN reads: node, edge and graph-level (job) features.

Job slots: jobs sorted by size (total FLOPs, then memory, then name) fill slots 0..J-1; class J is
"idle". A slot's meaning is therefore "the k-th largest job of this set", which carries across
fleets and job sets; what that job needs is in the graph-level vector ``u`` (the paper's U).

The graph is sparse so that 10,000-node fleets stay cheap: every node keeps edges to its
``k_near`` nearest nodes by RTT and its ``k_far`` nearest nodes in other cities (so cities are
linked to each other), made symmetric. kNN is computed in row blocks, never a full sort.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from torch_geometric.data import Data

from planner.core.fleet import GBIT, Network
from planner.core.jobs import Job

MAX_SLOTS = 8
K_NEAR = 8
K_FAR = 4
RTT_WEIGHT_SCALE_MS = 20.0   # GCN edge weight 1 / (1 + rtt / scale): nearby servers weigh more

SLOT_FEATURES = 8
GLOBAL_FEATURES = 4
NODE_BASE_FEATURES = 11
PER_SLOT_NODE_FEATURES = 2
NODE_DIM = NODE_BASE_FEATURES + PER_SLOT_NODE_FEATURES * MAX_SLOTS
GRAPH_DIM = SLOT_FEATURES * MAX_SLOTS + GLOBAL_FEATURES
EDGE_DIM = 4


def slot_order(jobs: list[Job]) -> list[int]:
    """Indices of ``jobs`` in slot order: largest total FLOPs first (ties: memory, name)."""
    return sorted(range(len(jobs)), key=lambda i: (-jobs[i].total_flops, -jobs[i].state_bytes,
                                                    jobs[i].name))


def _unit_sphere(nodes) -> np.ndarray:
    out = np.zeros((len(nodes), 4))
    for i, node in enumerate(nodes):
        c = node.coordinates
        if c is None:
            continue                      # unknown place: zeros and a "known" flag of 0
        lat, lon = math.radians(c[0]), math.radians(c[1])
        out[i] = (math.cos(lat) * math.cos(lon), math.cos(lat) * math.sin(lon), math.sin(lat), 1.0)
    return out


def knn_edges(net: Network, k_near: int = K_NEAR, k_far: int = K_FAR,
              block: int = 1024) -> np.ndarray:
    """(2, E) symmetric edge index: each node's k nearest by RTT plus k nearest in other cities."""
    n = net.n
    if n < 2:
        return np.zeros((2, 0), dtype=np.int64)
    city_ids: dict[str, int] = {}
    # A node without a city is its own "city" (negative id), so it links to everyone as "far".
    cities = np.array([city_ids.setdefault(nd.city_key, len(city_ids)) if nd.city_key else -1 - i
                       for i, nd in enumerate(net.nodes)])
    src_parts, dst_parts = [], []
    for start in range(0, n, block):
        stop = min(n, start + block)
        rows = np.arange(start, stop)
        d = np.array(net.rtt_ms[start:stop], dtype=np.float64, copy=True)
        d[rows - start, rows] = np.inf
        for k, mask in ((k_near, None), (k_far, cities[None, :] == cities[rows, None])):
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
    """Raw (unnormalised) features of one (jobs, network) instance and its slot mapping."""

    x: np.ndarray            # (n, NODE_DIM)
    edge_index: np.ndarray   # (2, E)
    edge_attr: np.ndarray    # (E, EDGE_DIM)
    edge_weight: np.ndarray  # (E,)
    u: np.ndarray            # (GRAPH_DIM,)
    slot_mask: np.ndarray    # (MAX_SLOTS + 1,) bool: slots in use, and idle
    slot_jobs: list[int]     # slot -> index into jobs


def featurize(jobs: list[Job], net: Network, *, k_near: int = K_NEAR,
              k_far: int = K_FAR) -> Featurized:
    """Features of ``jobs`` on ``net``; jobs beyond MAX_SLOTS are not represented (the caller
    decides what to do with them)."""
    order = slot_order(jobs)[:MAX_SLOTS]
    n = net.n
    thr = net.thr / 1e12                      # TFLOP/s effective
    mem_gb = net.mem / 1e9
    gpus = np.array([nd.gpus for nd in net.nodes], dtype=float)
    cc = np.array([nd.compute_capability or 0.0 for nd in net.nodes], dtype=float)
    edges = knn_edges(net, k_near, k_far)
    src, dst = edges
    rtt = net.rtt_ms[src, dst].astype(float)
    bw = net.bw[src, dst].astype(float)
    near_rtt = np.zeros(n)
    if edges.shape[1]:
        sums = np.bincount(dst, weights=np.log1p(rtt), minlength=n)
        deg = np.bincount(dst, minlength=n)
        near_rtt = sums / np.maximum(deg, 1)

    base = np.column_stack([
        np.log10(np.maximum(thr, 1e-3)),
        np.log10(np.maximum(mem_gb, 1e-3)),
        np.log2(np.maximum(gpus, 1)),
        cc,
        np.log(np.maximum(thr, 1e-9) / max(thr.mean(), 1e-9)),
        np.log(np.maximum(mem_gb, 1e-9) / max(mem_gb.mean(), 1e-9)),
        near_rtt,
        _unit_sphere(net.nodes),
    ])
    per_slot = np.zeros((n, PER_SLOT_NODE_FEATURES * MAX_SLOTS))
    u = np.zeros(GRAPH_DIM)
    total_flops = sum(j.total_flops for j in jobs) or 1.0
    fleet_thr = max(float(net.thr.sum()), 1.0)
    fleet_mem = max(float(net.mem.sum()), 1.0)
    for s, ji in enumerate(order):
        job = jobs[ji]
        per_layer = job.state_bytes / job.layers + job.activation_bytes()
        layers_fit = net.mem / per_layer
        per_slot[:, 2 * s] = np.log2(np.clip(layers_fit, 1e-3, None) / job.layers)
        per_slot[:, 2 * s + 1] = (layers_fit >= job.layers).astype(float)
        u[SLOT_FEATURES * s: SLOT_FEATURES * (s + 1)] = [
            1.0,
            math.log10(job.params),
            math.log2(job.layers),
            job.total_flops / total_flops,
            job.state_bytes / fleet_mem,
            math.log10(job.total_flops / fleet_thr + 1e-9),
            math.log10(job.activation_bytes()),
            math.log2(job.global_batch / job.micro_batch),
        ]
    u[SLOT_FEATURES * MAX_SLOTS:] = [
        math.log10(max(n, 1)),
        len(order) / MAX_SLOTS,
        math.log10(total_flops / fleet_thr + 1e-9),
        sum(j.state_bytes for j in jobs) / fleet_mem,
    ]
    edge_attr = np.column_stack([
        np.log1p(rtt),
        np.log10(np.maximum(bw, 1.0) / GBIT),
        net.imputed[src, dst].astype(float),
        (rtt <= 3.0).astype(float),
    ]) if edges.shape[1] else np.zeros((0, EDGE_DIM))
    mask = np.zeros(MAX_SLOTS + 1, dtype=bool)
    mask[: len(order)] = True
    mask[MAX_SLOTS] = True
    return Featurized(np.column_stack([base, per_slot]), edges, edge_attr,
                      1.0 / (1.0 + rtt / RTT_WEIGHT_SCALE_MS), u, mask, order)


@dataclass
class FeatureStats:
    """Mean and standard deviation of node, edge and graph features (stored in the checkpoint)."""

    x_mean: np.ndarray
    x_std: np.ndarray
    e_mean: np.ndarray
    e_std: np.ndarray
    u_mean: np.ndarray
    u_std: np.ndarray

    @classmethod
    def fit(cls, items: list[Featurized]) -> "FeatureStats":
        x = np.concatenate([f.x for f in items])
        e = np.concatenate([f.edge_attr for f in items])
        u = np.stack([f.u for f in items])

        def ms(a):
            return a.mean(0), np.where(a.std(0) > 1e-6, a.std(0), 1.0)
        return cls(*ms(x), *ms(e), *ms(u))

    def to_dict(self) -> dict:
        return {k: torch.tensor(getattr(self, k), dtype=torch.float32)
                for k in ("x_mean", "x_std", "e_mean", "e_std", "u_mean", "u_std")}

    @classmethod
    def from_dict(cls, d: dict) -> "FeatureStats":
        return cls(**{k: np.asarray(d[k], dtype=np.float64) for k in
                      ("x_mean", "x_std", "e_mean", "e_std", "u_mean", "u_std")})


def to_data(f: Featurized, stats: FeatureStats, labels: np.ndarray | None = None) -> Data:
    """A normalised PyG ``Data``: x, edge_index, edge_attr, edge_weight, u (1, G), slot_mask (1, J+1)."""
    data = Data(
        x=torch.tensor((f.x - stats.x_mean) / stats.x_std, dtype=torch.float32),
        edge_index=torch.from_numpy(f.edge_index),
        edge_attr=torch.tensor((f.edge_attr - stats.e_mean) / stats.e_std, dtype=torch.float32),
        edge_weight=torch.tensor(f.edge_weight, dtype=torch.float32),
        u=torch.tensor((f.u - stats.u_mean) / stats.u_std, dtype=torch.float32).unsqueeze(0),
        slot_mask=torch.from_numpy(f.slot_mask).unsqueeze(0),
    )
    data.num_nodes = f.x.shape[0]
    if labels is not None:
        data.y = torch.from_numpy(np.asarray(labels, dtype=np.int64))
    return data
