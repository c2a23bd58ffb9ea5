"""Probing by plan: whom each agent probes in one epoch (pure: values in, values out).

Servers sit in sites (a city, a cloud region, a data centre; ``site_key``). Each epoch a node
probes at most ``peer_bound`` peers:

* **inside its site** ``intra`` peers: all of the site when they fit, else a window of offsets
  into the site's members (sorted by id) that slides by ``intra`` every epoch, so every ordered
  pair inside the site is probed within ``ceil((n_s - 1) / intra)`` epochs;
* **towards other sites** the site's members share out ``slots``: for every other site t,
  ``k_t = min(reps, n_t)`` probe edges (representatives). A site whose members have room for
  all its slots covers every ordered site pair each epoch; one that has not (a tiny site among
  many) covers a window of its slots that slides every epoch. The target of a slot walks
  through t's members from one coverage to the next (the source walks through s's members), so
  every server of t is probed by some server of s within ``pair_period`` epochs; different
  source sites start at different members of t, so the probes a server receives are spread
  evenly.

The split of the bound: inter-site slots get what covers them (``ceil(slots / n_s)`` per node)
but at most half the bound when the site itself needs the rest; the site gets what is left.
A fleet where every node can probe every other within the bound is probed in full (no plan).

Guarantees (``PlanShape``; the property tests check each one):
  - no node has more than ``peer_bound`` peers, never itself, never twice;
  - ``covers_all_site_pairs``: every ordered pair of sites (s, t) has a probe s -> t in every
    epoch, so both ends of every site pair have representatives;
  - ``rotation_period``: from any epoch on, within that many epochs every server is probed by
    a server of every other site, and every ordered pair inside a site is probed (None when
    the bound leaves a site no room to probe out, e.g. ``peer_bound`` 1).

Deterministic: the same nodes, sites, epoch and settings give the same plan, whatever order
the nodes come in; the epoch alone drives the rotation (no random numbers).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from hulk import geo

DEFAULT_PEER_BOUND = 64
DEFAULT_SITE_REPS = 2


def site_key(city: str | None, site: str | None = None) -> str | None:
    """A node's site: its ``site`` when given, else its city (the gazetteer's name, else the
    trimmed name); None for a node with neither."""
    if site and site.strip():
        return site.strip()
    if not city or not city.strip():
        return None
    return geo.canonical_city(city) or city.strip()


@dataclass(frozen=True)
class SiteShare:
    """How one site probes: its members, per-node quotas and inter-site slots."""

    members: tuple[str, ...]          # node ids, sorted
    intra: int                        # peers inside the site per node per epoch
    inter: int                        # most inter-site peers per node per epoch
    slots: tuple[tuple[int, int], ...]  # (other site's index, representative number)
    capacity: int                     # slots covered per epoch: min(len(slots), n * inter)


@dataclass(frozen=True)
class PlanShape:
    """The quotas of a fleet's probe plan (the same for every epoch)."""

    sites: tuple[str | None, ...]     # sorted; None = nodes with no site, probed as one group
    shares: tuple[SiteShare, ...]
    peer_bound: int
    reps: int
    full_mesh: bool                   # every node probes every other (it fits in the bound)

    @property
    def covers_all_site_pairs(self) -> bool:
        """Whether every ordered site pair is probed in every epoch."""
        return self.full_mesh or all(s.capacity >= len(s.slots) for s in self.shares)

    def pair_period(self, s: int, t: int) -> int | None:
        """Epochs within which every server of site t is probed from site s (from any epoch)."""
        if self.full_mesh:
            return 1
        src, dst = self.shares[s], self.shares[t]
        if s == t:
            n = len(src.members)
            return 1 if n <= 1 else (math.ceil((n - 1) / src.intra) if src.intra else None)
        if src.capacity == 0:
            return None
        k = min(self.reps, len(dst.members))
        cycles = math.ceil(len(dst.members) / k)
        if src.capacity >= len(src.slots):
            return cycles
        # A sliding window may start inside t's block of slots: one cycle more, at worst.
        return math.ceil((cycles + 1) * len(src.slots) / src.capacity)

    @property
    def rotation_period(self) -> int | None:
        """Epochs within which every server is probed from every other site and every pair
        inside a site is probed; None when some site cannot probe out at all."""
        worst = 1
        m = len(self.sites)
        for s in range(m):
            for t in range(m):
                p = self.pair_period(s, t)
                if p is None:
                    return None
                worst = max(worst, p)
        return worst


