"""Reading and writing fleet files.

Two formats, told apart by content (not by the file name):

* the paper's: a folder or a .zip holding ``node_feature.csv`` (``node,City,Capability,Memory``;
  Memory is the server's total GPU memory in GB; GPU count unknown, so 8) and ``edge.txt``
  (``src dst weight`` in ms, space separated, one undirected pair per line);
* the fleet JSON of DESIGN.md, which ``save_fleet_json`` writes.

Real files are flawed (the paper's own has self-loops, duplicates, trailing spaces). A flaw does not
stop the import: it is reported once as an :class:`ImportIssue` with its file and line, and the
fleet is repaired (self-loops dropped, duplicates averaged, names trimmed). A file that cannot be
read as a fleet at all (bad number, missing column, unknown node) raises ``InputError`` naming the
file, the line and the field.
"""

from __future__ import annotations

import bisect
import csv
import io
import json
import json.decoder
import json.scanner
import math
import os
import zipfile
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Callable
from typing import Any

from hulk.errors import InputError
from planner.core import gpus as gpu_catalog
from planner.core.fleet import Fleet, Link, Node

PAPER_NODES = "node_feature.csv"
PAPER_EDGES = "edge.txt"
PAPER_COLUMNS = ("node", "city", "capability", "memory")

NODE_KEYS = {"id", "city", "gpus", "gpu_name", "compute_capability", "memory_gb",
             "latitude", "longitude"}
LINK_KEYS = {"src", "dst", "rtt_ms", "bandwidth_gbps", "loss", "samples", "imputed"}
TOP_KEYS = {"nodes", "links", "name", "format"}
MAX_MEMBER_BYTES = 256 << 20   # an archive member larger than this is no fleet (zip bombs)
MAX_JSON_INT = 2 ** 53          # beyond this a JSON integer is no count, memory or RTT we can use


@dataclass(frozen=True)
class ImportIssue:
    """One flaw found (and repaired) while importing a fleet file."""

    path: str
    line: int | None
    message: str

    def __str__(self) -> str:
        where = f"{self.path}:{self.line}" if self.line else self.path
        return f"{where}: {self.message}"


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
        return _read_paper(nodes_path.read_bytes(), str(nodes_path),
                           edges_path.read_bytes(), str(edges_path), name=p.name)
    try:
        data = p.read_bytes()
    except OSError as exc:
        raise InputError(f"cannot read: {exc.strerror}", path=str(p)) from exc
    if data[:4] == b"PK\x03\x04" or zipfile.is_zipfile(io.BytesIO(data)):
        return _read_paper_zip(data, str(p))
    return _read_json(data, str(p), default_name=p.stem)


def fleet_to_json(fleet: Fleet) -> dict[str, Any]:
    """The fleet JSON of DESIGN.md (measured links only; imputed ones are recomputed on load)."""
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


# ------------------------------------------------------------------------------ paper's format

def _read_paper_zip(data: bytes, path: str) -> tuple[Fleet, list[ImportIssue]]:
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
        members = {Path(m.filename).name: m.filename for m in archive.infolist()
                   if not m.is_dir() and not Path(m.filename).name.startswith("._")}
        if PAPER_NODES not in members or PAPER_EDGES not in members:
            raise InputError(f"archive has no {PAPER_NODES} and {PAPER_EDGES} "
                             "(the paper's fleet format)", path=path)
        nodes_bytes = _read_member(archive, members[PAPER_NODES], path)
        edges_bytes = _read_member(archive, members[PAPER_EDGES], path)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, NotImplementedError, OSError, EOFError,
            ValueError) as exc:
        raise InputError(f"not a readable zip archive ({exc})", path=path) from exc
    return _read_paper(nodes_bytes, f"{path}!{members[PAPER_NODES]}",
                       edges_bytes, f"{path}!{members[PAPER_EDGES]}", name=Path(path).stem)


