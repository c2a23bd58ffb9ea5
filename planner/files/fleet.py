"""Reading and writing fleet files.

Two formats, told apart by content (not by the file name):

* the paper's: a folder or a .zip holding ``node_feature.csv`` (``node,City,Capability,Memory``;
  Memory is the server's total GPU memory in GB; GPU count unknown, so 8) and ``edge.txt``
  (``src dst weight`` in ms, space separated, one undirected pair per line);
* the fleet JSON of docs/DESIGN.md, which ``save_fleet_json`` writes.

Real files are flawed (the paper's own has self-loops, duplicates, trailing spaces). A flaw does not
stop the import: it is reported once as an :class:`ImportIssue` with its file and line, and the
fleet is repaired (self-loops dropped, duplicates averaged, names trimmed). A file that cannot be
read as a fleet at all (bad number, missing column, unknown node) raises ``InputError`` naming the
file, the line and the field.
"""

from __future__ import annotations

import bisect
import io
import json
import json.decoder
import json.scanner
import math
import os
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hulk.errors import InputError
from planner.core import gpus as gpu_catalog
from planner.core.fleet import Fleet, Link, Node
from planner.files.paper import (PAPER_EDGES, PAPER_NODES, ImportIssue, read_paper,
                                 read_paper_zip, utf8_text)

NODE_KEYS = {"id", "city", "gpus", "gpu_name", "compute_capability", "memory_gb",
             "latitude", "longitude"}
LINK_KEYS = {"src", "dst", "rtt_ms", "bandwidth_gbps", "loss", "samples", "imputed"}
TOP_KEYS = {"nodes", "links", "name", "format"}
MAX_JSON_INT = 2 ** 53          # beyond this a JSON integer is no count, memory or RTT we can use


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
        return read_paper(nodes_path.read_bytes(), str(nodes_path),
                           edges_path.read_bytes(), str(edges_path), name=p.name)
    try:
        data = p.read_bytes()
    except OSError as exc:
        raise InputError(f"cannot read: {exc.strerror}", path=str(p)) from exc
    if data[:4] == b"PK\x03\x04" or zipfile.is_zipfile(io.BytesIO(data)):
        return read_paper_zip(data, str(p))
    return _read_json(data, str(p), default_name=p.stem)


def fleet_to_json(fleet: Fleet) -> dict[str, Any]:
    """The fleet JSON of docs/DESIGN.md (measured links only; imputed ones recomputed on load)."""
    nodes = []
    for n in fleet.nodes:
        item: dict[str, Any] = {"id": n.id, "city": n.city, "gpus": n.gpus, "gpu_name": n.gpu_name,
                                "compute_capability": n.compute_capability,
                                "memory_gb": n.memory_gb}
        if n.latitude is not None and n.longitude is not None:
            item["latitude"], item["longitude"] = n.latitude, n.longitude
        nodes.append(item)
    links = [{"src": k.src, "dst": k.dst, "rtt_ms": k.rtt_ms, "bandwidth_gbps": k.bandwidth_gbps,
              "loss": k.loss, "samples": k.samples}
             for k in fleet.links if not k.imputed and k.src != k.dst]
    return {"name": fleet.name, "nodes": nodes, "links": links}


