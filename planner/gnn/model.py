"""The Hulk GNN: edge pooling (eq. 4), GCN layers, a classifier over job slots plus idle."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
from torch import Tensor, nn
from torch_geometric.nn import GCNConv
from torch_geometric.nn.conv.gcn_conv import gcn_norm

from planner.gnn import features as F
from planner.gnn.layers import EdgePoolConv


@dataclass(frozen=True)
class ModelConfig:
    node_dim: int = F.NODE_DIM
    graph_dim: int = F.GRAPH_DIM
    edge_dim: int = F.EDGE_DIM
    slots: int = F.MAX_SLOTS
    hidden: int = 64
    gcn_layers: int = 3
    dropout: float = 0.1

    def to_dict(self) -> dict:
        return asdict(self)


class HulkGNN(nn.Module):
    """Node classification into ``slots`` job classes and idle (class index ``slots``).

    Input per node: its own features concatenated with the graph-level job vector ``u`` of its
    graph (broadcast through ``batch``). The first layer pools edge features into nodes
    (:class:`EdgePoolConv`), then ``gcn_layers`` GCN layers with RTT-derived edge weights and
    residual connections; the head sees the node embedding and ``u`` again. Logits of slots not
    in use in a graph are masked to -inf, so a node is never put in an absent job.
    """

    def __init__(self, config: ModelConfig = ModelConfig()) -> None:
        super().__init__()
        self.config = config
        c = config
        self.pool = EdgePoolConv(c.node_dim + c.graph_dim, c.hidden, c.edge_dim)
        # The symmetric normalisation D^-1/2 (A + I) D^-1/2 is computed once per forward and shared
        # by the GCN layers (normalize=False) instead of once per layer: the same maths, less work.
        self.convs = nn.ModuleList(GCNConv(c.hidden, c.hidden, normalize=False)
                                   for _ in range(c.gcn_layers))
        self.norms = nn.ModuleList(nn.LayerNorm(c.hidden) for _ in range(c.gcn_layers))
        self.dropout = nn.Dropout(c.dropout)
        self.head = nn.Sequential(nn.Linear(c.hidden + c.graph_dim, c.hidden), nn.ReLU(),
                                  nn.Linear(c.hidden, c.slots + 1))

    def reset_parameters(self) -> None:
        self.pool.reset_parameters()
        for conv, norm in zip(self.convs, self.norms):
            conv.reset_parameters()
            norm.reset_parameters()
        for layer in self.head:
            if hasattr(layer, "reset_parameters"):
                layer.reset_parameters()

    def forward(self, x: Tensor, edge_index: Tensor, edge_attr: Tensor, edge_weight: Tensor,
                u: Tensor, slot_mask: Tensor, batch: Tensor | None = None) -> Tensor:
        """Logits (N, slots + 1). ``u``: (B, graph_dim); ``slot_mask``: (B, slots + 1) bool."""
        if batch is None:
            batch = x.new_zeros(x.size(0), dtype=torch.long)
        u_node = u[batch]
        h = self.pool(torch.cat([x, u_node], dim=-1), edge_index, edge_attr)
        gcn_index, gcn_weight = gcn_norm(edge_index, edge_weight, x.size(0), add_self_loops=True)
        for conv, norm in zip(self.convs, self.norms):
            h = h + torch.relu(conv(norm(h), gcn_index, gcn_weight))
            h = self.dropout(h)
        logits = self.head(torch.cat([h, u_node], dim=-1))
        return logits.masked_fill(~slot_mask[batch], float("-inf"))

    def forward_data(self, data) -> Tensor:
        return self(data.x, data.edge_index, data.edge_attr, data.edge_weight, data.u,
                    data.slot_mask, getattr(data, "batch", None))
