"""The Hulk GNN: node encoder (edge pooling, GCN layers) and a node-job pair scorer.

Jobs are a set: each job is encoded on its own, the set is summarised by mean and max pooling
(DeepSets), and every (node, job) pair is scored; a node's probabilities over "its graph's jobs
plus idle" come from a softmax over its pairs and its idle logit. Any number of jobs works.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
from torch import Tensor, nn
from torch_geometric.nn import GCNConv
from torch_geometric.nn.conv.gcn_conv import gcn_norm
from torch_geometric.utils import scatter, softmax

from planner.gnn import features as F
from planner.gnn.layers import EdgePoolConv


@dataclass(frozen=True)
class ModelConfig:
    node_dim: int = F.NODE_DIM
    job_dim: int = F.JOB_DIM
    pair_dim: int = F.PAIR_DIM
    global_dim: int = F.GLOBAL_DIM
    edge_dim: int = F.EDGE_DIM
    hidden: int = 32
    gcn_layers: int = 3
    dropout: float = 0.0

    def to_dict(self) -> dict:
        return asdict(self)


def _mlp(i: int, h: int, o: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(i, h), nn.ReLU(), nn.Linear(h, o))


def _reset(module: nn.Module) -> None:
    for layer in module.modules():
        if layer is not module and hasattr(layer, "reset_parameters"):
            layer.reset_parameters()


class HulkGNN(nn.Module):
    r"""Node-job assignment probabilities.

    With :math:`H` the hidden width, per graph :math:`g` with jobs :math:`\mathcal{J}_g`:

    .. math::
        \mathbf{e}_k &= \mathrm{MLP}_J(\mathbf{q}_k), \qquad
        \mathbf{c}_g = \mathrm{MLP}_C\big(\mathbf{u}_g \,\Vert\, \mathrm{mean}_{k}\,\mathbf{e}_k
            \,\Vert\, \max_k \mathbf{e}_k\big) \\
        \mathbf{h}_i &= \mathrm{GCN}^{L}\big(\mathrm{EdgePool}(\mathbf{x}_i \Vert
            \mathbf{c}_{g(i)})\big) \\
        s_{ik} &= \tfrac{1}{\sqrt H} (\mathbf{W}_n \mathbf{h}_i)^\top (\mathbf{W}_j \mathbf{e}_k)
            + \mathrm{MLP}_P(\mathbf{p}_{ik} \Vert \mathbf{h}_i \Vert \mathbf{e}_k), \qquad
        s_{i,\mathrm{idle}} = \mathrm{MLP}_I(\mathbf{h}_i \Vert \mathbf{c}_{g(i)}) \\
        P_{i\cdot} &= \mathrm{softmax}\big(s_{i,\mathcal{J}_{g(i)}} \,\Vert\,
            s_{i,\mathrm{idle}}\big)

    Shapes: ``x`` (N, node_dim), ``edge_index`` (2, E), ``edge_attr`` (E, edge_dim),
    ``edge_weight`` (E,), ``job_x`` (K, job_dim), ``job_batch`` (K,), ``pair_x`` (P, pair_dim),
    ``pair_index`` (2, P) (node, job), ``u`` (B, global_dim), ``batch`` (N,). Output: pair
    probabilities (P,) and idle probabilities (N,); for each node they sum to 1.
    Relabelling the nodes or reordering the jobs permutes the outputs the same way.
    """

    def __init__(self, config: ModelConfig = ModelConfig()) -> None:
        super().__init__()
        self.config = c = config
        h = c.hidden
        self.job_enc = _mlp(c.job_dim, h, h)
        self.ctx = _mlp(c.global_dim + 2 * h, h, h)
        self.pool = EdgePoolConv(c.node_dim + h, h, c.edge_dim)
        self.convs = nn.ModuleList(GCNConv(h, h, normalize=False) for _ in range(c.gcn_layers))
        self.norms = nn.ModuleList(nn.LayerNorm(h) for _ in range(c.gcn_layers))
        self.dropout = nn.Dropout(c.dropout)
        self.node_proj = nn.Linear(h, h)
        self.job_proj = nn.Linear(h, h)
        self.pair_mlp = _mlp(c.pair_dim + 2 * h, h, 1)
        self.idle = _mlp(2 * h, h, 1)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for module in (self.job_enc, self.ctx, self.pool, self.node_proj, self.job_proj,
                       self.pair_mlp, self.idle, *self.convs, *self.norms):
            if hasattr(module, "reset_parameters") and not isinstance(module, nn.Sequential):
                module.reset_parameters()
            else:
                _reset(module)

    def forward(self, x: Tensor, edge_index: Tensor, edge_attr: Tensor, edge_weight: Tensor,
                job_x: Tensor, job_batch: Tensor, pair_x: Tensor, pair_index: Tensor,
                u: Tensor, batch: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """(pair probabilities (P,), idle probabilities (N,)); see the class docstring."""
        if batch is None:
            batch = x.new_zeros(x.size(0), dtype=torch.long)
        b = u.size(0)
        e = self.job_enc(job_x)
        mean = scatter(e, job_batch, 0, dim_size=b, reduce="mean")
        mx = scatter(e, job_batch, 0, dim_size=b, reduce="max")
        c = self.ctx(torch.cat([u, mean, mx], dim=-1))
        h = self.pool(torch.cat([x, c[batch]], dim=-1), edge_index, edge_attr)
        gcn_index, gcn_weight = gcn_norm(edge_index, edge_weight, x.size(0), add_self_loops=True)
        for conv, norm in zip(self.convs, self.norms):
            h = h + torch.relu(conv(norm(h), gcn_index, gcn_weight))
            h = self.dropout(h)
        node, job = pair_index
        dot = (self.node_proj(h)[node] * self.job_proj(e)[job]).sum(-1) / h.size(-1) ** 0.5
        pair_logit = dot + self.pair_mlp(torch.cat([pair_x, h[node], e[job]], -1)).squeeze(-1)
        idle_logit = self.idle(torch.cat([h, c[batch]], -1)).squeeze(-1)
        n = x.size(0)
        probs = softmax(torch.cat([pair_logit, idle_logit]),
                        torch.cat([node, torch.arange(n, device=x.device)]), num_nodes=n)
        return probs[: node.numel()], probs[node.numel():]

    def forward_data(self, data) -> tuple[Tensor, Tensor]:
        return self(data.x, data.edge_index, data.edge_attr, data.edge_weight, data.job_x,
                    data.job_batch, data.pair_x, data.pair_index, data.u,
                    getattr(data, "batch", None))