def save_fleet_json(fleet: Fleet, path: str | os.PathLike) -> None:
    """Write the fleet JSON atomically (a reader never sees half a file)."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(p.name + ".tmp")
    tmp.write_text(json.dumps(fleet_to_json(fleet), indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, p)


# ------------------------------------------------------------------------------------- JSON

class _Located(dict):
    """A JSON object that remembers the line it starts on."""

    line: int = 0


def _locating_loads(text: str) -> Any:
    newlines = [i for i, ch in enumerate(text) if ch == "\n"]
    decoder = json.JSONDecoder()

    def parse_object(s_and_end, *args, **kwargs):
        _, start = s_and_end
        obj, end = json.decoder.JSONObject(s_and_end, *args, **kwargs)
        located = _Located(obj)
        located.line = bisect.bisect_left(newlines, start) + 1
        return located, end

    decoder.parse_object = parse_object
    decoder.scan_once = json.scanner.py_make_scanner(decoder)
    return decoder.decode(text)


class _LineFinder:
    """Line numbers of a JSON document's objects, found only when a message needs one.

    The document is read with the C parser; only a file with an error or a flaw to report pays
    for the second, pure-Python parse that records where each object starts.
    """

    def __init__(self, text: str):
        self.text = text
        self._located: Any = None

    def line(self, *keys: str | int) -> int | None:
        if self._located is None:
            try:
                self._located = _locating_loads(self.text)
            except (RecursionError, ValueError):
                return None
        node = self._located
        for key in keys:
            try:
                node = node[key]
            except (KeyError, IndexError, TypeError):
                return None
        return getattr(node, "line", None)


def _is_unicode(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # "\ud800" is valid JSON but no text a terminal or file can hold
        return False
    return True


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    return {bool: "boolean", int: "number", float: "number", str: "string", list: "array",
            dict: "object", _Located: "object"}.get(type(value), type(value).__name__)


class _Fields:
    """Typed access to one JSON object's fields, with errors naming file, line and field."""

    def __init__(self, obj: dict[str, Any], path: str, where: str, line: Callable[[], int | None]):
        self.obj, self.path, self.where, self.line = obj, path, where, line

    def fail(self, key: str, expected: str) -> InputError:
        got = self.obj.get(key, None)
        shown = json.dumps(got)[:80] if key in self.obj else "nothing"
        return InputError(f"expected {expected}, got {shown}", path=self.path,
                          line=self.line(), field=f"{self.where}.{key}")

    def string(self, key: str, *, required: bool = False) -> str | None:
        value = self.obj.get(key)
        if value is None and not required:
            return None
        if not isinstance(value, str) or (required and not value.strip()):
            raise self.fail(key, "a non-empty string" if required else "a string or null")
        if not _is_unicode(value):
            raise self.fail(key, "valid Unicode text (no lone surrogate escapes)")
        return value

    def number(self, key: str, *, required: bool = False, default: float | None = None,
               low: float | None = None, high: float | None = None,
               integer: bool = False) -> float | None:
        value = self.obj.get(key)
        kind = "an integer" if integer else "a number"
        bounds = ""
        if low is not None:
            bounds += f" >= {low:g}"
        if high is not None:
            bounds += f"{' and' if low is not None else ''} <= {high:g}"
        if value is None:
            if required:
                raise self.fail(key, kind + bounds)
            return default
        if isinstance(value, bool) or not isinstance(value, (int, float)) \
                or (isinstance(value, int) and not -MAX_JSON_INT <= value <= MAX_JSON_INT) \
                or not math.isfinite(value) or (integer and not float(value).is_integer()):
            raise self.fail(key, kind + bounds + ("" if required else " or null"))
        if (low is not None and value < low) or (high is not None and value > high):
            raise self.fail(key, kind + bounds)
        return int(value) if integer else float(value)


