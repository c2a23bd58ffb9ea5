"""What the link predictor's network reads of a graph (gnn_fit.Inputs): per step, the chosen
pairs as edges both ways with their figures and features, and each site's statistics of them.
Inputs builds the per-pair table once and picks rows from it: checked here against the same
figures derived plainly, pair by pair."""

import numpy as np
import torch

from planner.linkpred.gnn_fit import (EDGE_DIM, SITE_DIM, Inputs, Scale, pair_features,
                                      site_features, standardised)
from planner.linkpred.graph import SiteGraph


def _graph() -> SiteGraph:
    """Twelve sites, most pairs measured, some throughputs and one RTT missing."""
    rng = np.random.default_rng(7)
    sites = 12
    i, j = np.triu_indices(sites, k=1)
    keep = rng.random(len(i)) < 0.8
    i, j = i[keep], j[keep]
    rtt = rng.uniform(5, 150, len(i))
    gbps = rng.uniform(0.5, 20, len(i))
    gbps[rng.random(len(i)) < 0.3] = np.nan
    rtt[3] = np.nan
    provider = tuple(("aws", "gcp", "azure", "")[k % 4] for k in range(sites))
    return SiteGraph(tuple(f"s{k}" for k in range(sites)), provider,
                     rng.uniform(-40, 60, sites), rng.uniform(-120, 140, sites),
                     np.full(sites, 8.0), i, j, rtt, gbps)


def test_messages_are_the_chosen_pairs_both_ways_with_their_figures_and_site_statistics():
    graph = _graph()
    scale = Scale.of(graph, np.arange(len(graph.i)))
    inputs = Inputs(graph, scale)
    rows = np.sort(np.random.default_rng(1).choice(len(graph.i), 25, replace=False))
    x, edge_index, edge_attr = inputs.messages(torch.as_tensor(rows))

    z = np.stack([standardised(graph.gbps, scale.log_gbps),
                  standardised(graph.rtt_ms, scale.log_rtt)], axis=1)[rows]
    known = np.isfinite(z)
    a, b = graph.i[rows], graph.j[rows]
    assert edge_index.tolist() == [[*a, *b], [*b, *a]]
    attr = np.concatenate([np.stack([np.nan_to_num(z[:, 0]), known[:, 0],
                                     np.nan_to_num(z[:, 1]), known[:, 1]], 1),
                           pair_features(graph, a, b)], axis=1).astype(np.float32)
    assert edge_attr.shape == (2 * len(rows), EDGE_DIM)
    assert np.array_equal(edge_attr.numpy(), np.concatenate([attr, attr]))

    assert np.array_equal(x[:, :SITE_DIM].numpy(), site_features(graph))
    for site in range(graph.n_sites):
        at = (a == site) | (b == site)
        for quantity in range(2):
            seen = at & known[:, quantity]
            mean = z[seen, quantity].mean() if seen.any() else 0.0
            assert np.isclose(x[site, SITE_DIM + quantity].item(), mean, atol=1e-6)
            assert np.isclose(x[site, SITE_DIM + 2 + quantity].item(),
                              np.log1p(seen.sum()) / np.log1p(graph.n_sites), atol=1e-6)


def test_decoder_attr_shows_the_measured_rtt_only_where_told():
    graph = _graph()
    scale = Scale.of(graph, np.arange(len(graph.i)))
    inputs = Inputs(graph, scale)
    rows = np.array([0, 3, 5, 9])                       # row 3 has no measured RTT
    shown = torch.tensor([True, True, False, True])
    attr = inputs.decoder_attr(torch.as_tensor(rows), shown).numpy()
    rtt_z = standardised(graph.rtt_ms, scale.log_rtt)[rows]
    assert np.array_equal(attr[:, :-2], pair_features(graph, graph.i[rows], graph.j[rows]))
    assert np.array_equal(attr[:, -1], [1.0, 1.0, 0.0, 1.0])
    assert np.array_equal(attr[:, -2], [rtt_z[0], 0.0, 0.0, rtt_z[3]])
