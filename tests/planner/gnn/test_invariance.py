"""The training signal does not depend on how jobs or nodes are numbered; features need no
gazetteer."""

import numpy as np
import torch

from planner.core.fleet import Network, Node
from planner.core.generate import generate_jobs, generate_network
from planner.gnn import features as F
from planner.gnn.model import HulkGNN, ModelConfig
from planner.gnn.train import assignment_loss


def _loss(probs, idle, groups, shares, thr):
    return float(assignment_loss(torch.tensor(probs, dtype=torch.float32),
                                 torch.tensor(idle, dtype=torch.float32),
                                 torch.tensor(groups), torch.tensor(shares, dtype=torch.float32),
                                 torch.tensor(thr, dtype=torch.float32)))


def _random_case(n=25, j=4, seed=0):
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=(n, j + 1))
    p = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
    groups = rng.integers(-1, j, n)
    thr = rng.uniform(1, 5, n)
    shares = np.array([thr[groups == k].sum() for k in range(j)]) / thr.sum()
    return p[:, :j], p[:, j], groups, shares, thr


def test_loss_is_the_same_when_jobs_are_relabelled():
    probs, idle, groups, shares, thr = _random_case()
    order = np.array([2, 0, 3, 1])                 # new job c is old job order[c]
    new_name = np.empty_like(order)
    new_name[order] = np.arange(len(order))
    relabelled = np.where(groups >= 0, new_name[np.maximum(groups, 0)], -1)
    assert np.isclose(_loss(probs[:, order], idle, relabelled, shares[order], thr),
                      _loss(probs, idle, groups, shares, thr), atol=1e-5)


def test_same_group_and_idle_terms_ignore_group_names():
    # With every label share equal, renaming the label's groups (job columns untouched) can only
    # change the loss through the same-group and idle terms, which never read group names.
    probs, idle, groups, _, thr = _random_case(seed=3)
    shares = np.full(probs.shape[1], 0.2)
    renamed = np.where(groups >= 0, (groups + 1) % probs.shape[1], -1)
    assert np.isclose(_loss(probs, idle, renamed, shares, thr),
                      _loss(probs, idle, groups, shares, thr), atol=1e-5)


def test_loss_is_the_same_when_nodes_are_reordered():
    probs, idle, groups, shares, thr = _random_case(seed=1)
    perm = np.random.default_rng(2).permutation(len(groups))
    assert np.isclose(_loss(probs[perm], idle[perm], groups[perm], shares, thr[perm]),
                      _loss(probs, idle, groups, shares, thr), atol=1e-5)


def test_model_outputs_follow_a_reordering_of_the_jobs_list():
    net = generate_network(20, seed=11)
    jobs = generate_jobs(5, seed=12, max_params=net.mem.sum() / 48)
    order = [3, 0, 4, 1, 2]
    torch.manual_seed(0)
    model = HulkGNN(ModelConfig(hidden=16)).eval()
    feats = F.featurize(jobs, net)
    stats = F.FeatureStats.fit([feats])
    with torch.no_grad():
        a, ia = model.forward_data(F.to_data(feats, stats))
        b, ib = model.forward_data(F.to_data(F.featurize([jobs[k] for k in order], net), stats))
    torch.testing.assert_close(ib, ia, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(b.reshape(20, 5), a.reshape(20, 5)[:, order], rtol=1e-4,
                               atol=1e-6)


def test_features_are_nonzero_for_unknown_city_names():
    base = generate_network(24, seed=13)
    nodes = [Node(id=f"n{i}", city=f"region-{i // 6}-nowhere", gpus=nd.gpus,
                  gpu_name=nd.gpu_name, compute_capability=nd.compute_capability,
                  memory_gb=nd.memory_gb) for i, nd in enumerate(base.nodes)]
    net = Network.from_matrix(nodes, base.rtt_ms)
    assert all(nd.coordinates is None for nd in net.nodes)
    feats = F.featurize(generate_jobs(2, seed=1, max_params=net.mem.sum() / 48), net)
    location = feats.x[:, 7:]                     # centre distance, reach, RTT coordinates, radii
    assert np.isfinite(location).all()
    assert (np.abs(location).sum(axis=0) > 0).all()
    # Two nodes far apart by RTT get different coordinates.
    far = np.unravel_index(np.argmax(base.rtt_ms), base.rtt_ms.shape)
    assert np.abs(feats.x[far[0], 9:13] - feats.x[far[1], 9:13]).sum() > 0.1