def _read_json(data: bytes, path: str, default_name: str) -> tuple[Fleet, list[ImportIssue]]:
    text = utf8_text(data, path)
    try:
        doc = json.loads(text)  # the C parser; line numbers come from _LineFinder when needed
    except json.JSONDecodeError as exc:
        raise InputError(f"not a fleet file: invalid JSON ({exc.msg} at column {exc.colno}); "
                         "expected fleet JSON, or a folder or .zip with "
                         f"{PAPER_NODES} and {PAPER_EDGES}", path=path, line=exc.lineno) from None
    except RecursionError:
        raise InputError("JSON nested too deeply", path=path) from None
    except ValueError as exc:  # e.g. an integer of thousands of digits
        raise InputError(f"not a fleet file: {exc}".split(";")[0], path=path) from None
    if not isinstance(doc, dict):
        raise InputError(f"expected a JSON object with 'nodes' and 'links', got {_json_type(doc)}",
                         path=path, line=1)
    lines = _LineFinder(text)
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
    if not isinstance(name, str) or not name:
        raise InputError(f"expected a non-empty string, got {json.dumps(name)[:80]}", path=path,
                         line=lines.line(), field="name")
    raw_nodes = doc.get("nodes")
    if not isinstance(raw_nodes, list):
        raise InputError(f"expected an array of node objects, got {_json_type(raw_nodes)}",
                         path=path, line=lines.line(), field="nodes")
    raw_links = doc.get("links", [])
    if not isinstance(raw_links, list):
        raise InputError(f"expected an array of link objects, got {_json_type(raw_links)}",
                         path=path, line=lines.line(), field="links")

    nodes: list[Node] = []
    seen: dict[str, int] = {}
    for i, obj in enumerate(raw_nodes):
        where = f"nodes[{i}]"
        if not isinstance(obj, dict):
            raise InputError(f"expected an object, got {_json_type(obj)}", path=path,
                             line=lines.line(), field=where)
        note_unknown(obj, NODE_KEYS, "nodes[]", "nodes", i)
        f = _Fields(obj, path, where, lambda i=i: lines.line("nodes", i))
        node_id = f.string("id", required=True)
        if node_id in seen:
            raise InputError(f"node id {node_id!r} is used twice (first on line "
                             f"{lines.line('nodes', seen[node_id])})",
                             path=path, line=f.line(), field=f"{where}.id")
        seen[node_id] = i
        raw_city = f.string("city")
        city = raw_city.strip() if raw_city else None
        if raw_city is not None and raw_city != city:
            issues.append(ImportIssue(path, f.line(), f"city {raw_city!r} has surrounding "
                                      f"spaces; read as {city!r}"))
        count = int(f.number("gpus", default=gpu_catalog.DEFAULT_GPUS_PER_NODE, low=0,
                             integer=True))
        gpu_name = f.string("gpu_name")
        cc = f.number("compute_capability", low=0)
        memory = f.number("memory_gb", low=0)
        if memory is None:
            row = gpu_catalog.lookup_name(gpu_name)
            if row is None:
                raise f.fail("memory_gb", "a number >= 0 (total GPU memory of the server; "
                             "may be left out only when gpu_name is a known GPU)")
            memory = count * row[3]
        lat = f.number("latitude", low=-90, high=90)
        lon = f.number("longitude", low=-180, high=180)
        if (lat is None) != (lon is None):
            raise f.fail("longitude" if lon is None else "latitude",
                         "both latitude and longitude, or neither")
        nodes.append(Node(id=node_id, city=city or None, gpus=count, gpu_name=gpu_name,
                          compute_capability=cc, memory_gb=memory, latitude=lat, longitude=lon))
    if not nodes:
        raise InputError("expected at least one node", path=path, line=lines.line(),
                         field="nodes")

    merged: dict[tuple[str, str], dict[str, Any]] = {}
    order: list[tuple[str, str]] = []
    for i, obj in enumerate(raw_links):
        where = f"links[{i}]"
        if not isinstance(obj, dict):
            raise InputError(f"expected an object, got {_json_type(obj)}", path=path,
                             line=lines.line(), field=where)
        note_unknown(obj, LINK_KEYS, "links[]", "links", i)
        f = _Fields(obj, path, where, lambda i=i: lines.line("links", i))
        src = f.string("src", required=True)
        dst = f.string("dst", required=True)
        for key, node in (("src", src), ("dst", dst)):
            if node not in seen:
                raise InputError(f"unknown node {node!r} (not in nodes)", path=path,
                                 line=f.line(), field=f"{where}.{key}")
        rtt = f.number("rtt_ms", required=True, low=0)
        bw = f.number("bandwidth_gbps", low=0)
        loss = f.number("loss", default=0.0, low=0, high=1)
        samples = int(f.number("samples", default=0, low=0, integer=True))
        imputed = obj.get("imputed", False)
        if not isinstance(imputed, bool):
            raise f.fail("imputed", "true or false")
        if imputed:
            issues.append(ImportIssue(path, f.line(), f"imputed link {src} -> {dst} ignored "
                                      "(completion is recomputed from measured links)"))
            continue
        if src == dst:
            issues.append(ImportIssue(path, f.line(), f"self-loop {src} -> {dst} dropped"))
            continue
        key = (src, dst)
        if key in merged:
            first = merged[key]
            conflicting = "conflicting " if rtt != first["rtts"][0] else ""
            issues.append(ImportIssue(path, f.line(), f"{conflicting}duplicate of the link "
                                      f"{src} -> {dst} on line {lines.line('links', first['index'])}"
                                      "; RTTs averaged"))
            first["rtts"].append(rtt)
            first["samples"] += samples
            if bw is not None:
                first["bws"].append(bw)
            continue
        merged[key] = {"index": i, "rtts": [rtt], "bws": [] if bw is None else [bw],
                       "loss": loss, "samples": samples}
        order.append(key)
    links = []
    for src, dst in order:
        m = merged[(src, dst)]
        links.append(Link(src, dst, rtt_ms=sum(m["rtts"]) / len(m["rtts"]),
                          bandwidth_gbps=(sum(m["bws"]) / len(m["bws"])) if m["bws"] else None,
                          loss=m["loss"], samples=m["samples"]))
    return Fleet(tuple(nodes), tuple(links), name=name), issues
