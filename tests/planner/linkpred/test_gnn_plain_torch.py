"""The link predictor's network and optimiser in plain torch: the mean over measured pairs sums
as PyTorch Geometric's mean aggregation does, the optimiser steps as torch.optim.Adam does, and a
fit imports neither PyG nor torch._dynamo (each costs seconds of every `fleet complete`)."""

import subprocess
import sys

import numpy as np
import pytest
import torch

from planner.linkpred.gnn_layers import mean_at
from planner.linkpred.gnn_optim import Adam


def test_mean_at_equals_pyg_mean_aggregation_with_empty_rows_zero():
    scatter = pytest.importorskip("torch_geometric.utils").scatter
    rng = np.random.default_rng(3)
    values = torch.as_tensor(rng.normal(size=(500, 7)).astype(np.float32))
    index = torch.as_tensor(rng.integers(0, 40, 500))
    index[index == 5] = 6                                 # site 5 receives nothing
    out = mean_at(values, index, 41)
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
