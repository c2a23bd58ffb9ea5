"""The link sections of a fleet JSON: node ``links``, ``sites`` and ``site_links``.

A large file's links are checked column by column with numpy (a full mesh of 1,000 servers is
half a million links): the fast path accepts only links that are plainly well formed (known
ends, numbers in range, no self-loop, no duplicate, no imputed flag, no unknown field) and hands
anything else to the per-link reader, which names the file, line and field of the first problem
and reports each flaw once.

The fastest path decodes node links straight into :class:`LinkRecord` structs (msgspec: typed,
half the memory of dicts and twice orjson's speed on a full mesh); what msgspec refuses, or
what :func:`record_columns` finds less than plainly well formed, is read again the dict way.
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import chain
from operator import attrgetter, itemgetter, methodcaller
from typing import Any

import msgspec
import numpy as np

from hulk.errors import InputError
from planner.core.fleet import (FLEET_BOUNDS, FLEET_TEXT_CHARS, MEASURED, SITE_LINK_SOURCES,
                                Link, LinkTable, Site, SiteLink)
from planner.files.jsonfields import MAX_JSON_INT, Fields, LineFinder, json_type
from planner.files.paper import ImportIssue

LINK_KEYS = {"src", "dst", "rtt_ms", "bandwidth_gbps", "loss", "samples", "imputed"}
SITE_KEYS = {"id", "lat", "lon"}
# What ``fleet complete`` adds to a site link it wrote, and the RTT's own source of a measured
# throughput whose RTT was not (read by the per-link reader).
COMPLETION_KEYS = {"source", "rtt_hi_ms", "bandwidth_lo_gbps", "rtt_source"}
SITE_LINK_KEYS = {"src", "dst", "rtt_ms", "bandwidth_gbps", "loss", "samples"} | COMPLETION_KEYS
NUMBER = frozenset({int, float})
NUMBER_OR_NULL = frozenset({int, float, type(None)})

NoteUnknown = Callable[..., None]


class LinkRecord(msgspec.Struct, forbid_unknown_fields=True, gc=False):
    """One node link exactly as a plainly well-formed file gives it (an ``imputed`` flag or
    an unknown field is refused here and read by the dict path, which reports it)."""

    src: str
    dst: str
    rtt_ms: float
    bandwidth_gbps: float | None = None
    loss: float | None = None
    samples: int | None = None


class CarefulReadNeeded(Exception):
    """Typed link records that are not plainly well formed: read the file the dict way."""


def _numbers(values: list, allowed: frozenset, default: float) -> np.ndarray | None:
    """``values`` as floats (null -> ``default``), or None when one is of another type, not
    finite or an integer too large to be a count."""
    types = set(map(type, values))
    if not types <= allowed:
        return None
    try:
        arr = np.array(values if type(None) not in types else
                       [0.0 if v is None else v for v in values], dtype=float)
    except (OverflowError, ValueError):
        return None
    if not np.isfinite(arr).all() or (np.abs(arr) > MAX_JSON_INT).any():
        return None
    if default != 0.0 and type(None) in types:
        arr[np.array([v is None for v in values], dtype=bool)] = default
    return arr


def _column(raw: list[dict], key: str, keys: set[str], everywhere: bool) -> list:
    """Every object's ``key`` (None where absent); ``everywhere``: every object has every key."""
    if key not in keys:
        return [None] * len(raw)
    return list(map(itemgetter(key) if everywhere else methodcaller("get", key), raw))


def fast_columns(raw: list, allowed: set[str], index: dict[str, int],
                 self_loops: bool) -> tuple[np.ndarray, ...] | None:
    """(src, dst, rtt, bw with NaN for null, loss, samples) of plainly well-formed links, in file
    order; None when any link needs the careful reader (which then finds and names the flaw)."""
    if raw and set(map(type, raw)) != {dict}:
        return None
    keys = set(chain.from_iterable(raw))
    if not keys <= allowed or "imputed" in keys:
        return None
    try:
        # map over C-level getters: a third of the time of list comprehensions at 500k links
        src = np.fromiter(map(index.__getitem__, map(itemgetter("src"), raw)), np.int64, len(raw))
        dst = np.fromiter(map(index.__getitem__, map(itemgetter("dst"), raw)), np.int64, len(raw))
        rtt = _numbers(list(map(itemgetter("rtt_ms"), raw)), NUMBER, 0.0)
    except (KeyError, TypeError):
        return None
    everywhere = set(map(len, raw)) <= {len(keys)}
    bw = _numbers(_column(raw, "bandwidth_gbps", keys, everywhere), NUMBER_OR_NULL, np.nan)
    loss = _numbers(_column(raw, "loss", keys, everywhere), NUMBER_OR_NULL, 0.0)
    samples = _numbers(_column(raw, "samples", keys, everywhere), NUMBER_OR_NULL, 0.0)
    if rtt is None or bw is None or loss is None or samples is None:
        return None
    return _plain(src, dst, rtt, bw, loss, samples, len(index), self_loops)