def _read_member(archive: zipfile.ZipFile, name: str, path: str) -> bytes:
    """One member, never more than MAX_MEMBER_BYTES of it (its header's size may lie)."""
    info = archive.getinfo(name)
    if info.file_size > MAX_MEMBER_BYTES:
        raise InputError(f"{name} unpacks to {info.file_size} bytes; expected at most "
                         f"{MAX_MEMBER_BYTES} for a fleet file", path=path)
    with archive.open(info) as member:
        data = member.read(MAX_MEMBER_BYTES + 1)
    if len(data) > MAX_MEMBER_BYTES:
        raise InputError(f"{name} unpacks to more than {MAX_MEMBER_BYTES} bytes; expected a "
                         "fleet file", path=path)
    return data


def _text(data: bytes, path: str) -> str:
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data[:exc.start].count(b"\n") + 1
        raise InputError("not UTF-8 text", path=path, line=line) from exc


def _number(text: str, path: str, line: int, field: str, *, integer: bool = False) -> float:
    value = text.strip()
    try:
        number = int(value) if integer else float(value)
    except ValueError:
        kind = "an integer" if integer else "a number"
        raise InputError(f"expected {kind}, got {value!r}", path=path, line=line,
                         field=field) from None
    if not integer and not math.isfinite(number):
        raise InputError(f"expected a finite number, got {value!r}", path=path, line=line,
                         field=field)
    return number


def _read_paper(nodes_bytes: bytes, nodes_path: str, edges_bytes: bytes, edges_path: str,
                name: str) -> tuple[Fleet, list[ImportIssue]]:
    issues: list[ImportIssue] = []
    nodes = _read_paper_nodes(_text(nodes_bytes, nodes_path), nodes_path, issues)
    links = _read_paper_edges(_text(edges_bytes, edges_path), edges_path,
                              {n.id for n in nodes}, issues)
    _report_coverage(nodes, links, edges_path, issues)
    return Fleet(tuple(nodes), tuple(links), name=name or "default"), issues


def _read_paper_nodes(text: str, path: str, issues: list[ImportIssue]) -> list[Node]:
    reader = csv.reader(io.StringIO(text))
    try:
        rows = list(reader)
    except csv.Error as exc:  # e.g. a field over the csv module's size limit
        raise InputError(f"not a CSV table ({exc})", path=path, line=reader.line_num) from None
    header_line = next((i for i, r in enumerate(rows) if any(c.strip() for c in r)), None)
    if header_line is None:
        raise InputError("empty file (expected the header node,City,Capability,Memory)",
                         path=path, line=1)
    header = [c.strip().casefold() for c in rows[header_line]]
    missing = [c for c in PAPER_COLUMNS if c not in header]
    if missing:
        raise InputError(f"header lacks column(s) {', '.join(missing)} "
                         "(expected node,City,Capability,Memory)",
                         path=path, line=header_line + 1, field="header")
    col = {c: header.index(c) for c in PAPER_COLUMNS}
    nodes: list[Node] = []
    seen: dict[str, int] = {}
    untrimmed: dict[str, list[int]] = defaultdict(list)
    for i in range(header_line + 1, len(rows)):
        row, line = rows[i], i + 1
        if not any(c.strip() for c in row):
            continue
        if len(row) < len(header):
            raise InputError(f"expected {len(header)} columns, got {len(row)}",
                             path=path, line=line, field=_missing_field(header, len(row)))
        node_id = str(int(_number(row[col["node"]], path, line, "node", integer=True)))
        if node_id in seen:
            raise InputError(f"node {node_id} is listed twice (first on line {seen[node_id]})",
                             path=path, line=line, field="node")
        seen[node_id] = line
        raw_city = row[col["city"]]
        city = raw_city.strip()
        if raw_city != city:
            untrimmed[raw_city].append(line)
        capability = _number(row[col["capability"]], path, line, "Capability")
        memory = _number(row[col["memory"]], path, line, "Memory")
        if memory < 0:
            raise InputError(f"expected GPU memory in GB >= 0, got {memory:g}", path=path,
                             line=line, field="Memory")
        nodes.append(Node(id=node_id, city=city or None, gpus=gpu_catalog.DEFAULT_GPUS_PER_NODE,
                          compute_capability=capability, memory_gb=memory))
    for raw_city, lines in untrimmed.items():
        also = f" (also line{'s' if len(lines) > 2 else ''} {', '.join(map(str, lines[1:]))})" \
            if len(lines) > 1 else ""
        issues.append(ImportIssue(path, lines[0], f"City {raw_city!r} has surrounding spaces; "
                                  f"read as {raw_city.strip()!r}{also}"))
    if not nodes:
        raise InputError("no nodes (expected one row per server after the header)", path=path)
    return nodes


