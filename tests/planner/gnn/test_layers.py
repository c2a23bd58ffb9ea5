import torch

from planner.gnn import features as F
from planner.gnn.layers import EdgePoolConv
from planner.gnn.model import HulkGNN, ModelConfig


def _graph(n=7, f=5, d=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, f, generator=g)
    src = torch.randint(0, n, (20,), generator=g)
    dst = torch.randint(0, n, (20,), generator=g)
    edge_index = torch.stack([src, dst])
    edge_attr = torch.randn(20, d, generator=g)
    return x, edge_index, edge_attr


def test_edge_pool_shapes():
    torch.manual_seed(0)
    x, ei, ea = _graph()
    layer = EdgePoolConv(5, 11, edge_dim=3)
    out = layer(x, ei, ea)
    assert out.shape == (7, 11)
    assert (out >= 0).all()                      # sigma is ReLU
    assert "EdgePoolConv(5, 11, edge_dim=3)" == repr(layer)


def test_edge_pool_is_permutation_equivariant():
    torch.manual_seed(0)
    x, ei, ea = _graph()
    layer = EdgePoolConv(5, 8, edge_dim=3)
    perm = torch.randperm(7)
    inverse = torch.empty_like(perm)
    inverse[perm] = torch.arange(7)
    out = layer(x, ei, ea)
    # Node perm[k] of the old graph becomes node k of the new one.
    out_perm = layer(x[perm], inverse[ei], ea)
    torch.testing.assert_close(out_perm, out[perm], rtol=1e-5, atol=1e-6)


def test_edge_pool_sums_messages_over_neighbours():
    torch.manual_seed(0)
    layer = EdgePoolConv(2, 3, edge_dim=1, root_weight=False)
    x = torch.randn(3, 2)
    ei = torch.tensor([[1, 2], [0, 0]])         # edges 1->0 and 2->0
    ea = torch.randn(2, 1)
    out = layer(x, ei, ea)
    manual = layer.mlp(torch.cat([x[[0, 0]], x[[1, 2]], ea], dim=-1)).sum(0).relu()
    torch.testing.assert_close(out[0], manual)
    assert torch.equal(out[1], torch.zeros(3))  # no incoming edges, no root term


def test_reset_parameters_changes_weights():
    layer = EdgePoolConv(4, 4, edge_dim=2)
    before = [p.clone() for p in layer.parameters()]
    layer.reset_parameters()
    assert any(not torch.equal(a, b) for a, b in zip(before, layer.parameters()))


def _instance(n=30, k=3, seed=3):
    from planner.core.generate import generate_jobs, generate_network

    net = generate_network(n, seed=seed)
    jobs = generate_jobs(k, seed=seed + 1, max_params=net.mem.sum() / 48)
    feats = F.featurize(jobs, net)
    return jobs, net, feats, F.to_data(feats, F.FeatureStats.fit([feats]))


def test_model_gives_a_distribution_per_node_and_is_equivariant():
    _, _, _, data = _instance()
    torch.manual_seed(0)
    model = HulkGNN(ModelConfig(hidden=16)).eval()
    pair_p, idle_p = model.forward_data(data)
    assert pair_p.shape == (30 * 3,) and idle_p.shape == (30,)
    per_node = torch.zeros(30).index_add_(0, data.pair_index[0], pair_p) + idle_p
    torch.testing.assert_close(per_node, torch.ones(30))
    perm = torch.randperm(30)
    inverse = torch.empty_like(perm)
    inverse[perm] = torch.arange(30)
    # Node i of the permuted graph is node perm[i]; pairs are listed node-major as before.
    pair_rows = (perm[:, None] * 3 + torch.arange(3)).reshape(-1)
    pp, ip = model(data.x[perm], inverse[data.edge_index], data.edge_attr, data.edge_weight,
                   data.job_x, data.job_batch, data.pair_x[pair_rows], data.pair_index,
                   data.u)
    torch.testing.assert_close(ip, idle_p[perm], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(pp, pair_p[pair_rows], rtol=1e-4, atol=1e-5)


def test_model_takes_more_than_eight_jobs():
    _, _, _, data = _instance(n=40, k=12, seed=5)
    model = HulkGNN(ModelConfig(hidden=16)).eval()
    pair_p, idle_p = model.forward_data(data)
    assert pair_p.shape == (40 * 12,)
    assert torch.isfinite(pair_p).all() and (pair_p > 0).all()
