"""A simulated regional fleet for the planner benchmarks: 10,000 servers in 200 sites
of 50, each probing at most 64 peers (its 49 site neighbours and 15 servers of other sites),
one round of 3 packets a minute per peer. Pure and seeded: the same fleet every run.

Site RTTs: 0.2-1 ms inside a site; between sites a figure drawn once per site pair above the
light-speed bound of the cities used for registration (so ingest accepts every summary).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

from hulk import geo
from hulk.wire.histogram import bucket_index, encode

CITIES = ["Beijing", "Shanghai", "Tokyo", "Singapore", "Frankfurt", "London", "New York",
          "California", "Sao Paulo", "Sydney", "New Delhi", "Paris"]


@dataclass(frozen=True)
class Fleet:
    servers: int
    sites: int
    peers_per_agent: int
    seed: int = 7
    _bases: dict = field(default_factory=dict, compare=False, repr=False)

    @property
    def per_site(self) -> int:
        return self.servers // self.sites

    def node_id(self, i: int) -> str:
        return f"sim-{i}"

    def site(self, i: int) -> int:
        return i // self.per_site

    def city(self, i: int) -> str:
        return CITIES[self.site(i) % len(CITIES)]

    def peers(self, i: int, day: int = 0) -> list[int]:
        """Site neighbours first, then servers of other sites (rotated by ``day``)."""
        site, per = self.site(i), self.per_site
        local = [site * per + k for k in range(per) if site * per + k != i]
        local = local[:self.peers_per_agent]
        rng = random.Random(hash((self.seed, i, day)))
        remote: list[int] = []
        while len(local) + len(remote) < self.peers_per_agent:
            other = rng.randrange(self.sites - 1)
            other += other >= site
            remote.append(other * per + rng.randrange(per))
        return local + list(dict.fromkeys(remote))

    def base_rtt_ms(self, a: int, b: int) -> float:
        key = (a, b)
        if key not in self._bases:
            self._bases[key] = self._base(a, b)
        return self._bases[key]

    def _base(self, a: int, b: int) -> float:
        sa, sb = self.site(a), self.site(b)
        if sa == sb:
            return 0.2 + (hash((self.seed, a, b)) % 800) / 1000.0
        bound = geo.min_rtt_ms(geo.coordinates(self.city(a)), geo.coordinates(self.city(b)))
        spread = (hash((self.seed, min(sa, sb), max(sa, sb))) % 1000) / 1000.0
        return max(bound, 1.0) * (1.6 + spread)


def round_figures(rng: random.Random, base_ms: float, packets: int, loss: float = 0.002
                  ) -> tuple[int, int, float, float, float | None, float | None, dict[int, int]]:
    """(count, lost, sum, sum of squares, min, max, histogram) of ``packets`` probes around
    ``base_ms`` (log-normal jitter of 5 %, rare 3x spikes)."""
    rtts = []
    lost = 0
    for _ in range(packets):
        if rng.random() < loss:
            lost += 1
            continue
        r = base_ms * math.exp(rng.gauss(0.0, 0.05))
        if rng.random() < 0.001:
            r *= 3.0
        rtts.append(r)
    hist: dict[int, int] = {}
    for r in rtts:
        k = bucket_index(r)
        hist[k] = hist.get(k, 0) + 1
    return (packets, lost, math.fsum(rtts), math.fsum(r * r for r in rtts),
            min(rtts, default=None), max(rtts, default=None), hist)


_SHAPES: dict[tuple[float, int], tuple] = {}


def aggregate_figures(rng: random.Random, base_ms: float, packets: int, samples_drawn: int = 200
                      ) -> tuple[int, int, float, float, int | None, int | None, bytes | None]:
    """Figures of ``packets`` probes (many rounds at once) as one store summary row's fields
    (min and max in whole microseconds), the histogram scaled from ``samples_drawn`` draws
    made once per pair and reused (its number of buckets is what matters for size)."""
    key = (base_ms, packets)
    if key not in _SHAPES:
        _SHAPES[key] = _aggregate(rng, base_ms, packets, samples_drawn)
    return _SHAPES[key]


def _aggregate(rng, base_ms, packets, samples_drawn):
    count, lost, total, sumsq, lo, hi, hist = round_figures(rng, base_ms, samples_drawn)
    scale = packets / samples_drawn
    received = sum(hist.values())
    hist = {k: max(1, round(c * scale)) for k, c in hist.items()}
    n = sum(hist.values())
    factor = n / received if received else 0.0
    return (n + round(lost * scale), round(lost * scale), total * factor, sumsq * factor,
            None if lo is None else round(lo * 1000), None if hi is None else round(hi * 1000),
            encode(hist) if hist else None)