def plan_shape(node_sites: Mapping[str, str | None], peer_bound: int = DEFAULT_PEER_BOUND,
               reps: int = DEFAULT_SITE_REPS) -> PlanShape:
    """The quotas for nodes ``{node id: site}`` (site None: no known site)."""
    if peer_bound < 1 or reps < 1:
        raise ValueError(f"expected peer_bound >= 1 and reps >= 1, got {peer_bound}, {reps}")
    groups: dict[str | None, list[str]] = {}
    for node_id, site in node_sites.items():
        groups.setdefault(site, []).append(node_id)
    sites = tuple(sorted(groups, key=lambda s: (s is not None, s or "")))
    sizes = [len(groups[s]) for s in sites]
    full_mesh = len(node_sites) - 1 <= peer_bound
    shares = []
    for si, site in enumerate(sites):
        members = tuple(sorted(groups[site]))
        n = len(members)
        slots = tuple((ti, r) for ti in range(len(sites)) if ti != si
                      for r in range(min(reps, sizes[ti])))
        want_inter = math.ceil(len(slots) / n)
        inter = min(want_inter, max(peer_bound // 2, peer_bound - (n - 1)))
        intra = min(n - 1, peer_bound - inter)
        shares.append(SiteShare(members, intra, inter, slots, min(len(slots), n * inter)))
    return PlanShape(sites, tuple(shares), peer_bound, reps, full_mesh)


def probe_plan(node_sites: Mapping[str, str | None], epoch: int,
               peer_bound: int = DEFAULT_PEER_BOUND, reps: int = DEFAULT_SITE_REPS,
               shape: PlanShape | None = None) -> dict[str, tuple[str, ...]]:
    """Each node's peers in ``epoch``: ``{node id: peer ids}`` (own site first). ``shape``
    (from ``plan_shape`` of the same nodes and settings) saves recomputing the quotas."""
    if epoch < 0:
        raise ValueError(f"expected an epoch >= 0, got {epoch}")
    shape = shape or plan_shape(node_sites, peer_bound, reps)
    if shape.full_mesh:
        ids = sorted(node_sites)
        return {a: tuple(b for b in ids if b != a) for a in ids}
    peers: dict[str, list[str]] = {}
    for share in shape.shares:
        members, n, q = share.members, len(share.members), share.intra
        if q >= n - 1:
            for j, a in enumerate(members):
                peers[a] = [members[(j + d) % n] for d in range(1, n)]
        else:
            start = epoch * q
            offsets = [1 + (start + r) % (n - 1) for r in range(q)]
            for j, a in enumerate(members):
                peers[a] = [members[(j + d) % n] for d in offsets]
    for si, share in enumerate(shape.shares):
        slots, capacity = share.slots, share.capacity
        if not slots or not capacity:
            continue
        members, n = share.members, len(share.members)
        count = len(slots)
        first = epoch * capacity  # the window of slot positions this epoch covers
        for w in range(capacity):
            position = first + w
            ti, r = slots[position % count]
            cycle = position // count
            target_members = shape.shares[ti].members
            k = min(shape.reps, len(target_members))
            rank = si - (si > ti)  # this site among t's other sites: spreads t's load
            target = target_members[(cycle * k + r + rank * k) % len(target_members)]
            source = peers[members[(w + epoch) % n]]
            if target not in source:  # a window wrapping a tiny site may pick it twice
                source.append(target)
    return {a: tuple(p) for a, p in peers.items()}
