"""The link predictor's network: a message-passing layer over measured site pairs and an edge
decoder giving quantiles (planner/linkpred/gnn.py builds the inputs and trains it).

Written in plain torch (``index_select``, ``index_add_``) in the shape of a PyTorch Geometric
``MessagePassing`` layer with ``aggr="mean"``: the same sums in the same order, without
importing PyG, which costs about two seconds of every ``fleet complete``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

QUANTITIES = 2      # log throughput, log RTT
QUANTILE_COUNT = 3  # low, median, high


def received_counts(index: Tensor, size: int) -> Tensor:
    """(size, 1): how many rows are sent to each index, at least 1 (the mean's divisor; one
    edge list serves every layer, so it is counted once)."""
    count = torch.zeros(size).index_add_(0, index, torch.ones(len(index)))
    return count.clamp(min=1).view(-1, 1)


def mean_at(values: Tensor, index: Tensor, counts: Tensor) -> Tensor:
    """(size, H): the mean of the ``values`` rows sent to each index (0 where none is), with
    ``counts`` from :func:`received_counts`. ``index_add_`` adds each row in edge order, the
    sums ``scatter_add_`` gives, with one row-wide add per edge instead of one per value."""
    total = values.new_zeros(counts.size(0), values.size(1)).index_add_(0, index, values)
    return total / counts


class MeasuredPairConv(nn.Module):
    r"""Mean of messages over a site's measured pairs, with a residual update:

    .. math::
        \mathbf{h}'_v = \mathbf{h}_v + \mathrm{ReLU}\Big(\mathbf{W}_r\mathbf{h}_v +
            \mathbf{W}_2 \frac{1}{|\mathcal{N}(v)|} \sum_{u \in \mathcal{N}(v)}
            \mathrm{ReLU}\big(\mathbf{W}_1 \mathbf{h}_u + \mathbf{W}_e \mathbf{e}_{u,v}
            + \mathbf{b}\big)\Big)

    where :math:`\mathbf{e}_{u,v}` are the pair's measured figures (standardised log throughput
    and log RTT, each with a was-measured flag) and its pair features. The message is a two-layer
    MLP of :math:`\mathbf{h}_u \Vert \mathbf{e}_{u,v}` whose second (linear) layer is applied
    after the mean, where it costs one product per site instead of one per pair. The mean, not
    the sum, keeps a site with few measured pairs on the scale of one with many; the degree is
    an input feature instead.

    Args:
        channels (int): size :math:`H` of each site's representation (in and out).
        edge_dim (int): size :math:`D` of each pair's features.

    Shapes:
        - **input:** site features :math:`(|\mathcal{V}|, H)`, edge indices
          :math:`(2, |\mathcal{E}|)` (each measured pair in both directions; a message goes
          from row 0's site to row 1's), edge features
          :math:`(|\mathcal{E}|, D)`
        - **output:** site features :math:`(|\mathcal{V}|, H)`
    """

    def __init__(self, channels: int, edge_dim: int) -> None:
        super().__init__()
        self.channels = channels
        self.edge_dim = edge_dim
        self.lin_node = nn.Linear(channels, channels)
        self.lin_edge = nn.Linear(edge_dim, channels, bias=False)
        self.lin_pooled = nn.Linear(channels, channels, bias=False)
        self.root = nn.Linear(channels, channels)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for lin in (self.lin_node, self.lin_edge, self.lin_pooled, self.root):
            lin.reset_parameters()

    def forward(self, h: Tensor, edge_index: Tensor, edge_attr: Tensor,
                counts: Tensor | None = None) -> Tensor:
        """``counts``: :func:`received_counts` of ``edge_index[1]`` (counted here if None)."""
        if counts is None:
            counts = received_counts(edge_index[1], h.size(0))
        sent = self.lin_node(h).index_select(0, edge_index[0])
        # sent + lin_edge(edge_attr) as one product added into ``sent`` in place, then its ReLU
        # in place: the same sums (the product is added to ``sent`` after it is taken) without
        # three (E, H) temporaries, the largest tensors of a fit.
        messages = sent.addmm_(edge_attr, self.lin_edge.weight.t()).relu_()
        pooled = mean_at(messages, edge_index[1], counts)
        return h + torch.relu(self.root(h) + self.lin_pooled(pooled))


class QuantileLinkGnn(nn.Module):
    r"""Sites in, quantiles of every asked pair's log throughput and log RTT out.

    .. math::
        \mathbf{h}^{(0)} = \mathbf{W}_0 \mathbf{x}, \quad
        \mathbf{h}^{(l)} = \mathrm{Conv}_l(\mathbf{h}^{(l-1)}, \mathcal{E}, \mathbf{e}), \quad
        \mathbf{y}_{ab} = g_{\Phi}\big(\mathbf{h}_a + \mathbf{h}_b \,\Vert\,
            \mathbf{h}_a \odot \mathbf{h}_b \,\Vert\, |\mathbf{h}_a - \mathbf{h}_b| \,\Vert\,
            \mathbf{p}_{ab}\big)

    :math:`g_{\Phi}` is an MLP giving, per quantity, a median :math:`m` and two spreads; the low
    and high quantiles are :math:`m - \mathrm{softplus}(s_{lo})` and
    :math:`m + \mathrm{softplus}(s_{hi})`, so they never cross the median. The decoder inputs
    built from :math:`\mathbf{h}` are symmetric in :math:`a, b`, as are the pair features
    :math:`\mathbf{p}_{ab}`, so a pair's prediction does not depend on its order; the sum and
    the absolute difference together give the smaller and the larger end (a pair's throughput
    is often its slower end's).

    Args:
        node_dim (int): size :math:`F` of each site's input features.
        edge_dim (int): size of each measured pair's features (message passing).
        pair_dim (int): size of each asked pair's features (decoder).
        hidden (int): width :math:`H`.
        layers (int): message-passing layers.

    Shapes:
        - **input:** site features :math:`(S, F)`, edge indices :math:`(2, E)`, edge features
          :math:`(E, D)`, asked pairs :math:`(2, P)`, pair features :math:`(P, D_p)`
        - **output:** :math:`(P, 2, 3)`: per pair, (log throughput, log RTT) x (low, median,
          high), in the standardised units the inputs use
    """

    def __init__(self, node_dim: int, edge_dim: int, pair_dim: int, hidden: int = 32,
                 layers: int = 2) -> None:
        super().__init__()
        self.encode = nn.Linear(node_dim, hidden)
        self.convs = nn.ModuleList(MeasuredPairConv(hidden, edge_dim) for _ in range(layers))
        self.decode = nn.Sequential(nn.Linear(3 * hidden + pair_dim, hidden), nn.ReLU(),
                                    nn.Linear(hidden, hidden), nn.ReLU(),
                                    nn.Linear(hidden, QUANTITIES * QUANTILE_COUNT))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        self.encode.reset_parameters()
        for conv in self.convs:
            conv.reset_parameters()
        for layer in self.decode:
            if isinstance(layer, nn.Linear):
                layer.reset_parameters()

    def embed(self, x: Tensor, edge_index: Tensor, edge_attr: Tensor) -> Tensor:
        h = self.encode(x)
        counts = received_counts(edge_index[1], x.size(0))
        for conv in self.convs:
            h = conv(h, edge_index, edge_attr, counts)
        return h

    def quantiles(self, h: Tensor, pairs: Tensor, pair_attr: Tensor) -> Tensor:
        a, b = h.index_select(0, pairs[0]), h.index_select(0, pairs[1])
        raw = self.decode(torch.cat([a + b, a * b, (a - b).abs(), pair_attr], dim=-1))
        raw = raw.view(-1, QUANTITIES, QUANTILE_COUNT)
        median = raw[..., 1]
        low = median - F.softplus(raw[..., 0])
        high = median + F.softplus(raw[..., 2])
        return torch.stack([low, median, high], dim=-1)

    def forward(self, x: Tensor, edge_index: Tensor, edge_attr: Tensor, pairs: Tensor,
                pair_attr: Tensor) -> Tensor:
        return self.quantiles(self.embed(x, edge_index, edge_attr), pairs, pair_attr)
