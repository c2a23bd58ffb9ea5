"""Generate the example fleets shipped in examples/fleets/ from public facts only.

City coordinates come from the gazetteer (hulk.geo), GPU names, compute capabilities and memory
from planner/core/gpus.py. Link RTTs follow the physics: great-circle km / 100 (the speed of light
in fibre, round trip) times a route inflation of 1.5-2.5, plus a little noise; servers in the same
city sit 0.3-2 ms apart. A few pairs are left unmeasured, as in real fleets, so completion is
exercised. Everything is deterministic from the seed.

``lab-5`` is the WAN lab's five-server fleet (lab.matrix.table1(5): the first five cities of the
paper's Table 1, the lab's modelled RTTs at its default scale of 0.25), each server declaring
8 x A100 40 GB as the lab's agents do: what `fleet export` gives after
`python -m lab.run --hosts 5`, every pair measured.

    .venv/bin/python examples/make_fleets.py            # rewrites examples/fleets/*.json
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from hulk import geo  # noqa: E402
from planner.core import gpus as gpu_catalog  # noqa: E402
from planner.core.fleet import Fleet, Link, Node  # noqa: E402
from planner.files.fleet import save_fleet_json  # noqa: E402


@dataclass(frozen=True)
class Spec:
    name: str
    cities: dict[str, int]     # city -> number of servers
    gpu_names: list[str]       # catalog fragments to draw from
    missing_fraction: float    # share of cross-city pairs left unmeasured
    seed: int


SPECS = [
    Spec("asia-24", {"Beijing": 5, "Shanghai": 4, "Tokyo": 4, "Seoul": 3, "Singapore": 4,
                     "Hong Kong": 4},
         ["A100", "H100", "V100", "RTX 3090", "A40", "L40S"], 0.06, 24),
    Spec("world-48", {"Beijing": 4, "Tokyo": 4, "Singapore": 4, "New Delhi": 3, "Sydney": 3,
                      "Frankfurt": 5, "London": 4, "Paris": 3, "New York": 5, "California": 5,
                      "Sao Paulo": 4, "Johannesburg": 4},
         ["A100", "H100", "V100", "RTX 4090", "RTX 3090", "A40", "L40S", "T4"], 0.10, 48),
]


def make_fleet(spec: Spec) -> Fleet:
    rng = np.random.default_rng(spec.seed)
    nodes: list[Node] = []
    for city, count in spec.cities.items():
        slug = city.lower().replace(" ", "-").replace("'", "")
        for k in range(1, count + 1):
            fragment = spec.gpu_names[int(rng.integers(len(spec.gpu_names)))]
            row = gpu_catalog.lookup_name(fragment)
            assert row is not None, fragment
            _, cc, _, mem_per_gpu = row
            gpus = int(rng.choice([4, 8, 8, 8]))
            nodes.append(Node(id=f"{slug}-{k}", city=city, gpus=gpus,
                              gpu_name=_nvml_name(fragment, mem_per_gpu),
                              compute_capability=cc, memory_gb=gpus * mem_per_gpu))
    links: list[Link] = []
    for i, a in enumerate(nodes):
        for b in nodes[i + 1:]:
            same_city = a.city == b.city
            if not same_city and rng.random() < spec.missing_fraction:
                continue  # this pair was never measured
            if same_city:
                rtt = float(rng.uniform(0.3, 2.0))
            else:
                bound = geo.min_rtt_ms(geo.coordinates(a.city), geo.coordinates(b.city))
                rtt = bound * float(rng.uniform(1.5, 2.5)) + float(rng.exponential(2.0))
            loss = float(rng.choice([0.0, 0.0, 0.0, 0.001, 0.004]))
            src, dst = (a, b) if rng.random() < 0.5 else (b, a)
            links.append(Link(src.id, dst.id, rtt_ms=round(rtt, 2), loss=loss,
                              samples=int(rng.integers(1000, 5000))))
    return Fleet(tuple(nodes), tuple(links), name=spec.name)


LAB_HOSTS = 5
LAB_SCALE = 0.25   # lab.run's default --scale: the RTTs its switch applies and agents measure
LAB_GPUS, LAB_GPU_NAME, LAB_GPU_GB = 8, "NVIDIA A100-SXM4-40GB", 40.0   # lab.fleet.LAB_GPUS


def make_lab_fleet(hosts: int = LAB_HOSTS) -> Fleet:
    """The WAN lab's fleet of ``hosts`` servers (module docstring)."""
    from lab.matrix import table1

    matrix = table1(hosts).scaled(LAB_SCALE)
    _, cc, _, _ = gpu_catalog.lookup_name(LAB_GPU_NAME)
    nodes = tuple(Node(id=h.name, city=h.city, gpus=LAB_GPUS, gpu_name=LAB_GPU_NAME,
                       compute_capability=cc, memory_gb=LAB_GPUS * LAB_GPU_GB)
                  for h in matrix.hosts)
    links = tuple(Link(a.id, b.id, rtt_ms=round(matrix.rtt(i, j), 2), samples=1000)
                  for i, a in enumerate(nodes) for j, b in enumerate(nodes) if i < j)
    return Fleet(nodes, links, name=f"lab-{hosts}")


def _nvml_name(fragment: str, mem_gb: float) -> str:
    # Names as NVML reports them, so the catalog lookup by name is exercised.
    return {"A100": "NVIDIA A100-SXM4-40GB", "H100": "NVIDIA H100 80GB HBM3",
            "V100": "Tesla V100-SXM2-32GB", "T4": "Tesla T4"}.get(
        fragment, f"NVIDIA GeForce {fragment}" if fragment.startswith("RTX 40") or
        fragment.startswith("RTX 30") else f"NVIDIA {fragment}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "examples" / "fleets")
    args = parser.parse_args(argv)
    for fleet in [make_fleet(spec) for spec in SPECS] + [make_lab_fleet()]:
        path = args.out / f"{fleet.name}.json"
        save_fleet_json(fleet, path)
        print(f"{path}: {len(fleet.nodes)} nodes, {len(fleet.links)} measured links")
    return 0


if __name__ == "__main__":
    sys.exit(main())
