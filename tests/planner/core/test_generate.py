"""Generated fleets and job sets: deterministic, realistic, connected, consistent between paths."""

from __future__ import annotations

import numpy as np

from hulk import geo
from planner.core import gpus
from planner.core.fleet import complete
from planner.core.generate import generate_fleet, generate_jobs, generate_network


def test_same_seed_same_fleet_other_seed_other_fleet():
    a, b, c = (generate_fleet(40, seed=s) for s in (3, 3, 4))
    assert a == b
    assert a.nodes != c.nodes or a.links != c.links


def test_nodes_are_real_cities_with_catalog_gpus():
    fleet = generate_fleet(120, seed=1)
    assert len(fleet.nodes) == 120 and len({n.id for n in fleet.nodes}) == 120
    per_city: dict[str, int] = {}
    for node in fleet.nodes:
        assert node.city in geo.CITIES and node.coordinates is not None
        row = gpus.lookup_name(node.gpu_name)
        assert row is not None and 1 <= node.gpus <= 8
        assert node.memory_gb == node.gpus * row[3] and node.compute_capability == row[1]
        per_city[node.city] = per_city.get(node.city, 0) + 1
    counts = sorted(per_city.values(), reverse=True)
    assert len(counts) >= 5 and counts[0] >= 3 * counts[-1]   # Zipf-like: a few big sites
    assert len({n.gpu_name for n in fleet.nodes}) >= 4


def test_rtts_respect_physics_and_missing_links_keep_the_fleet_whole():
    fleet = generate_fleet(60, seed=2, missing_fraction=0.3)
    n = len(fleet.nodes)
    assert len(fleet.links) < n * (n - 1) / 2 * 0.8
    by_id = {node.id: node for node in fleet.nodes}
    for link in fleet.links:
        a, b = by_id[link.src], by_id[link.dst]
        floor = geo.min_rtt_ms(a.coordinates, b.coordinates)
        assert link.rtt_ms >= floor
        if a.city == b.city:
            assert 0.2 <= link.rtt_ms <= 2.0 * 1.15 + 0.6
        else:
            assert link.rtt_ms <= floor * 2.5 * 1.15 + 0.6
    net = complete(fleet)
    assert len(net.components()) == 1 and net.imputed.any()


def test_matrix_path_matches_the_fleet():
    fleet = generate_fleet(50, seed=5)
    net = complete(fleet)
    fast = generate_network(50, seed=5)
    assert fast.ids == net.ids
    measured = ~net.imputed
    assert np.allclose(fast.rtt_ms[measured], net.rtt_ms[measured])
    assert (fast.imputed == net.imputed).all()
    assert np.allclose(fast.thr, net.thr) and np.allclose(fast.mem, net.mem)


def test_large_network_is_built_from_matrices():
    net = generate_network(1500, seed=0)
    assert net.n == 1500 and net.rtt_ms.shape == (1500, 1500)
    assert np.allclose(net.rtt_ms, net.rtt_ms.T) and np.isfinite(net.rtt_ms).all()


def test_generated_jobs():
    jobs = generate_jobs(30, seed=9)
    assert jobs == generate_jobs(30, seed=9)
    assert len({j.name for j in jobs}) == 30
    assert all(j.global_batch >= j.micro_batch and j.steps >= 1 for j in jobs)
    assert len({j.model for j in jobs}) >= 4
    assert all(j.params <= 2e9 for j in generate_jobs(10, seed=1, max_params=2e9))
