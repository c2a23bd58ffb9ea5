"""Which pairs the link-prediction benchmark hides, and how it judges a prediction on them.

A split keeps some of a network's measured pairs (what every model is fitted on) and judges the
models on some of the hidden ones. Every model sees the same splits:
- ``hide 20%`` / ``hide 50%`` / ``hide 70%``: a seeded random share hidden, all of them judged;
- ``cold region k``: the ``hide 50%`` split of the same seed, then COLD_REGIONS sites keep only
  k measured pairs each (to sites that are not cold); judged on the cold sites' hidden pairs;
- ``cold provider pair``: the ``hide 50%`` split of seed 0 with every pair of one provider pair
  hidden; judged on that provider pair.

Errors are |ln(predicted / true)| per judged pair, for the point throughput and the point RTT;
an optimistic error is a conservative figure on the wrong side of the truth (throughput lower
bound above it, RTT upper bound below it).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from planner.linkpred.graph import LinkPrediction, SiteGraph

HIDE_SHARES = (0.2, 0.5, 0.7)
COLD_PAIRS = (1, 3, 5)
COLD_REGIONS = 5
COLD_BASE_SHARE = 0.5


@dataclass(frozen=True)
class Split:
    """``keep``: the pairs a model is fitted on; ``judge``: the hidden pairs it is judged on
    (boolean masks over the network's pairs)."""

    kind: str
    seed: int
    keep: np.ndarray
    judge: np.ndarray
    detail: str = ""


def hidden(pairs: int, share: float, seed: int) -> np.ndarray:
    """A seeded keep-mask hiding round(share * pairs) pairs."""
    rng = np.random.default_rng([seed, int(share * 1000)])
    keep = np.ones(pairs, dtype=bool)
    keep[rng.permutation(pairs)[:int(round(share * pairs))]] = False
    return keep


def hide_splits(graph: SiteGraph, seeds, shares=HIDE_SHARES) -> list[Split]:
    out = []
    for share in shares:
        for seed in seeds:
            keep = hidden(len(graph.i), share, seed)
            out.append(Split(f"hide {share:.0%}", seed, keep, ~keep))
    return out


def cold_region_splits(graph: SiteGraph, seeds, counts=COLD_PAIRS,
                       regions: int = COLD_REGIONS) -> list[Split]:
    out = []
    s = graph.n_sites
    regions = min(regions, max(1, s // 4))
    for seed in seeds:
        rng = np.random.default_rng([seed, 7])
        cold = np.zeros(s, dtype=bool)
        cold[rng.choice(s, size=regions, replace=False)] = True
        touches = cold[graph.i] | cold[graph.j]
        both = cold[graph.i] & cold[graph.j]
        for k in counts:
            keep = hidden(len(graph.i), COLD_BASE_SHARE, seed) & ~touches
            pick = np.random.default_rng([seed, k, 11])
            for site in np.flatnonzero(cold):
                own = np.flatnonzero(((graph.i == site) | (graph.j == site)) & ~both)
                keep[pick.choice(own, size=min(k, len(own)), replace=False)] = True
            judge = touches & ~keep
            names = ", ".join(graph.sites[x] for x in np.flatnonzero(cold))
            out.append(Split(f"cold region {k}", seed, keep, judge, f"cold sites: {names}"))
    return out


def provider_pairs(graph: SiteGraph) -> list[tuple[str, str]]:
    """Unordered provider pairs with at least one measured pair, sorted."""
    p = np.array(graph.provider, dtype=object)
    a, b = p[graph.i], p[graph.j]
    return sorted({tuple(sorted((x, y))) for x, y in zip(a, b)})


def cold_provider_splits(graph: SiteGraph, seed: int = 0) -> list[Split]:
    out = []
    p = np.array(graph.provider, dtype=object)
    a, b = p[graph.i], p[graph.j]
    for x, y in provider_pairs(graph):
        group = ((a == x) & (b == y)) | ((a == y) & (b == x))
        keep = hidden(len(graph.i), COLD_BASE_SHARE, seed) & ~group
        if not keep.any():
            continue
        out.append(Split("cold provider pair", seed, keep, group,
                         f"{x or 'on-premises'}-{y or 'on-premises'}"))
    return out


@dataclass(frozen=True)
class Judged:
    """Per judged pair: the errors and whether each conservative figure was optimistic."""

    gbps_error: np.ndarray
    rtt_error: np.ndarray
    gbps_optimistic: np.ndarray
    rtt_optimistic: np.ndarray


def judge(prediction: LinkPrediction, truth: SiteGraph, mask: np.ndarray) -> Judged:
    a, b = truth.i[mask], truth.j[mask]
    gbps, rtt = truth.gbps[mask], truth.rtt_ms[mask]
    has_bw, has_rtt = gbps > 0, rtt > 0
    return Judged(
        np.abs(np.log(prediction.gbps[a, b][has_bw] / gbps[has_bw])),
        np.abs(np.log(prediction.rtt_ms[a, b][has_rtt] / rtt[has_rtt])),
        prediction.gbps_lo[a, b][has_bw] > gbps[has_bw],
        prediction.rtt_hi_ms[a, b][has_rtt] < rtt[has_rtt])


def figures(judged: list[Judged]) -> dict:
    """p50 and p90 of the pooled errors and the optimistic shares, over ``judged``."""
    gbps = np.concatenate([j.gbps_error for j in judged]) if judged else np.empty(0)
    rtt = np.concatenate([j.rtt_error for j in judged]) if judged else np.empty(0)
    opt_bw = np.concatenate([j.gbps_optimistic for j in judged]) if judged else np.empty(0)
    opt_rtt = np.concatenate([j.rtt_optimistic for j in judged]) if judged else np.empty(0)

    def q(x, p):
        return round(float(np.quantile(x, p)), 4) if len(x) else None

    def share(x):
        return round(float(np.mean(x)), 4) if len(x) else None

    either = np.concatenate([opt_bw, opt_rtt]) if len(opt_bw) + len(opt_rtt) else np.empty(0)
    return {"pairs": int(len(gbps)), "gbps_p50": q(gbps, 0.5), "gbps_p90": q(gbps, 0.9),
            "rtt_p50": q(rtt, 0.5), "rtt_p90": q(rtt, 0.9),
            "gbps_optimistic": share(opt_bw), "rtt_optimistic": share(opt_rtt),
            "optimistic": share(either)}
