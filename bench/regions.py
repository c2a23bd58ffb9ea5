"""Fleets of servers in real cloud regions, for the portfolio benchmark.

The coordinates are those of the metro area each provider names for the region (AWS, Google
Cloud and Azure publish the city or state of every region on their region pages; the figures
here are the public coordinates of those cities, rounded to 0.1 degree, written for this
project). RTTs follow the model of planner/core/generate.py: great-circle distance at 100 km
per ms of RTT times a per-pair route inflation in [1.3, 2.5], 0.2-2 ms inside a region, a
per-server access latency and 5% per-pair noise. This stands in until hulk/geo.py carries the
providers' regions itself.
"""

from __future__ import annotations

import numpy as np

from hulk import geo
from planner.core.fleet import Network, Node
from planner.core.generate import (GPU_MIX, GPUS_PER_NODE, INFLATION_RANGE, SAME_CITY_RTT_MS,
                                    great_circle_km_matrix)
from planner.core import gpus

# region: (latitude, longitude)
REGIONS: dict[str, tuple[float, float]] = {
    # AWS
    "aws us-east-1": (39.0, -77.5), "aws us-east-2": (40.0, -83.0),
    "aws us-west-1": (37.4, -121.9), "aws us-west-2": (45.8, -119.7),
    "aws ca-central-1": (45.5, -73.6), "aws sa-east-1": (-23.5, -46.6),
    "aws eu-west-1": (53.3, -6.3), "aws eu-west-2": (51.5, -0.1),
    "aws eu-west-3": (48.9, 2.3), "aws eu-central-1": (50.1, 8.7),
    "aws eu-north-1": (59.3, 18.1), "aws eu-south-1": (45.5, 9.2),
    "aws ap-northeast-1": (35.7, 139.7), "aws ap-northeast-2": (37.6, 127.0),
    "aws ap-northeast-3": (34.7, 135.5), "aws ap-southeast-1": (1.3, 103.8),
    "aws ap-southeast-2": (-33.9, 151.2), "aws ap-southeast-3": (-6.2, 106.8),
    "aws ap-south-1": (19.1, 72.9), "aws ap-east-1": (22.3, 114.2),
    "aws me-south-1": (26.1, 50.6), "aws af-south-1": (-33.9, 18.4),
    # Google Cloud
    "gcp us-central1": (41.3, -95.9), "gcp us-east1": (33.2, -80.0),
    "gcp us-east4": (39.0, -77.5), "gcp us-west1": (45.6, -121.2),
    "gcp us-west2": (34.1, -118.2), "gcp us-west3": (40.8, -111.9),
    "gcp us-west4": (36.2, -115.1), "gcp northamerica-northeast2": (43.7, -79.4),
    "gcp southamerica-east1": (-23.5, -46.8), "gcp southamerica-west1": (-33.4, -70.6),
    "gcp europe-west1": (50.5, 3.8), "gcp europe-west2": (51.5, -0.1),
    "gcp europe-west3": (50.1, 8.7), "gcp europe-west4": (53.4, 6.8),
    "gcp europe-west6": (47.4, 8.5), "gcp europe-north1": (60.6, 27.2),
    "gcp europe-central2": (52.2, 21.0), "gcp asia-east1": (24.1, 120.5),
    "gcp asia-east2": (22.3, 114.2), "gcp asia-northeast1": (35.7, 139.7),
    "gcp asia-south1": (19.1, 72.9), "gcp asia-southeast1": (1.3, 103.7),
    "gcp australia-southeast1": (-33.9, 151.2), "gcp me-west1": (32.1, 34.8),
    # Azure
    "azure eastus": (36.7, -78.4), "azure westus2": (47.2, -119.9),
    "azure centralus": (41.6, -93.6), "azure southcentralus": (29.4, -98.5),
    "azure westeurope": (52.4, 4.9), "azure northeurope": (53.3, -6.3),
    "azure uksouth": (51.5, -0.1), "azure francecentral": (48.9, 2.3),
    "azure germanywestcentral": (50.1, 8.7), "azure swedencentral": (60.7, 17.1),
    "azure norwayeast": (59.9, 10.8), "azure switzerlandnorth": (47.4, 8.5),
    "azure japaneast": (35.7, 139.7), "azure koreacentral": (37.6, 127.0),
    "azure southeastasia": (1.3, 103.8), "azure eastasia": (22.3, 114.2),
    "azure australiaeast": (-33.9, 151.2), "azure centralindia": (18.5, 73.9),
    "azure brazilsouth": (-23.5, -46.6), "azure southafricanorth": (-26.2, 28.0),
    "azure uaenorth": (25.3, 55.3), "azure qatarcentral": (25.3, 51.5),
    "azure canadacentral": (43.7, -79.4),
}



def region_network(n_servers: int, n_regions: int, *, seed: int) -> Network:
    """``n_servers`` servers spread over ``n_regions`` regions drawn from :data:`REGIONS`
    (every region gets at least one, the rest Zipf-like), as a dense Network."""
    rng = np.random.default_rng([seed, n_servers, n_regions])
    names = sorted(REGIONS)
    if not 1 <= n_regions <= min(len(names), n_servers):
        raise ValueError(f"n_regions must be in 1..{min(len(names), n_servers)}")
    regions = [names[i] for i in rng.choice(len(names), size=n_regions, replace=False)]
    weights = 1.0 / np.arange(1, n_regions + 1) ** 1.1
    per_region = 1 + rng.multinomial(n_servers - n_regions, weights / weights.sum())
    region_of = np.repeat(np.arange(n_regions), per_region)
    gpu_names = [g for g, _ in GPU_MIX]
    mix = np.array([w for _, w in GPU_MIX])
    mix /= mix.sum()
    counts = np.array([c for c, _ in GPUS_PER_NODE])
    count_p = np.array([w for _, w in GPUS_PER_NODE])
    count_p /= count_p.sum()
    site = [rng.choice(len(gpu_names), size=2, replace=False, p=mix) for _ in regions]
    nodes = []
    serial = np.zeros(n_regions, dtype=int)
    for r in region_of:
        roll = rng.random()
        gi = site[r][0] if roll < 0.5 else site[r][1] if roll < 0.75 else rng.choice(len(gpu_names), p=mix)
        row = gpus.lookup_name(gpu_names[gi])
        g = int(rng.choice(counts, p=count_p))
        serial[r] += 1
        lat, lon = REGIONS[regions[r]]
        nodes.append(Node(id=f"{regions[r].replace(' ', '-')}-{serial[r]}", city=regions[r],
                          gpus=g, gpu_name=gpu_names[gi], compute_capability=row[1],
                          memory_gb=g * row[3], latitude=lat, longitude=lon))
    km = great_circle_km_matrix(np.array([REGIONS[r] for r in regions]))
    inflation = np.triu(rng.uniform(*INFLATION_RANGE, size=(n_regions, n_regions)), 1)
    base = km / geo.KM_PER_MS_RTT * (inflation + inflation.T)
    np.fill_diagonal(base, rng.uniform(*SAME_CITY_RTT_MS, size=n_regions))
    noise = np.triu(rng.normal(1.0, 0.05, size=(n_servers, n_servers)), 1)
    access = rng.uniform(0.0, 0.3, size=n_servers)
    rtt = base[region_of[:, None], region_of[None, :]] * np.clip(noise + noise.T, 0.85, 1.15)
    rtt = np.round(rtt + access[:, None] + access[None, :], 3)
    np.fill_diagonal(rtt, 0.0)
    return Network.from_matrix(nodes, rtt)
