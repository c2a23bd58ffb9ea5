"""Reading and writing fleet files.

Two formats, told apart by content (not by the file name):

* the paper's: a folder or a .zip holding ``node_feature.csv`` (``node,City,Capability,Memory``;
  Memory is the server's total GPU memory in GB; GPU count unknown, so 8) and ``edge.txt``
  (``src dst weight`` in ms, space separated, one undirected pair per line);
* the fleet JSON of docs/DESIGN.md, which ``save_fleet_json`` writes.

Real files are flawed (the paper's own has self-loops, duplicates, trailing spaces). A flaw does not
stop the import: it is reported once as an :class:`ImportIssue` with its file and line, and the
fleet is repaired (self-loops dropped, duplicates averaged, names trimmed). Fleet JSON, written by
people or by Hulk, is held to more: a key written twice in one object, a node link to itself and
two node links with different figures for one pair raise ``InputError``, as does a file that
cannot be read as a fleet at all (bad number, missing column, unknown node), naming the file, the
line and the field.
"""

from __future__ import annotations

import io
import json
import os
import zipfile
from pathlib import Path
from typing import Any

import msgspec

from hulk.atomic import write_output
from hulk.errors import InputError
from hulk.userfile import read_user_file
from hulk.validate import NAME_EXPECTED, is_name
from planner.core import gpus as gpu_catalog
from planner.core.fleet import (FLEET_BOUNDS, FLEET_TEXT_CHARS, MAX_FLEET_NODES, Fleet,
                                LinkTable, Node, SiteLink)
from planner.core.gcpause import gc_paused
from planner.files.fleet_links import (CarefulReadNeeded, LinkRecord, read_links,
                                       read_site_links, read_sites)
from planner.files.jsonfields import DUPLICATE_CHECK_BYTES, Fields, LineFinder, duplicate_key, json_type
from planner.files.paper import (FLEET_FILE, MAX_FLEET_FILE_BYTES, PAPER_EDGES, PAPER_NODES,
                                 ImportIssue, read_paper, read_paper_zip, utf8_text)

NODE_KEYS = {"id", "city", "site", "gpus", "gpu_name", "compute_capability", "memory_gb",
             "latitude", "longitude"}
TOP_KEYS = {"nodes", "links", "sites", "site_links", "name", "format"}


# ----------------------------------------------------------------------------------- public API

def load_fleet(path: str | os.PathLike) -> Fleet:
    """The fleet in ``path`` (paper folder/zip or fleet JSON); flaws are repaired silently."""
    return load_fleet_with_report(path)[0]


def load_fleet_with_report(path: str | os.PathLike) -> tuple[Fleet, list[ImportIssue]]:
    """The fleet in ``path`` and the flaws found in it, each reported once with file and line."""
    p = Path(path)
    if not p.exists():
        raise InputError("no such file or folder (expected a fleet JSON, or a folder or .zip "
                         f"with {PAPER_NODES} and {PAPER_EDGES})", path=str(p))
    if p.is_file() and p.name in (PAPER_NODES, PAPER_EDGES):
        p = p.parent  # one file of the paper's pair: read the folder holding both
    if p.is_dir():
        nodes_path, edges_path = p / PAPER_NODES, p / PAPER_EDGES
        for needed in (nodes_path, edges_path):
            if not needed.is_file():
                raise InputError(f"folder has no {needed.name} (the paper's fleet format needs "
                                 f"{PAPER_NODES} and {PAPER_EDGES})", path=str(p))
        return read_paper(read_user_file(nodes_path, FLEET_FILE, MAX_FLEET_FILE_BYTES),
                          str(nodes_path),
                          read_user_file(edges_path, FLEET_FILE, MAX_FLEET_FILE_BYTES),
                          str(edges_path), name=p.name)
    data = read_user_file(p, FLEET_FILE, MAX_FLEET_FILE_BYTES)
    if data[:4] == b"PK\x03\x04" or zipfile.is_zipfile(io.BytesIO(data)):
        return read_paper_zip(data, str(p))
    # A full mesh is half a million small dicts, none of them in a cycle (a tenth of the read).
    with gc_paused():
        return _read_json(data, str(p), default_name=p.stem)


