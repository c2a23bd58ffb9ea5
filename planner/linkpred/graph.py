"""The values link prediction reads and returns (pure: no model, no I/O).

A :class:`SiteGraph` is a fleet seen at the level of its sites: each site's provider and place,
and the unordered site pairs measured so far (RTT and throughput, either may be missing). A
model fitted on one returns a :class:`LinkPrediction` for every pair of sites: measured pairs
keep their measured figures, the rest get a point estimate and a conservative bound (a lower
quantile of throughput, an upper one of RTT), because the planner exploits optimistic errors.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from typing import Protocol

import numpy as np

# The quantiles the conservative figures stand for: the planner reads throughput at its 20th
# percentile and RTT at its 80th where a pair was not measured.
LOW_QUANTILE = 0.2
HIGH_QUANTILE = 0.8
PROVIDERS = ("aws", "azure", "gcp")


class Source(IntEnum):
    """Where a site pair's figure comes from (the ``source`` of a fleet file's site link)."""

    MEASURED = 0
    PREDICTED = 1
    FORMULA = 2     # relay over measured RTTs and the one-window TCP formula (no model)

    @property
    def label(self) -> str:
        return self.name.lower()


def provider_of(site: str) -> str:
    """The cloud provider a site id names ("aws:eu-west-3" -> "aws"), else ""."""
    head, sep, _ = site.partition(":")
    return head.lower() if sep and head.lower() in PROVIDERS else ""


@dataclass(frozen=True)
class SiteGraph:
    """S sites and E measured unordered pairs (``i < j``), as arrays.

    ``rtt_ms`` / ``gbps`` are NaN where the pair's RTT / throughput was not measured (a pair is
    listed when at least one of them was). ``gpus``: GPUs at the site (0 where unknown);
    ``latitude`` / ``longitude``: degrees, NaN where unknown."""

    sites: tuple[str, ...]
    provider: tuple[str, ...]
    latitude: np.ndarray
    longitude: np.ndarray
    gpus: np.ndarray
    i: np.ndarray
    j: np.ndarray
    rtt_ms: np.ndarray
    gbps: np.ndarray

    @property
    def n_sites(self) -> int:
        return len(self.sites)

    def masked(self, keep: np.ndarray) -> "SiteGraph":
        """The graph with only the measured pairs where ``keep`` (a boolean mask over E) is True:
        how benchmarks hide pairs."""
        keep = np.asarray(keep, dtype=bool)
        return SiteGraph(self.sites, self.provider, self.latitude, self.longitude, self.gpus,
                         self.i[keep], self.j[keep], self.rtt_ms[keep], self.gbps[keep])


@dataclass(frozen=True)
class LinkPrediction:
    """Every pair of S sites, as symmetric S x S matrices (the diagonal is a site with itself).

    ``rtt_ms`` and ``gbps`` are the point estimates (medians); ``rtt_hi_ms`` and ``gbps_lo`` the
    conservative bounds the planner uses for pairs not measured (equal to the measured figure
    where measured). ``source`` holds :class:`Source` values per pair and per quantity."""

    model: str
    sites: tuple[str, ...]      # the matrices' order: the graph's sites
    rtt_ms: np.ndarray
    rtt_hi_ms: np.ndarray
    gbps: np.ndarray
    gbps_lo: np.ndarray
    rtt_source: np.ndarray      # uint8 Source per pair
    gbps_source: np.ndarray     # uint8 Source per pair


class FittedLinkModel(Protocol):
    """A model fitted on one graph's measured pairs."""

    name: str

    def predict(self, graph: SiteGraph) -> LinkPrediction:
        """Figures for every pair of ``graph``'s sites (same sites as fitted on)."""
        ...


class LinkModel(Protocol):
    """A way to predict links: fit on a graph's measured pairs, with a seed."""

    name: str

    def fit(self, graph: SiteGraph, seed: int = 0) -> FittedLinkModel:
        ...
