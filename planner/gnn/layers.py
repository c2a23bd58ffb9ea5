"""The paper's edge-pooling layer (its equation 4) as a PyG message-passing layer."""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch_geometric.nn import MessagePassing
from torch_geometric.nn.inits import reset


class EdgePoolConv(MessagePassing):
    r"""Pools edge features into nodes, equation 4 of the Hulk paper:

    .. math::
        \mathbf{x}'_v = \sigma\Big( \sum_{u \in \mathcal{N}(v)}
            f_{\Theta}\big(\mathbf{x}_v \,\Vert\, \mathbf{x}_u \,\Vert\, \mathbf{e}_{u,v}\big) \Big)

    where :math:`f_{\Theta}` is a two-layer MLP over the concatenation of the receiving node's
    features, the sending node's features and the edge's features, and :math:`\sigma` is ReLU.
    The sum makes the layer permutation equivariant: relabelling the nodes relabels the output
    rows the same way. With ``root_weight=True`` a linear skip term :math:`\mathbf{W}\mathbf{x}_v`
    is added inside :math:`\sigma`, so a node with no neighbours still has a representation.

    Args:
        in_channels (int): size of each node's input features :math:`F_{in}`.
        out_channels (int): size of each node's output :math:`F_{out}`.
        edge_dim (int): size of each edge's features :math:`D`.
        hidden_channels (int, optional): width of the MLP's hidden layer (default ``out_channels``).
        root_weight (bool, optional): add the linear skip term (default ``True``).
        **kwargs (optional): passed to :class:`torch_geometric.nn.conv.MessagePassing`
            (``aggr`` defaults to ``"sum"`` as in the paper).

    Shapes:
        - **input:** node features :math:`(|\mathcal{V}|, F_{in})`, edge indices
          :math:`(2, |\mathcal{E}|)` (row 0 the source :math:`u`, row 1 the target :math:`v`),
          edge features :math:`(|\mathcal{E}|, D)`
        - **output:** node features :math:`(|\mathcal{V}|, F_{out})`
    """

    def __init__(self, in_channels: int, out_channels: int, edge_dim: int,
                 hidden_channels: int | None = None, root_weight: bool = True, **kwargs) -> None:
        kwargs.setdefault("aggr", "sum")
        super().__init__(**kwargs)
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.edge_dim = edge_dim
        hidden = hidden_channels or out_channels
        self.mlp = nn.Sequential(
            nn.Linear(2 * in_channels + edge_dim, hidden),
            nn.ReLU(),
            nn.Linear(hidden, out_channels),
        )
        self.root = nn.Linear(in_channels, out_channels, bias=False) if root_weight else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        super().reset_parameters()
        reset(self.mlp)
        if self.root is not None:
            self.root.reset_parameters()

    def forward(self, x: Tensor, edge_index: Tensor, edge_attr: Tensor) -> Tensor:
        # The MLP's first layer is linear in the concatenation, W [x_v | x_u | e] =
        # W_v x_v + W_u x_u + W_e e: project every node once and gather per edge instead of
        # multiplying a (|E|, 2F + D) matrix (about 20x less work on 10,000-node fleets).
        first, rest = self.mlp[0], self.mlp[1:]
        f = self.in_channels
        w_v, w_u, w_e = first.weight[:, :f], first.weight[:, f:2 * f], first.weight[:, 2 * f:]
        x_v = x @ w_v.t()
        x_u = x @ w_u.t()
        out = self.propagate(edge_index, x_v=x_v, x_u=x_u,
                             edge_part=edge_attr @ w_e.t() + first.bias, rest=rest)
        if self.root is not None:
            out = out + self.root(x)
        return torch.relu(out)

    def message(self, x_v_i: Tensor, x_u_j: Tensor, edge_part: Tensor, rest) -> Tensor:
        # _i: receiving node v, _j: sending neighbour u (PyG's flow "source_to_target").
        return rest(x_v_i + x_u_j + edge_part)

    def __repr__(self) -> str:
        return (f"{self.__class__.__name__}({self.in_channels}, {self.out_channels}, "
                f"edge_dim={self.edge_dim})")