def fleet_to_json(fleet: Fleet) -> dict[str, Any]:
    """The fleet JSON of docs/DESIGN.md (measured links only; imputed ones recomputed on load).

    ``sites`` and ``site_links`` are written only when the fleet has them: a fleet without
    sites gives the file that readers without site support read."""
    nodes = []
    for n in fleet.nodes:
        item: dict[str, Any] = {"id": n.id, "city": n.city, "gpus": n.gpus, "gpu_name": n.gpu_name,
                                "compute_capability": n.compute_capability,
                                "memory_gb": n.memory_gb}
        if n.site is not None:
            item["site"] = n.site
        if n.latitude is not None and n.longitude is not None:
            item["latitude"], item["longitude"] = n.latitude, n.longitude
        nodes.append(item)
    out: dict[str, Any] = {"name": fleet.name, "nodes": nodes, "links": _links_json(fleet.links)}
    if fleet.sites:
        out["sites"] = [{"id": s.id, "lat": s.latitude, "lon": s.longitude} for s in fleet.sites]
    if fleet.site_links:
        out["site_links"] = [_site_link_json(k) for k in fleet.site_links]
    return out


def _site_link_json(link: SiteLink) -> dict[str, Any]:
    """A site link with its source always named (a measured one as much as a predicted one)."""
    item: dict[str, Any] = {"src": link.src, "dst": link.dst, "rtt_ms": link.rtt_ms,
                            "bandwidth_gbps": link.bandwidth_gbps, "loss": link.loss,
                            "samples": link.samples, "source": link.source}
    if link.rtt_hi_ms is not None:
        item["rtt_hi_ms"] = link.rtt_hi_ms
    if link.bandwidth_lo_gbps is not None:
        item["bandwidth_lo_gbps"] = link.bandwidth_lo_gbps
    if link.rtt_source is not None:
        item["rtt_source"] = link.rtt_source
    return item


def _links_json(links) -> list[dict[str, Any]]:
    if isinstance(links, LinkTable):   # columns: no Link object per pair
        ids = links.ids
        bws = [None if w != w else w for w in links.bandwidth_gbps.tolist()]
        return [{"src": ids[a], "dst": ids[b], "rtt_ms": r, "bandwidth_gbps": w, "loss": q,
                 "samples": c}
                for a, b, r, w, q, c in zip(links.src.tolist(), links.dst.tolist(),
                                            links.rtt_ms.tolist(), bws, links.loss.tolist(),
                                            links.samples.tolist()) if a != b]
    return [{"src": k.src, "dst": k.dst, "rtt_ms": k.rtt_ms, "bandwidth_gbps": k.bandwidth_gbps,
             "loss": k.loss, "samples": k.samples}
            for k in links if not k.imputed and k.src != k.dst]


def save_fleet_json(fleet: Fleet, path: str | os.PathLike) -> None:
    """Write the fleet JSON atomically (a reader never sees half a file)."""
    # msgspec writes the same text as json.dumps(indent=1) (UTF-8 instead of \u escapes) in a
    # tenth of the time: a completed 200-site fleet is 4.7 MB.
    text = msgspec.json.format(msgspec.json.encode(fleet_to_json(fleet)), indent=1)
    write_output(path, text.decode() + "\n", "fleet JSON")


# ------------------------------------------------------------------------------------- JSON

class _TypedDoc(msgspec.Struct, forbid_unknown_fields=True):
    """A fleet JSON whose node links msgspec decodes into LinkRecord structs; everything else
    stays as JSON values for the checks below. UNSET: the key is absent."""

    nodes: Any = msgspec.UNSET
    links: list[LinkRecord] | msgspec.UnsetType = msgspec.UNSET
    name: Any = msgspec.UNSET
    sites: Any = msgspec.UNSET
    site_links: Any = msgspec.UNSET
    format: Any = msgspec.UNSET


_TYPED_DECODER = msgspec.json.Decoder(_TypedDoc)


def _typed_loads(data: bytes) -> dict[str, Any] | None:
    """The document with its node links as LinkRecord structs, or None when msgspec refuses it
    (a flaw, an unknown field, an imputed link: the dict path reads and reports it)."""
    try:
        doc = _TYPED_DECODER.decode(data)
    except (msgspec.MsgspecError, RecursionError, ValueError):
        return None
    return {key: getattr(doc, key) for key in doc.__struct_fields__
            if getattr(doc, key) is not msgspec.UNSET}