def _plain(src: np.ndarray, dst: np.ndarray, rtt: np.ndarray, bw: np.ndarray, loss: np.ndarray,
           samples: np.ndarray, n_ends: int, self_loops: bool) -> tuple[np.ndarray, ...] | None:
    """The columns when every value is in range and no pair is a self-loop (unless allowed) or
    a duplicate; None otherwise (the careful reader names the flaw)."""
    if not all(_within(column, FLEET_BOUNDS[key]) for column, key in (
            (rtt, "rtt_ms"), (bw[~np.isnan(bw)], "bandwidth_gbps"), (loss, "loss"),
            (samples, "samples"))) or (samples != np.floor(samples)).any():
        return None
    if not self_loops and (src == dst).any():
        return None
    key = np.sort(src * max(1, n_ends) + dst)
    if (key[1:] == key[:-1]).any():
        return None   # a duplicate: the careful reader averages it and says so
    return src, dst, rtt, bw, loss, samples.astype(np.int64)


def _within(column: np.ndarray, bound) -> bool:
    return not ((column < bound.low).any() or (column > bound.high).any())


def _optional(values: list, default: float) -> np.ndarray | None:
    """Typed optional numbers as floats, null -> ``default``; None when one is not finite or
    too large to be a count. numpy reads None as NaN, which JSON numbers cannot be."""
    try:
        arr = np.array(values, dtype=float)
    except OverflowError:   # an integer beyond any float
        return None
    missing = np.isnan(arr)
    if np.isinf(arr).any() or (np.abs(arr[~missing]) > MAX_JSON_INT).any():
        return None
    if default == default:
        arr[missing] = default
    return arr


def record_columns(records: list[LinkRecord], index: dict[str, int]) -> tuple[np.ndarray, ...]:
    """:func:`fast_columns` for typed node link records (msgspec has checked every type);
    raises :class:`CarefulReadNeeded` where fast_columns would give None."""
    n = len(records)
    try:
        src = np.fromiter(map(index.__getitem__, map(_SRC, records)), np.int64, n)
        dst = np.fromiter(map(index.__getitem__, map(_DST, records)), np.int64, n)
    except KeyError:
        raise CarefulReadNeeded from None
    rtt = np.fromiter(map(_RTT, records), float, n)
    bw = _optional(list(map(_BW, records)), np.nan)
    loss = _optional(list(map(_LOSS, records)), 0.0)
    samples = _optional(list(map(_SAMPLES, records)), 0.0)
    columns = None
    if bw is not None and loss is not None and samples is not None \
            and np.isfinite(rtt).all() and not (np.abs(rtt) > MAX_JSON_INT).any():
        columns = _plain(src, dst, rtt, bw, loss, samples, len(index), self_loops=False)
    if columns is None:
        raise CarefulReadNeeded
    return columns


_SRC, _DST, _RTT, _BW, _LOSS, _SAMPLES = map(
    attrgetter, ("src", "dst", "rtt_ms", "bandwidth_gbps", "loss", "samples"))


def read_links(raw: list, ids: list[str], seen: dict[str, int], path: str, lines: LineFinder,
               issues: list[ImportIssue], note_unknown: NoteUnknown) -> LinkTable | tuple[Link, ...]:
    """The node links of a fleet JSON (measured, merged, in file order); ``raw`` may be typed
    :class:`LinkRecord` structs (raises :class:`CarefulReadNeeded` unless plainly well formed)."""
    if raw and type(raw[0]) is LinkRecord:
        return LinkTable(ids, *record_columns(raw, seen))
    columns = fast_columns(raw, LINK_KEYS, seen, self_loops=False)
    if columns is not None:
        return LinkTable(ids, *columns)
    merged = _careful_links(raw, "links", LINK_KEYS, seen, "node", "nodes", path, lines, issues,
                            note_unknown, self_loops=False)
    return tuple(Link(src, dst, rtt_ms=m["rtt"], bandwidth_gbps=m["bw"], loss=m["loss"],
                      samples=m["samples"]) for (src, dst), m in merged.items())


