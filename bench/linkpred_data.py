"""The networks the link-prediction benchmark (bench/linkpred_bench.py) hides pairs of: Skyplane's
measured cloud regions, and generated fleets whose every pair is known.

Skyplane (bench/skyplane_data.py reads it): each region is a site, its provider the name's prefix
("aws:", "azure:", "gcp:"), its place hulk.cloud_regions' metro (a Google Cloud zone, "-a",
takes its region's). A pair measured in both directions takes the median of the two.

Generated fleets: a ground truth written to be none of the models, set before any model was
run and not tuned since (the constants below):
- sites sit at real cloud-region metros (hulk.cloud_regions) with up to ~300 km of jitter;
  each is AWS, Google Cloud, Azure or on premises ("") with PROVIDER_SHARE;
- each site has an egress cap drawn from its provider's log-normal (EGRESS: median Gbit/s,
  sigma of its log) and an access delay (exponential, mean ACCESS_MS, each way);
- RTT = both access delays + the great-circle distance at 100 km per ms of RTT (light in fibre,
  both ways) times a route inflation drawn per pair (log-normal; a provider's own backbone
  inflates less than a path between two networks), times measurement noise;
- throughput = the smaller of the two caps times a factor falling with RTT, 1 / (1 + RTT / R),
  R larger inside one provider's backbone, times log-normal noise.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from planner.linkpred.controls_base import distance_km
from planner.linkpred.graph import SiteGraph, provider_of

PROVIDER_SHARE = {"aws": 0.3, "gcp": 0.3, "azure": 0.25, "": 0.15}
EGRESS = {"aws": (5.0, 0.25), "gcp": (7.0, 0.3), "azure": (12.0, 0.4), "": (2.0, 0.8)}
ACCESS_MS = 0.8
KM_PER_MS_RTT = 100.0
INFLATION = {"same": (1.3, 0.15), "cross": (1.7, 0.3)}      # median, sigma of its log
RTT_NOISE = 0.05
RTT_SCALE_MS = {"same": 400.0, "cross": 150.0}
THROUGHPUT_NOISE = 0.3
JITTER_DEGREES = 2.5
GPUS = (8, 64)


@dataclass(frozen=True)
class Dataset:
    """A network whose measured pairs are the truth the benchmark hides and judges."""

    name: str
    truth: SiteGraph
    note: str


def _gcp_region(name: str) -> str:
    """``gcp:europe-west6-a`` -> ``gcp:europe-west6`` (a zone's region)."""
    head, _, tail = name.rpartition("-")
    return head if name.startswith("gcp:") and len(tail) == 1 and head.count("-") else name


def skyplane_dataset(shared: Path, regions: int | None = None) -> Dataset:
    """Skyplane's regions as sites (the first ``regions`` by name when given)."""
    from bench.skyplane_data import load
    from hulk import geo

    data = load(Path(shared))
    names = sorted({p.src for p in data.pairs} | {p.dst for p in data.pairs})
    if regions is not None:
        names = names[:regions]
    index = {name: k for k, name in enumerate(names)}
    figures: dict[tuple[int, int], list[tuple[float, float]]] = defaultdict(list)
    for p in data.pairs:
        if p.src in index and p.dst in index:
            a, b = sorted((index[p.src], index[p.dst]))
            figures[(a, b)].append((p.rtt_ms, p.measured_gbps))
    keys = sorted(figures)
    places = [geo.coordinates(_gcp_region(name)) for name in names]
    graph = SiteGraph(
        tuple(names), tuple(provider_of(name) for name in names),
        np.array([w[0] if w else np.nan for w in places]),
        np.array([w[1] if w else np.nan for w in places]), np.zeros(len(names)),
        np.array([a for a, _ in keys], dtype=np.int64),
        np.array([b for _, b in keys], dtype=np.int64),
        np.array([float(np.median([f[0] for f in figures[k]])) for k in keys]),
        np.array([float(np.median([f[1] for f in figures[k]])) for k in keys]))
    return Dataset("skyplane", graph, "Skyplane inter-region iperf3 (64 streams) and ping, "
                   "premium tier, median of both directions")


@dataclass(frozen=True)
class GeneratedTruth:
    """What the generator drew before any pair's own randomness: per site its egress cap and
    access delay, per pair (the upper triangle, ``i < j``) its distance and whether both ends are
    one provider's backbone. bench/linkpred_floor.py predicts from these alone."""

    graph: SiteGraph
    cap_gbps: np.ndarray
    access_ms: np.ndarray
    km: np.ndarray
    same: np.ndarray


def generated_truth(sites: int, seed: int) -> GeneratedTruth:
    """A fleet of ``sites`` sites with every pair's RTT and throughput drawn from the ground
    truth in this module's docstring, and the per-site and per-pair draws behind them."""
    from hulk.cloud_regions import REGIONS

    rng = np.random.default_rng(seed)
    metros = np.array([v[:2] for v in REGIONS.values()], dtype=float)
    at = metros[rng.integers(0, len(metros), sites)]
    lat = np.clip(at[:, 0] + rng.uniform(-JITTER_DEGREES, JITTER_DEGREES, sites), -89, 89)
    lon = at[:, 1] + rng.uniform(-JITTER_DEGREES, JITTER_DEGREES, sites)
    kinds = list(PROVIDER_SHARE)
    provider = rng.choice(len(kinds), size=sites, p=list(PROVIDER_SHARE.values()))
    providers = tuple(kinds[k] for k in provider)
    cap = np.array([rng.lognormal(np.log(EGRESS[p][0]), EGRESS[p][1]) for p in providers])
    access = rng.exponential(ACCESS_MS, sites)
    names = tuple(f"{p}:site-{k:03d}" if p else f"onprem-{k:03d}"
                  for k, p in enumerate(providers))
    i, j = np.triu_indices(sites, k=1)
    probe = SiteGraph(names, providers, lat, lon, np.zeros(sites), i, j, np.zeros(len(i)),
                      np.zeros(len(i)))
    km = distance_km(probe)[i, j]
    same = (provider[i] == provider[j]) & (provider[i] != kinds.index(""))
    median = np.where(same, INFLATION["same"][0], INFLATION["cross"][0])
    sigma = np.where(same, INFLATION["same"][1], INFLATION["cross"][1])
    inflation = median * np.exp(rng.normal(0.0, 1.0, len(i)) * sigma)
    rtt = (2 * (access[i] + access[j]) + km / KM_PER_MS_RTT * inflation) \
        * np.exp(rng.normal(0.0, RTT_NOISE, len(i)))
    scale = np.where(same, RTT_SCALE_MS["same"], RTT_SCALE_MS["cross"])
    gbps = np.minimum(cap[i], cap[j]) / (1 + rtt / scale) \
        * np.exp(rng.normal(0.0, THROUGHPUT_NOISE, len(i)))
    gpus = rng.integers(GPUS[0], GPUS[1] + 1, sites).astype(float)
    graph = SiteGraph(names, providers, lat, lon, gpus, i, j, rtt, gbps)
    return GeneratedTruth(graph, cap, access, km, same)


def generated_dataset(sites: int, seed: int) -> Dataset:
    """A fleet of ``sites`` sites with every pair's RTT and throughput drawn from the ground
    truth in this module's docstring."""
    return Dataset(f"generated-{sites}-s{seed}", generated_truth(sites, seed).graph,
                   f"{sites} sites, ground truth of bench/linkpred_data.py, seed {seed}")