def _read_json(data: bytes, path: str, default_name: str) -> tuple[Fleet, list[ImportIssue]]:
    if len(data) <= DUPLICATE_CHECK_BYTES:
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            text = None    # the readers below word it
        found = duplicate_key(text) if text is not None else None
        if found is not None:
            key, line = found
            shown = key if key.isprintable() else ascii(key)
            raise InputError(f"the key {json.dumps(shown)[:80]} is written twice in one object "
                             "(expected each key once)", path=path, line=line)
    doc = _typed_loads(data)
    if doc is not None:
        try:
            return _read_doc(doc, data, None, path, default_name)
        except CarefulReadNeeded:
            pass   # links to check one by one: read again as dicts, to word the flaw
    # orjson reads the bytes (and refuses what is not UTF-8); the decoded text, a second copy
    # of a file that can be 70 MB, is made only to word an error or to find line numbers.
    text: str | None = None
    try:
        doc = _fast_loads(data)
        if doc is None:   # orjson refused it: json finds (and words) the problem as it always did
            text = utf8_text(data, path)
            doc = json.loads(text)  # line numbers come from LineFinder when needed
    except json.JSONDecodeError as exc:
        raise InputError(f"not a fleet file: invalid JSON ({exc.msg} at column {exc.colno}); "
                         "expected fleet JSON, or a folder or .zip with "
                         f"{PAPER_NODES} and {PAPER_EDGES}", path=path, line=exc.lineno) from None
    except RecursionError:
        raise InputError("JSON nested too deeply", path=path) from None
    except ValueError as exc:  # e.g. an integer of thousands of digits
        raise InputError(f"not a fleet file: {exc}".split(";")[0], path=path) from None
    if not isinstance(doc, dict):
        raise InputError(f"expected a JSON object with 'nodes' and 'links', got {json_type(doc)}",
                         path=path, line=1)
    return _read_doc(doc, data, text, path, default_name)


def _read_doc(doc: dict[str, Any], data: bytes, text: str | None, path: str,
              default_name: str) -> tuple[Fleet, list[ImportIssue]]:
    lines = LineFinder(text if text is not None else lambda: utf8_text(data, path))
    issues: list[ImportIssue] = []
    unknown: set[str] = set()

    def note_unknown(obj: dict[str, Any], allowed: set[str], where: str, *keys: str | int) -> None:
        for key in obj:
            if key not in allowed and f"{where}.{key}" not in unknown:
                unknown.add(f"{where}.{key}")
                issues.append(ImportIssue(path, lines.line(*keys),
                                          f"unknown field {where}.{key} ignored"))

    note_unknown(doc, TOP_KEYS, "fleet")
    name = doc.get("name", default_name)
    if not isinstance(name, str) or not name or ("name" in doc and (
            len(name) > FLEET_TEXT_CHARS or not name.isprintable())):
        raise InputError(f"expected a non-empty string of at most {FLEET_TEXT_CHARS} printable "
                         f"characters, got {json.dumps(name)[:80]}", path=path,
                         line=lines.line(), field="name")
    raw_nodes = doc.get("nodes")
    if not isinstance(raw_nodes, list):
        raise InputError(f"expected an array of node objects, got {json_type(raw_nodes)}",
                         path=path, line=lines.line(), field="nodes")
    if len(raw_nodes) > MAX_FLEET_NODES:
        raise InputError(f"expected at most {MAX_FLEET_NODES:,} nodes, got {len(raw_nodes):,}",
                         path=path, line=lines.line(), field="nodes")
    raw_links = doc.get("links", [])
    if not isinstance(raw_links, list):
        raise InputError(f"expected an array of link objects, got {json_type(raw_links)}",
                         path=path, line=lines.line(), field="links")
    sites = read_sites(doc.get("sites"), path, lines, note_unknown)

    nodes, seen = _read_nodes(raw_nodes, {site.id for site in sites}, path, lines, issues,
                              note_unknown)
    links = read_links(raw_links, [n.id for n in nodes], seen, path, lines, issues, note_unknown)
    site_links = read_site_links(doc.get("site_links"), _site_names(sites, nodes), path, lines,
                                 issues, note_unknown)
    return Fleet(tuple(nodes), links, name=name, sites=sites, site_links=site_links), issues