def read_sites(raw: Any, path: str, lines: LineFinder,
               note_unknown: NoteUnknown) -> tuple[Site, ...]:
    """The optional ``sites`` array: ``{"id", "lat", "lon"}`` each, ids unique."""
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise InputError(f"expected an array of site objects, got {json_type(raw)}", path=path,
                         line=lines.line(), field="sites")
    sites: list[Site] = []
    first: dict[str, int] = {}
    for i, obj in enumerate(raw):
        where = f"sites[{i}]"
        if not isinstance(obj, dict):
            raise InputError(f"expected an object, got {json_type(obj)}", path=path,
                             line=lines.line(), field=where)
        note_unknown(obj, SITE_KEYS, "sites[]", "sites", i)
        f = Fields(obj, path, where, lambda i=i: lines.line("sites", i))
        site_id = f.text("id", FLEET_TEXT_CHARS, required=True).strip()
        if site_id in first:
            raise InputError(f"site id {site_id!r} is used twice (first on line "
                             f"{lines.line('sites', first[site_id])})", path=path,
                             line=f.line(), field=f"{where}.id")
        first[site_id] = i
        lat = f.number("lat", low=-90, high=90)
        lon = f.number("lon", low=-180, high=180)
        if (lat is None) != (lon is None):
            raise f.fail("lon" if lon is None else "lat", "both lat and lon, or neither")
        sites.append(Site(site_id, lat, lon))
    return tuple(sites)


def read_site_links(raw: Any, known: dict[str, str], path: str, lines: LineFinder,
                    issues: list[ImportIssue], note_unknown: NoteUnknown) -> tuple[SiteLink, ...]:
    """The optional ``site_links`` array; ``known`` maps every name a site may be called by
    (declared ids, nodes' sites and cities) to the site's key. A link from a site to itself is
    the RTT between two servers of that site."""
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise InputError(f"expected an array of site link objects, got {json_type(raw)}",
                         path=path, line=lines.line(), field="site_links")
    keys = sorted(set(known.values()))
    code = {name: keys.index(key) for name, key in known.items()}
    completed = any(isinstance(obj, dict) and not COMPLETION_KEYS.isdisjoint(obj) for obj in raw)
    columns = None if completed else fast_columns(raw, SITE_LINK_KEYS, code, self_loops=True)
    if columns is not None:
        src, dst, rtt, bw, loss, samples = columns
        return tuple(SiteLink(keys[a], keys[b], rtt_ms=float(r),
                              bandwidth_gbps=None if w != w else float(w), loss=float(q),
                              samples=int(c))
                     for a, b, r, w, q, c in zip(src.tolist(), dst.tolist(), rtt.tolist(),
                                                 bw.tolist(), loss.tolist(), samples.tolist()))
    merged = _careful_links(raw, "site_links", SITE_LINK_KEYS, known, "site", "sites or any "
                            "node's site or city", path, lines, issues, note_unknown,
                            self_loops=True)
    return tuple(SiteLink(known[src], known[dst], rtt_ms=m["rtt"], bandwidth_gbps=m["bw"],
                          loss=m["loss"], samples=m["samples"], source=m["source"],
                          rtt_hi_ms=m["rtt_hi"], bandwidth_lo_gbps=m["bw_lo"],
                          rtt_source=m.get("rtt_source"))
                 for (src, dst), m in merged.items())


