"""The link predictor's network and optimiser in plain torch: the mean over measured pairs sums
as PyTorch Geometric's mean aggregation does, the optimiser steps as torch.optim.Adam does, and a
fit imports neither PyG nor torch._dynamo (each costs seconds of every `fleet complete`)."""

import subprocess
import sys

import numpy as np
import pytest
import torch

from planner.linkpred.gnn_layers import MeasuredPairConv, mean_at, received_counts
from planner.linkpred.gnn_optim import Adam


def test_mean_at_equals_pyg_mean_aggregation_with_empty_rows_zero():
    scatter = pytest.importorskip("torch_geometric.utils").scatter
    rng = np.random.default_rng(3)
    values = torch.as_tensor(rng.normal(size=(500, 7)).astype(np.float32))
    index = torch.as_tensor(rng.integers(0, 40, 500))
    index[index == 5] = 6                                 # site 5 receives nothing
    out = mean_at(values, index, received_counts(index, 41))
    assert torch.equal(out, scatter(values, index, dim=0, dim_size=41, reduce="mean"))
    assert torch.equal(out[5], torch.zeros(7)) and torch.equal(out[40], torch.zeros(7))


def test_adam_takes_torch_adams_steps_exactly():
    torch.manual_seed(0)
    ours_net = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.ReLU(), torch.nn.Linear(5, 2))
    theirs_net = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.ReLU(),
                                     torch.nn.Linear(5, 2))
    theirs_net.load_state_dict(ours_net.state_dict())
    start = [p.detach().clone() for p in ours_net.parameters()]
    ours = Adam(ours_net.parameters(), lr=0.02, weight_decay=1e-4)
    theirs = torch.optim.Adam(theirs_net.parameters(), lr=0.02, weight_decay=1e-4)
    x, y = torch.randn(64, 6), torch.randn(64, 2)
    for _ in range(25):
        for net, optimiser in ((ours_net, ours), (theirs_net, theirs)):
            optimiser.zero_grad()
            ((net(x) - y) ** 2).mean().backward()
            optimiser.step()
    for a, b, before in zip(ours_net.parameters(), theirs_net.parameters(), start):
        assert torch.equal(a, b) and not torch.equal(a, before)


def test_conv_gives_the_plainly_written_formulas_values_and_gradients_exactly():
    """The layer fuses its product and sum (addmm, ReLU in place) and counts each site's
    pairs once: the same sums as the formula written out op by op."""
    torch.manual_seed(1)
    conv = MeasuredPairConv(8, 5)
    rng = np.random.default_rng(4)
    pairs = torch.as_tensor(rng.integers(0, 30, (2, 300)))
    edge_index = torch.cat([pairs, pairs.flip(0)], dim=1)
    edge_attr = torch.as_tensor(rng.normal(size=(300, 5)).astype(np.float32)).repeat(2, 1)
    h = torch.randn(31, 8, requires_grad=True)          # site 30 receives nothing
    upstream = torch.randn(31, 8)

    def gradients(out):
        conv.zero_grad()
        h.grad = None
        out.backward(upstream)
        return [h.grad.clone(), *(p.grad.clone() for p in conv.parameters())]

    ours = conv(h, edge_index, edge_attr)
    ours_grads = gradients(ours)
    counted = conv(h, edge_index, edge_attr, received_counts(edge_index[1], 31))
    messages = torch.relu(conv.lin_node(h)[edge_index[0]] + conv.lin_edge(edge_attr))
    spread = edge_index[1].view(-1, 1).expand_as(messages)
    total = torch.zeros(31, 8).scatter_add_(0, spread, messages)
    count = torch.zeros(31).scatter_add_(0, edge_index[1], torch.ones(600)).clamp(min=1)
    plain = h + torch.relu(conv.root(h) + conv.lin_pooled(total / count.view(-1, 1)))
    assert torch.equal(ours, plain) and torch.equal(counted, plain)
    for a, b in zip(ours_grads, gradients(plain)):
        assert torch.equal(a, b)


def test_adam_keeps_the_values_and_follows_a_state_dict_loaded_into_the_network():
    """Its parameters become views of one flat tensor: building it changes no value, and
    loading a state dict (early stopping's best weights) is what the next step starts from."""
    torch.manual_seed(2)
    ours_net = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 1))
    theirs_net = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(),
                                     torch.nn.Linear(3, 1))
    theirs_net.load_state_dict(ours_net.state_dict())
    before = {k: v.clone() for k, v in ours_net.state_dict().items()}
    ours = Adam(ours_net.parameters(), lr=0.05, weight_decay=1e-4)
    assert all(torch.equal(v, before[k]) for k, v in ours_net.state_dict().items())
    theirs = torch.optim.Adam(theirs_net.parameters(), lr=0.05, weight_decay=1e-4)
    x, y = torch.randn(32, 4), torch.randn(32, 1)
    for step in range(12):
        if step == 8:
            ours_net.load_state_dict(before)
            theirs_net.load_state_dict(before)
        for net, optimiser in ((ours_net, ours), (theirs_net, theirs)):
            optimiser.zero_grad()
            ((net(x) - y) ** 2).mean().backward()
            optimiser.step()
    for a, b in zip(ours_net.parameters(), theirs_net.parameters()):
        assert torch.equal(a, b)


FIT_IN_A_FRESH_PROCESS = """
import sys
import numpy as np
from planner.linkpred.gnn import GnnConfig, GnnLinkModel
from planner.linkpred.graph import SiteGraph
rng = np.random.default_rng(0)
i, j = np.triu_indices(12, k=1)
graph = SiteGraph(tuple(f"s{k}" for k in range(12)), ("aws",) * 12, rng.uniform(-40, 60, 12),
                  rng.uniform(-120, 140, 12), np.full(12, 8.0), i, j,
                  rng.uniform(5, 100, len(i)), rng.uniform(1, 10, len(i)))
GnnLinkModel(GnnConfig(max_epochs=8, check_every=2)).fit(graph).predict(graph)
print(sorted(m for m in ("torch_geometric", "torch._dynamo", "torch._inductor")
             if m in sys.modules))
"""


@pytest.mark.process
def test_a_fit_imports_neither_pyg_nor_the_compiler():
    done = subprocess.run([sys.executable, "-c", FIT_IN_A_FRESH_PROCESS], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "[]"


def test_adam_refuses_a_parameter_without_a_gradient():
    used, unused = torch.nn.Linear(2, 1), torch.nn.Linear(2, 1)
    optimiser = Adam([*used.parameters(), *unused.parameters()], lr=0.1)
    used(torch.ones(1, 2)).sum().backward()
    with pytest.raises(ValueError, match="every parameter needs a gradient"):
        optimiser.step()