def _read_nodes(raw_nodes: list, declared: set[str], path: str, lines: LineFinder,
                issues: list[ImportIssue], note_unknown) -> tuple[list[Node], dict[str, int]]:
    """The nodes, and each id's index; ids unique, sites among the declared ones (if any)."""
    nodes: list[Node] = []
    seen: dict[str, int] = {}
    for i, obj in enumerate(raw_nodes):
        where = f"nodes[{i}]"
        if not isinstance(obj, dict):
            raise InputError(f"expected an object, got {json_type(obj)}", path=path,
                             line=lines.line(), field=where)
        if not obj.keys() <= NODE_KEYS:
            note_unknown(obj, NODE_KEYS, "nodes[]", "nodes", i)
        f = Fields(obj, path, where, lambda i=i: lines.line("nodes", i))
        node_id = f.string("id", required=True)
        if not is_name(node_id):
            raise f.fail("id", f"a node id of {NAME_EXPECTED}")
        if node_id in seen:
            raise InputError(f"node id {node_id!r} is used twice (first on line "
                             f"{lines.line('nodes', seen[node_id])})",
                             path=path, line=f.line(), field=f"{where}.id")
        seen[node_id] = i
        nodes.append(_read_node(f, node_id, declared, issues))
    if not nodes:
        raise InputError("expected at least one node", path=path, line=lines.line(),
                         field="nodes")
    return nodes, seen


def _read_node(f: Fields, node_id: str, declared: set[str], issues: list[ImportIssue]) -> Node:
    raw_city = f.text("city", FLEET_TEXT_CHARS)
    city = raw_city.strip() if raw_city else None
    if raw_city is not None and raw_city != city:
        issues.append(ImportIssue(f.path, f.line(), f"city {raw_city!r} has surrounding "
                                  f"spaces; read as {city!r}"))
    site = f.text("site", FLEET_TEXT_CHARS)
    site = site.strip() if site and site.strip() else None
    if site is not None and declared and site not in declared:
        raise InputError(f"unknown site {site!r} (not in sites)", path=f.path, line=f.line(),
                         field=f"{f.where}.site")
    count = int(f.number("gpus", default=gpu_catalog.DEFAULT_GPUS_PER_NODE,
                         bound=FLEET_BOUNDS["gpus"]))
    gpu_name = f.text("gpu_name", FLEET_TEXT_CHARS)
    cc = f.number("compute_capability", bound=FLEET_BOUNDS["compute_capability"])
    memory = f.number("memory_gb", bound=FLEET_BOUNDS["memory_gb"])
    if memory is None:
        row = gpu_catalog.lookup_name(gpu_name)
        if row is None:
            raise f.fail("memory_gb", f"{FLEET_BOUNDS['memory_gb'].expected} (total GPU "
                         "memory of the server; may be left out only when gpu_name is a "
                         "known GPU)")
        memory = count * row[3]
    lat = f.number("latitude", low=-90, high=90)
    lon = f.number("longitude", low=-180, high=180)
    if (lat is None) != (lon is None):
        raise f.fail("longitude" if lon is None else "latitude",
                     "both latitude and longitude, or neither")
    return Node(id=node_id, city=city or None, gpus=count, gpu_name=gpu_name,
                compute_capability=cc, memory_gb=memory, latitude=lat, longitude=lon, site=site)


def _fast_loads(data: bytes) -> Any:
    """The document parsed by orjson (several times faster than json on large files), or None
    when orjson is missing or refuses the text (NaN literals, huge integers, deep nesting...)."""
    try:
        import orjson
    except ImportError:  # pragma: no cover - a planner install has it
        return None
    try:
        return orjson.loads(data)
    except (orjson.JSONDecodeError, RecursionError, ValueError):
        return None


def _site_names(sites, nodes: list[Node]) -> dict[str, str]:
    """Every name a site link may call a site by -> the site's key (what ``Node.site_key`` and
    completion use): declared ids, the sites nodes name, and their cities as written."""
    names = {site.id: site.id for site in sites}
    for node in nodes:
        key = node.site_key
        if key is None:
            continue
        names.setdefault(key, key)
        if node.site is None and node.city:
            names.setdefault(node.city.strip(), key)
    return names
