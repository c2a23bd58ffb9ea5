"""The paper's fleet format: a folder or a .zip holding ``node_feature.csv`` and ``edge.txt``.

``node_feature.csv`` has ``node,City,Capability,Memory`` (Memory is the server's total GPU memory
in GB; the GPU count is unknown, so 8); ``edge.txt`` has ``src dst weight`` (RTT in ms), space
separated, one undirected pair per line. The paper's own files are flawed (self-loops, duplicates,
trailing spaces): each flaw is reported once as an :class:`ImportIssue` with its file and line,
and repaired. What cannot be read as a fleet raises ``InputError`` naming file, line and field.
Files and archive members are read up to ``MAX_FLEET_FILE_BYTES`` (zip bombs, ``/dev/zero``).
"""

from __future__ import annotations

import csv
import io
import math
import zipfile
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from hulk.errors import InputError
from hulk.plural import count as plural
from hulk.validate import NAME_EXPECTED, Bound, Invalid, is_name, shown
from planner.core import gpus as gpu_catalog
from planner.core.fleet import FLEET_BOUNDS, FLEET_TEXT_CHARS, MAX_FLEET_NODES, Fleet, Link, Node

PAPER_NODES = "node_feature.csv"
PAPER_EDGES = "edge.txt"
PAPER_COLUMNS = ("node", "city", "capability", "memory")
# A fleet file (or archive member) larger than this is no fleet: a full mesh of 1,000 servers
# in fleet JSON is 70 MB, a 10,000-server fleet with site links 5 MB.
MAX_FLEET_FILE_BYTES = 256 << 20
MAX_MEMBER_BYTES = MAX_FLEET_FILE_BYTES
FLEET_FILE = (f"a fleet file (fleet JSON, or the paper's {PAPER_NODES} and {PAPER_EDGES}, "
              "in a folder or .zip)")


@dataclass(frozen=True)
class ImportIssue:
    """One flaw found (and repaired) while importing a fleet file."""

    path: str
    line: int | None
    message: str

    def __str__(self) -> str:
        where = f"{self.path}:{self.line}" if self.line else self.path
        return f"{where}: {self.message}"



def read_paper_zip(data: bytes, path: str) -> tuple[Fleet, list[ImportIssue]]:
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
        members = {Path(m.filename).name: m.filename for m in archive.infolist()
                   if not m.is_dir() and not Path(m.filename).name.startswith("._")}
        if PAPER_NODES not in members or PAPER_EDGES not in members:
            raise InputError(f"archive has no {PAPER_NODES} and {PAPER_EDGES} "
                             "(the paper's fleet format)", path=path)
        encrypted = [m.filename for m in archive.infolist() if m.flag_bits & 0x1]
        if encrypted:
            raise InputError(f"{encrypted[0]} is encrypted; expected an archive without a "
                             "password", path=path)
        nodes_bytes = _read_member(archive, members[PAPER_NODES], path)
        edges_bytes = _read_member(archive, members[PAPER_EDGES], path)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, NotImplementedError, OSError, EOFError,
            ValueError, RuntimeError) as exc:
        raise InputError(f"not a readable zip archive ({exc})", path=path) from exc
    return read_paper(nodes_bytes, f"{path}!{members[PAPER_NODES]}",
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


def utf8_text(data: bytes, path: str) -> str:
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
        raise InputError(f"expected {kind}, got {shown(value)}", path=path, line=line,
                         field=field) from None
    if not integer and not math.isfinite(number):
        raise InputError(f"expected a finite number, got {shown(value)}", path=path, line=line,
                         field=field)
    return number


def _node_id(text: str, path: str, line: int, field: str) -> str:
    """The paper's node ids are integers; as text they follow the node-id rule too."""
    node_id = str(int(_number(text, path, line, field, integer=True)))
    if not is_name(node_id):
        raise InputError(f"expected a node id of {NAME_EXPECTED}, got {node_id[:40]!r}",
                         path=path, line=line, field=field)
    return node_id


def _bounded(text: str, bound: Bound, path: str, line: int, field: str) -> float:
    """A number of the paper's files within its FLEET_BOUNDS bound."""
    try:
        return float(bound.check(text))
    except Invalid as bad:
        raise bad.error(path=path, line=line, field=field) from None


def read_paper(nodes_bytes: bytes, nodes_path: str, edges_bytes: bytes, edges_path: str,
                name: str) -> tuple[Fleet, list[ImportIssue]]:
    issues: list[ImportIssue] = []
    nodes = _read_paper_nodes(utf8_text(nodes_bytes, nodes_path), nodes_path, issues)
    links = _read_paper_edges(utf8_text(edges_bytes, edges_path), edges_path,
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
        node_id = _node_id(row[col["node"]], path, line, "node")
        if node_id in seen:
            raise InputError(f"node {node_id} is listed twice (first on line {seen[node_id]})",
                             path=path, line=line, field="node")
        seen[node_id] = line
        raw_city = row[col["city"]]
        city = raw_city.strip()
        if len(city) > FLEET_TEXT_CHARS or not city.isprintable():
            raise InputError(f"expected at most {FLEET_TEXT_CHARS} printable characters (no "
                             f"control characters), got {city[:40]!r}", path=path, line=line,
                             field="City")
        if raw_city != city:
            untrimmed[raw_city].append(line)
        capability = _bounded(row[col["capability"]], FLEET_BOUNDS["compute_capability"], path,
                              line, "Capability")
        memory = _bounded(row[col["memory"]], FLEET_BOUNDS["memory_gb"], path, line, "Memory")
        if len(nodes) == MAX_FLEET_NODES:
            raise InputError(f"expected at most {MAX_FLEET_NODES:,} nodes", path=path, line=line,
                             field="node")
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
        src = _node_id(fields[0], path, line, "src")
        dst = _node_id(fields[1], path, line, "dst")
        weight = _bounded(fields[2], FLEET_BOUNDS["rtt_ms"], path, line, "weight")
        for field, node in (("src", src), ("dst", dst)):
            if node not in known:
                raise InputError(f"unknown node {node} (not in {PAPER_NODES})",
                                 path=path, line=line, field=field)
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
            path, None, f"one-directional, partial coverage: {len(links)} of {plural(total, 'pair')} "
            "measured, each in one direction only; RTTs read as symmetric and the other "
            f"{plural(total - len(links), 'pair')} completed as in docs/COSTMODEL.md"))
    linked = {k.src for k in links} | {k.dst for k in links}
    lonely = [node.id for node in nodes if node.id not in linked]
    if lonely and n > 1:
        issues.append(ImportIssue(path, None, f"node(s) {', '.join(lonely)} have no link; "
                                  "they cannot reach the rest unless same-city completion applies"))
