"""Deterministic generated fleets and job sets for tests, benchmarks and GNN training.

A generated fleet puts servers in real cities (hulk.geo.CITIES): a random subset of cities with a
Zipf-like number of servers each, a realistic GPU mix (each city's sites favour one or two GPU
models), and RTTs from great-circle distance: ``km / 100 * inflation`` with a per-city-pair
inflation in [1.3, 2.5] (routes are never straight), 0.2-2 ms inside a city, plus per-pair noise.
Some pairs are left unmeasured (``missing_fraction``), never so many that the fleet splits: a random
chain through all servers is always measured.

``generate_fleet`` returns a ``Fleet`` (nodes and Link objects; complete() applies the completion
rule). ``generate_network`` returns the same servers as a dense ``Network`` built straight from the
matrices, for 1,000-5,000 nodes where Link objects for every pair would be too slow; there an
unmeasured pair keeps its generated RTT and is only marked imputed (a cheap stand-in for the
shortest-path completion, which at these sizes nearly always finds a route of about that length).
Everything is a pure function of the arguments: the same seed gives the same fleet.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np

from hulk import geo
from planner.core.fleet import Fleet, Link, Network, Node, Site, SiteLink
from planner.core.jobs import MODEL_CATALOG, Job, catalog_job

# (NVML-style name, relative frequency in the mix). Memory per GPU comes from gpus.GPU_CATALOG.
GPU_MIX: list[tuple[str, float]] = [
    ("NVIDIA A100-SXM4-40GB", 0.24),
    ("Tesla V100-SXM2-32GB", 0.16),
    ("NVIDIA H100 80GB HBM3", 0.12),
    ("NVIDIA A40", 0.10),
    ("NVIDIA GeForce RTX 3090", 0.10),
    ("Tesla T4", 0.08),
    ("NVIDIA L40S", 0.08),
    ("NVIDIA GeForce RTX 4090", 0.07),
    ("NVIDIA RTX A5000", 0.05),
]
GPUS_PER_NODE: list[tuple[int, float]] = [(1, 0.10), (2, 0.15), (4, 0.30), (8, 0.45)]

INFLATION_RANGE = (1.3, 2.5)        # route length / great-circle length, per city pair
SAME_CITY_RTT_MS = (0.2, 2.0)       # a city's base RTT between its servers
NOISE_FRACTION = 0.05               # per-pair multiplicative noise (standard deviation)
ACCESS_MS = (0.0, 0.3)              # per-server last-hop latency, added once per end


@dataclass(frozen=True)
class _Generated:
    nodes: tuple[Node, ...]
    rtt_ms: np.ndarray        # (n, n) symmetric, 0 on the diagonal
    measured: np.ndarray      # (n, n) symmetric bool, False on the diagonal


def _slug(city: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", city.casefold()).strip("-")


def _memory_per_gpu(gpu_name: str) -> tuple[float, float]:
    from planner.core import gpus

    row = gpus.lookup_name(gpu_name)
    assert row is not None, gpu_name
    return row[1], row[3]


def default_city_count(n_nodes: int) -> int:
    """About 1.5 * sqrt(n) cities, at least 2, at most the gazetteer."""
    return max(2, min(len(geo.CITIES), round(1.5 * math.sqrt(max(n_nodes, 1)))))


def _generate(n_nodes: int, seed: int, cities: list[str] | None, n_cities: int | None,
              missing_fraction: float, zipf_exponent: float) -> _Generated:
    if n_nodes < 1:
        raise ValueError("n_nodes must be at least 1")
    if not 0.0 <= missing_fraction < 1.0:
        raise ValueError("missing_fraction must be in [0, 1)")
    rng = np.random.default_rng(seed)
    if cities is None:
        pool = sorted(geo.CITIES)
        count = min(n_cities or default_city_count(n_nodes), len(pool), n_nodes)
        cities = [pool[i] for i in rng.choice(len(pool), size=count, replace=False)]
    else:
        unknown = [c for c in cities if geo.canonical_city(c) is None]
        if unknown:
            raise ValueError(f"unknown cities: {', '.join(unknown)}")
        cities = [geo.canonical_city(c) for c in cities][: n_nodes]
    c = len(cities)

    # Zipf-like servers per city: every city gets one, the rest by weight 1/rank^s.
    weights = 1.0 / np.arange(1, c + 1) ** zipf_exponent
    weights /= weights.sum()
    per_city = np.ones(c, dtype=int) + rng.multinomial(n_nodes - c, weights)
    city_of = np.repeat(np.arange(c), per_city)

    # Each city's sites favour one or two GPU models; a quarter of servers draw from the global mix.
    names = [g for g, _ in GPU_MIX]
    mix = np.array([w for _, w in GPU_MIX])
    mix /= mix.sum()
    site_gpus = [rng.choice(len(names), size=2, replace=False, p=mix) for _ in range(c)]
    counts = np.array([g for g, _ in GPUS_PER_NODE])
    count_p = np.array([w for _, w in GPUS_PER_NODE])
    count_p /= count_p.sum()

    nodes: list[Node] = []
    serial = np.zeros(c, dtype=int)
    for ci in city_of:
        city = cities[ci]
        roll = rng.random()
        if roll < 0.5:
            gi = site_gpus[ci][0]
        elif roll < 0.75:
            gi = site_gpus[ci][1]
        else:
            gi = rng.choice(len(names), p=mix)
        gpu_name = names[gi]
        cc, mem_per_gpu = _memory_per_gpu(gpu_name)
        g = int(rng.choice(counts, p=count_p))
        serial[ci] += 1
        lat, lon, _ = geo.place(city)  # type: ignore[misc]  # cities were checked above
        nodes.append(Node(id=f"{_slug(city)}-{serial[ci]}", city=city, gpus=g, gpu_name=gpu_name,
                          compute_capability=cc, memory_gb=g * mem_per_gpu,
                          latitude=lat, longitude=lon))

    # City-pair base RTT: great circle / 100 km per ms * inflation; same city 0.2-2 ms.
    km = great_circle_km_matrix(np.array([geo.coordinates(name) for name in cities]))
    inflation = rng.uniform(*INFLATION_RANGE, size=(c, c))
    inflation = np.triu(inflation, 1) + np.triu(inflation, 1).T
    base = km / geo.KM_PER_MS_RTT * inflation
    np.fill_diagonal(base, rng.uniform(*SAME_CITY_RTT_MS, size=c))

    n = n_nodes
    access = rng.uniform(*ACCESS_MS, size=n)
    noise = rng.normal(1.0, NOISE_FRACTION, size=(n, n)).astype(np.float64)
    noise = np.triu(noise, 1)
    noise = noise + noise.T
    rtt = base[city_of[:, None], city_of[None, :]] * np.clip(noise, 0.85, 1.15)
    rtt += access[:, None] + access[None, :]
    # Never below the speed-of-light bound (the store would reject such a sample).
    rtt = np.maximum(rtt, km[city_of[:, None], city_of[None, :]] / geo.KM_PER_MS_RTT * 1.01)
    rtt = np.round(rtt, 3)
    np.fill_diagonal(rtt, 0.0)

    measured = np.ones((n, n), dtype=bool)
    if missing_fraction > 0 and n > 2:
        drop = rng.random((n, n)) < missing_fraction
        drop = np.triu(drop, 1)
        drop = drop | drop.T
        measured &= ~drop
        chain = rng.permutation(n)   # always measured: keeps the fleet in one piece
        measured[chain[:-1], chain[1:]] = True
        measured[chain[1:], chain[:-1]] = True
    np.fill_diagonal(measured, False)
    return _Generated(tuple(nodes), rtt, measured)


def generate_fleet(n_nodes: int, *, seed: int, cities: list[str] | None = None,
                   n_cities: int | None = None, missing_fraction: float = 0.1,
                   zipf_exponent: float = 1.1, samples: int = 1000,
                   name: str | None = None) -> Fleet:
    """A fleet of ``n_nodes`` servers with measured links for all but ``missing_fraction`` pairs.

    One Link per measured unordered pair. Pass ``complete(fleet)`` to the planners. Meant for up to
    a few hundred nodes; use :func:`generate_network` beyond that.
    """
    gen = _generate(n_nodes, seed, cities, n_cities, missing_fraction, zipf_exponent)
    ii, jj = np.nonzero(np.triu(gen.measured, 1))
    ids = [node.id for node in gen.nodes]
    links = tuple(Link(src=ids[i], dst=ids[j], rtt_ms=float(gen.rtt_ms[i, j]), samples=samples)
                  for i, j in zip(ii.tolist(), jj.tolist()))
    return Fleet(nodes=gen.nodes, links=links, name=name or f"generated-{n_nodes}-s{seed}")


def generate_network(n_nodes: int, *, seed: int, cities: list[str] | None = None,
                     n_cities: int | None = None, missing_fraction: float = 0.1,
                     zipf_exponent: float = 1.1) -> Network:
    """The same servers as :func:`generate_fleet` (same arguments, same seed) as a dense Network.

    Unmeasured pairs keep their generated RTT and are marked ``imputed``; bandwidth follows the
    TCP model of docs/COSTMODEL.md section 2.
    """
    gen = _generate(n_nodes, seed, cities, n_cities, missing_fraction, zipf_exponent)
    imputed = ~gen.measured
    np.fill_diagonal(imputed, False)
    return Network.from_matrix(gen.nodes, gen.rtt_ms, imputed=imputed)


SAME_METRO_RTT_MS = (0.8, 3.0)      # between two data centres of one city


def great_circle_km_matrix(coords_deg: np.ndarray) -> np.ndarray:
    """Great-circle km between every two of ``coords_deg`` ((n, 2) latitude, longitude)."""
    coords = np.radians(coords_deg)
    lat, lon = coords[:, 0], coords[:, 1]
    dlat = lat[:, None] - lat[None, :]
    dlon = lon[:, None] - lon[None, :]
    h = np.sin(dlat / 2) ** 2 + np.cos(lat)[:, None] * np.cos(lat)[None, :] * np.sin(dlon / 2) ** 2
    return 2 * geo.EARTH_RADIUS_KM * np.arcsin(np.minimum(1.0, np.sqrt(h)))


def generate_regional_fleet(n_nodes: int, n_sites: int, *, seed: int,
                            zipf_exponent: float = 0.8, samples: int = 1000,
                            name: str | None = None) -> Fleet:
    """A regional fleet: ``n_nodes`` servers in ``n_sites`` sites (data centres in real cities,
    several per city when there are more sites than cities), measured as site links only.

    Every pair of sites has a site link (great circle / 100 km per ms times a per-pair route
    inflation, never below light speed; 0.8-3 ms between two sites of one city), and every site a
    link to itself (0.2-2 ms between its own servers). No node links: the file stays
    ``n_sites^2`` links long however many servers there are. Same seed, same fleet.
    """
    if n_sites < 1 or n_nodes < n_sites:
        raise ValueError("need at least one site and at least one server per site")
    rng = np.random.default_rng(seed)
    pool = sorted(geo.CITIES)
    city_idx = rng.permutation(len(pool))[np.arange(n_sites) % len(pool)]
    site_city = [pool[i] for i in city_idx]
    per_city: dict[str, int] = {}
    site_ids, coords = [], []
    for city in site_city:
        per_city[city] = per_city.get(city, 0) + 1
        site_ids.append(f"{_slug(city)}-dc{per_city[city]}")
        lat, lon, _ = geo.CITIES[city]
        coords.append((lat, lon))
    coords_arr = np.array(coords)
    km = great_circle_km_matrix(coords_arr)
    inflation = rng.uniform(*INFLATION_RANGE, size=(n_sites, n_sites))
    inflation = np.triu(inflation, 1) + np.triu(inflation, 1).T
    rtt = np.maximum(km / geo.KM_PER_MS_RTT * inflation, km / geo.KM_PER_MS_RTT * 1.01)
    same_city = (city_idx[:, None] == city_idx[None, :])
    metro = rng.uniform(*SAME_METRO_RTT_MS, size=(n_sites, n_sites))
    rtt = np.where(same_city, np.triu(metro, 1) + np.triu(metro, 1).T, rtt)
    np.fill_diagonal(rtt, rng.uniform(*SAME_CITY_RTT_MS, size=n_sites))
    rtt = np.round(rtt, 3)

    weights = 1.0 / np.arange(1, n_sites + 1) ** zipf_exponent
    weights /= weights.sum()
    per_site = np.ones(n_sites, dtype=int) + rng.multinomial(n_nodes - n_sites, weights)
    names = [g for g, _ in GPU_MIX]
    mix = np.array([w for _, w in GPU_MIX])
    mix /= mix.sum()
    counts = np.array([g for g, _ in GPUS_PER_NODE])
    count_p = np.array([w for _, w in GPUS_PER_NODE])
    count_p /= count_p.sum()
    favoured = np.array([rng.choice(len(names), size=2, replace=False, p=mix)
                         for _ in range(n_sites)])
    site_of = np.repeat(np.arange(n_sites), per_site)
    roll = rng.random(n_nodes)
    anywhere = rng.choice(len(names), size=n_nodes, p=mix)
    gpu_idx = np.where(roll < 0.5, favoured[site_of, 0],
                       np.where(roll < 0.75, favoured[site_of, 1], anywhere))
    gpu_count = rng.choice(counts, size=n_nodes, p=count_p)
    facts = [_memory_per_gpu(g) for g in names]
    nodes = []
    serial = np.zeros(n_sites, dtype=int)
    for s, gi, g in zip(site_of.tolist(), gpu_idx.tolist(), gpu_count.tolist()):
        serial[s] += 1
        cc, mem = facts[gi]
        lat, lon = coords[s]
        nodes.append(Node(id=f"{site_ids[s]}-{serial[s]}", city=site_city[s], gpus=g,
                          gpu_name=names[gi], compute_capability=cc, memory_gb=g * mem,
                          latitude=lat, longitude=lon, site=site_ids[s]))
    ii, jj = np.triu_indices(n_sites)
    site_links = tuple(SiteLink(site_ids[i], site_ids[j], rtt_ms=float(rtt[i, j]), samples=samples)
                       for i, j in zip(ii.tolist(), jj.tolist()))
    sites = tuple(Site(site_ids[k], float(coords_arr[k, 0]), float(coords_arr[k, 1]))
                  for k in range(n_sites))
    return Fleet(tuple(nodes), (), name=name or f"regional-{n_nodes}-{n_sites}-s{seed}",
                 sites=sites, site_links=site_links)


# Relative frequency of catalog models in generated job sets: small and mid-size models are the
# common case, 175B-class jobs are rare.
_JOB_WEIGHT_BY_PARAMS = [(1e9, 3.0), (15e9, 2.0), (50e9, 1.0), (math.inf, 0.5)]


def _model_weight(params: float) -> float:
    for limit, weight in _JOB_WEIGHT_BY_PARAMS:
        if params <= limit:
            return weight
    return 0.5


def generate_jobs(n_jobs: int, *, seed: int, models: list[str] | None = None,
                  max_params: float | None = None) -> list[Job]:
    """``n_jobs`` catalog jobs with random sizes: steps 0.25x-2x the catalog's, global batch
    0.25x-2x (a power of two factor, never below the micro-batch). Names are unique."""
    if n_jobs < 0:
        raise ValueError("n_jobs must be non-negative")
    rng = np.random.default_rng(seed)
    pool = sorted(models if models is not None else MODEL_CATALOG)
    if max_params is not None:
        pool = [m for m in pool if MODEL_CATALOG[m]["params"] <= max_params]
    if not pool:
        raise ValueError("no catalog model fits the request")
    w = np.array([_model_weight(MODEL_CATALOG[m]["params"]) for m in pool])
    w /= w.sum()
    used: dict[str, int] = {}
    jobs: list[Job] = []
    for _ in range(n_jobs):
        model = pool[int(rng.choice(len(pool), p=w))]
        spec = MODEL_CATALOG[model]
        used[model] = used.get(model, 0) + 1
        name = model if used[model] == 1 else f"{model}-{used[model]}"
        steps = max(1, int(round(spec["steps"] * rng.choice([0.25, 0.5, 1.0, 1.5, 2.0]))))
        batch = int(spec["global_batch"] * rng.choice([0.25, 0.5, 1.0, 2.0]))
        batch = max(batch, spec["micro_batch"])
        jobs.append(catalog_job(model, name=name, steps=steps, global_batch=batch))
    return jobs