def _careful_links(raw: list, section: str, allowed: set[str], known, what: str, known_in: str,
                   path: str, lines: LineFinder, issues: list[ImportIssue],
                   note_unknown: NoteUnknown, *, self_loops: bool) -> dict[tuple[str, str], dict]:
    """Link by link: the first problem raises InputError with file, line and field, a node link
    from a node to itself and two node links with different figures for one pair among them; an
    identical copy of a node link and imputed links are dropped, copies of a site link
    averaged, each reported once."""
    merged: dict[tuple[str, str], dict[str, Any]] = {}
    for i, obj in enumerate(raw):
        where = f"{section}[{i}]"
        if not isinstance(obj, dict):
            raise InputError(f"expected an object, got {json_type(obj)}", path=path,
                             line=lines.line(), field=where)
        note_unknown(obj, allowed, f"{section}[]", section, i)
        f = Fields(obj, path, where, lambda i=i: lines.line(section, i))
        src = f.string("src", required=True)
        dst = f.string("dst", required=True)
        for key, end in (("src", src), ("dst", dst)):
            if end not in known:
                raise InputError(f"unknown {what} {end!r} (not in {known_in})", path=path,
                                 line=f.line(), field=f"{where}.{key}")
        rtt = f.number("rtt_ms", required=True, bound=FLEET_BOUNDS["rtt_ms"])
        bw = f.number("bandwidth_gbps", bound=FLEET_BOUNDS["bandwidth_gbps"])
        loss = f.number("loss", default=0.0, bound=FLEET_BOUNDS["loss"])
        samples = int(f.number("samples", default=0, bound=FLEET_BOUNDS["samples"]))
        completion = _completion_fields(f, rtt, bw) if "source" in allowed else {}
        if "imputed" in allowed:
            imputed = obj.get("imputed", False)
            if not isinstance(imputed, bool):
                raise f.fail("imputed", "true or false")
            if imputed:
                issues.append(ImportIssue(path, f.line(), f"imputed link {src} -> {dst} ignored "
                                          "(completion is recomputed from measured links)"))
                continue
        if src == dst and not self_loops:
            raise InputError(f"a link from node {src!r} to itself (expected links between two "
                             "different nodes)", path=path, line=f.line(), field=f"{where}.dst")
        key = (src, dst)
        if key in merged:
            first = merged[key]
            kind = "link" if what == "node" else "site link"
            first_line = lines.line(section, first["index"])
            if what == "node" and (rtt != first["rtts"][0] or bw != first["bw0"]):
                # Two figures for one pair of servers: which one the file means cannot be told.
                raise InputError(f"conflicting duplicate of the {kind} {src} -> {dst} on line "
                                 f"{first_line} (expected one link per pair, or identical "
                                 "copies)", path=path, line=f.line(), field=where)
            if what == "node":
                issues.append(ImportIssue(path, f.line(), f"duplicate of the {kind} {src} -> "
                                          f"{dst} on line {first_line}; counted once"))
                continue
            # Site links are summaries: copies from several sources are averaged.
            conflicting = "conflicting " if rtt != first["rtts"][0] else ""
            issues.append(ImportIssue(path, f.line(), f"{conflicting}duplicate of the {kind} "
                                      f"{src} -> {dst} on line {first_line}; RTTs averaged"))
            first["rtts"].append(rtt)
            first["samples"] += samples
            if bw is not None:
                first["bws"].append(bw)
            # The conservative figures stay conservative for the averaged point figures.
            for name, pick in (("rtt_hi", max), ("bw_lo", min)):
                if completion.get(name) is not None:
                    held = first[name]
                    first[name] = completion[name] if held is None else pick(held, completion[name])
            continue
        merged[key] = {"index": i, "rtts": [rtt], "bws": [] if bw is None else [bw], "bw0": bw,
                       "loss": loss, "samples": samples, "source": MEASURED, "rtt_hi": None,
                       "bw_lo": None, **completion}
    for m in merged.values():
        m["rtt"] = sum(m["rtts"]) / len(m["rtts"])
        m["bw"] = (sum(m["bws"]) / len(m["bws"])) if m["bws"] else None
    return merged


def _completion_fields(f: Fields, rtt: float, bw: float | None) -> dict[str, Any]:
    """A site link's ``source``, ``rtt_hi_ms`` (at least its ``rtt_ms``),
    ``bandwidth_lo_gbps`` (at most its ``bandwidth_gbps``, which it needs) and ``rtt_source``
    (None: as ``source``)."""
    source = f.obj.get("source", MEASURED)
    if source is None:
        source = MEASURED
    if source not in SITE_LINK_SOURCES:
        raise f.fail("source", "one of " + ", ".join(SITE_LINK_SOURCES))
    rtt_source = f.obj.get("rtt_source")
    if rtt_source is not None and rtt_source not in SITE_LINK_SOURCES:
        raise f.fail("rtt_source", "one of " + ", ".join(SITE_LINK_SOURCES))
    rtt_hi = f.number("rtt_hi_ms", bound=FLEET_BOUNDS["rtt_ms"])
    if rtt_hi is not None and rtt_hi < rtt:
        raise f.fail("rtt_hi_ms", f"milliseconds of RTT at least rtt_ms ({rtt:g})")
    bw_lo = f.number("bandwidth_lo_gbps", bound=FLEET_BOUNDS["bandwidth_gbps"])
    if bw_lo is not None and (bw is None or bw_lo > bw):
        raise f.fail("bandwidth_lo_gbps", "Gbit/s at most bandwidth_gbps (" +
                     ("none given" if bw is None else f"{bw:g}") + ")")
    return {"source": source, "rtt_hi": rtt_hi, "bw_lo": bw_lo, "rtt_source": rtt_source}