def _missing_field(header: list[str], present: int) -> str:
    """The display name of the first column a short row lacks."""
    names = {"node": "node", "city": "City", "capability": "Capability", "memory": "Memory"}
    return names.get(header[present], header[present]) if present < len(header) else "columns"


def _read_paper_edges(text: str, path: str, known: set[str],
                      issues: list[ImportIssue]) -> list[Link]:
    # pair (unordered) -> (first line, src, dst, [weights])
    pairs: dict[frozenset[str], tuple[int, str, str, list[float]]] = {}
    for line, raw in enumerate(text.splitlines(), start=1):
        fields = raw.split()
        if not fields:
            continue
        if len(fields) != 3:
            raise InputError(f"expected 3 fields 'src dst weight', got {len(fields)}",
                             path=path, line=line, field="line")
        src = str(int(_number(fields[0], path, line, "src", integer=True)))
        dst = str(int(_number(fields[1], path, line, "dst", integer=True)))
        weight = _number(fields[2], path, line, "weight")
        for field, node in (("src", src), ("dst", dst)):
            if node not in known:
                raise InputError(f"unknown node {node} (not in {PAPER_NODES})",
                                 path=path, line=line, field=field)
        if weight < 0:
            raise InputError(f"expected a latency in ms >= 0, got {weight:g}",
                             path=path, line=line, field="weight")
        if src == dst:
            issues.append(ImportIssue(path, line, f"self-loop {src} -> {dst} "
                                      f"({weight:g} ms) dropped"))
            continue
        key = frozenset((src, dst))
        if key in pairs:
            first_line, fsrc, fdst, weights = pairs[key]
            reversed_ = (src, dst) != (fsrc, fdst)
            kind = "reversed duplicate" if reversed_ else "duplicate"
            if weight != weights[0]:
                kind = "conflicting " + kind
            weights.append(weight)
            issues.append(ImportIssue(
                path, line, f"{kind} of line {first_line} ({fsrc} {fdst}: "
                f"{weights[0]:g} ms, here {weight:g} ms); RTTs averaged"))
            continue
        pairs[key] = (line, src, dst, [weight])
    return [Link(src, dst, rtt_ms=sum(w) / len(w), samples=0)
            for _, src, dst, w in sorted(pairs.values(), key=lambda t: t[0])]


def _report_coverage(nodes: list[Node], links: list[Link], path: str,
                     issues: list[ImportIssue]) -> None:
    n = len(nodes)
    total = n * (n - 1) // 2
    if links and len(links) < total:
        issues.append(ImportIssue(
            path, None, f"one-directional, partial coverage: {len(links)} of {total} pairs "
            "measured, each in one direction only; RTTs read as symmetric and the other "
            f"{total - len(links)} pairs completed as in COSTMODEL.md"))
    linked = {k.src for k in links} | {k.dst for k in links}
    lonely = [node.id for node in nodes if node.id not in linked]
    if lonely and n > 1:
        issues.append(ImportIssue(path, None, f"node(s) {', '.join(lonely)} have no link; "
                                  "they cannot reach the rest unless same-city completion applies"))


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
    text = _text(data, path)
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
