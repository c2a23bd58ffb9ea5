"""Site-pair statistics: measurements between servers of two sites folded into one rollup per
ordered site pair (pure: values in, values out).

Under the probe plan (``planner.core.probe_plan``) a site pair is measured through a few
representatives that change every epoch; no single server pair is measured often, but together
they say what the link between the two sites is like. Folding merges the node pairs' rollups
with the same exact sums as a window merges days (``DailyRollup.merge``): the site pair's mean
is the mean over all its samples, its loss the share of all its probes lost, its percentiles
those of the merged histogram.

A pair stays a node pair when both nodes share a site (measured inside a site) or either node
has no site (nothing to fold it into).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from planner.core.rollup import DailyRollup

SitePair = tuple[str, str]

# Fleets of at most this many nodes keep a rollup per node pair everywhere (a thousand nodes
# probing 64 peers each: 64,000 pairs a day, affordable); larger ones are probed by plan and
# keep node pairs only inside a site, one rollup per ordered site pair between sites.
PER_PAIR_UP_TO = 1000


@dataclass
class FoldedPairs:
    """Rollups split into the node pairs kept and the ordered site pairs folded."""

    node_pairs: list[tuple[str, str, DailyRollup]] = field(default_factory=list)
    site_pairs: dict[SitePair, DailyRollup] = field(default_factory=dict)
    folded: dict[SitePair, int] = field(default_factory=dict)   # node pairs per site pair


def fold_site_pairs(pairs: Iterable[tuple[str, str, DailyRollup]],
                    site_of: Mapping[str, str | None]) -> FoldedPairs:
    """Fold ordered node pairs ``(src, dst, rollup)`` between different sites into their site
    pair; ``site_of`` maps node id to site (None or absent: no site)."""
    out = FoldedPairs()
    for src, dst, rollup in pairs:
        a, b = site_of.get(src), site_of.get(dst)
        if a is None or b is None or a == b:
            out.node_pairs.append((src, dst, rollup))
            continue
        key = (a, b)
        merged = out.site_pairs.get(key)
        if merged is None:
            merged = out.site_pairs[key] = DailyRollup()
        merged.merge(rollup)
        out.folded[key] = out.folded.get(key, 0) + 1
    return out


def site_locations(members: Iterable[tuple[str | None, tuple[float, float] | None]]
                   ) -> dict[str, tuple[float, float] | None]:
    """Each site's location: the mean of its located members' coordinates (None when none is
    located). ``members`` yields (site, coordinates or None) per node; nodes without a site are
    skipped."""
    sums: dict[str, list[float]] = {}
    for site, where in members:
        if site is None:
            continue
        acc = sums.setdefault(site, [0.0, 0.0, 0.0])
        if where is not None:
            acc[0] += where[0]
            acc[1] += where[1]
            acc[2] += 1
    return {site: (lat / k, lon / k) if k else None for site, (lat, lon, k) in sums.items()}
