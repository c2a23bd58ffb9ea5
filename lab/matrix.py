"""The lab's latency matrix: hosts (name, city) and the RTT in ms between every pair.

The default is the twelve cities of the Hulk paper's Table 1. Their RTTs are derived here from the
great-circle distance between the cities (``hulk.geo``): light in fibre needs 1 ms of RTT per
100 km, and real routes are longer than the great circle and pass through routers, so the figure is
inflated by ``INFLATION`` (1.8: e.g. London-Paris 7 ms, Beijing-Tokyo 39 ms, Beijing-Berlin
133 ms, Beijing-California 173 ms, which are in the range public RTT tables report), plus
``BASE_MS`` for the last mile. Nothing here reads the paper's data.

``scale`` multiplies every RTT so that a job on a 2-core machine, where compute is slow and
there are few cores to overlap with, still sees latency in the proportion it would have at real
speed; it is the one knob the lab offers to fit the machine.

A custom matrix comes from YAML::

    hosts: [{name: a, city: Beijing}, {name: b, city: Tokyo}]   # or a plain list of names
    rtt_ms: [[0, 40], [40, 0]]

or from CSV, a square table whose first row and first column name the hosts::

    ,a,b
    a,0,40
    b,40,0
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path

import yaml

from hulk import geo
from hulk.errors import InputError
from hulk.plural import count

INFLATION = 1.8
BASE_MS = 1.0

# The paper's Table 1, in its order; "Neimeng" is Inner Mongolia (Hohhot) in the gazetteer.
TABLE1_CITIES: tuple[str, ...] = (
    "Beijing", "Neimeng", "Nanjing", "Quanzhou", "Tokyo", "New Delhi",
    "Berlin", "London", "Paris", "Rome", "California", "Brasilia",
)


@dataclass(frozen=True)
class Host:
    name: str          # node id, also the agent's --node-id
    city: str | None   # gazetteer city (or None for a custom matrix without cities)


@dataclass(frozen=True)
class LatencyMatrix:
    """Symmetric RTTs in ms between ``hosts``; ``rtt_ms[i][j]`` is the round trip i -> j -> i."""

    hosts: tuple[Host, ...]
    rtt_ms: tuple[tuple[float, ...], ...]

    def __post_init__(self) -> None:
        n = len(self.hosts)
        if len(self.rtt_ms) != n or any(len(row) != n for row in self.rtt_ms):
            raise InputError(f"latency matrix must be {n}x{n} for {count(n, 'host')}")
        names = [h.name for h in self.hosts]
        if len(set(names)) != n:
            raise InputError("host names must be unique")

    @property
    def n(self) -> int:
        return len(self.hosts)

    @property
    def names(self) -> list[str]:
        return [h.name for h in self.hosts]

    def rtt(self, i: int, j: int) -> float:
        return self.rtt_ms[i][j]

    def one_way_s(self, i: int, j: int) -> float:
        """The delay the switch applies to a packet from host i to host j."""
        return self.rtt_ms[i][j] / 2000.0

    def scaled(self, scale: float) -> "LatencyMatrix":
        if not (scale > 0 and math.isfinite(scale)):
            raise InputError(f"scale must be a positive number, got {scale}", field="--scale")
        return LatencyMatrix(self.hosts, tuple(tuple(v * scale for v in row) for row in self.rtt_ms))

    def subset(self, indices: list[int]) -> "LatencyMatrix":
        return LatencyMatrix(tuple(self.hosts[i] for i in indices),
                             tuple(tuple(self.rtt_ms[i][j] for j in indices) for i in indices))

    def as_lists(self) -> list[list[float]]:
        return [list(row) for row in self.rtt_ms]


def city_rtt_ms(a: str, b: str) -> float:
    """Modelled RTT between two gazetteer cities: BASE_MS + INFLATION * great-circle km / 100."""
    ca, cb = geo.coordinates(a), geo.coordinates(b)
    if ca is None:
        raise InputError(f"unknown city {a!r} (not in hulk.geo)")
    if cb is None:
        raise InputError(f"unknown city {b!r} (not in hulk.geo)")
    if geo.canonical_city(a) == geo.canonical_city(b):
        return BASE_MS
    return BASE_MS + INFLATION * geo.great_circle_km(ca, cb) / geo.KM_PER_MS_RTT


def from_cities(cities: list[str] | tuple[str, ...], names: list[str] | None = None) -> LatencyMatrix:
    """A matrix over hosts in ``cities`` (one host per entry; a city may repeat)."""
    if names is None:
        names = default_names(cities)
    hosts = tuple(Host(name, city) for name, city in zip(names, cities))
    rtt = tuple(tuple(0.0 if i == j else city_rtt_ms(cities[i], cities[j])
                      for j in range(len(cities))) for i in range(len(cities)))
    return LatencyMatrix(hosts, rtt)


def default_names(cities: list[str] | tuple[str, ...]) -> list[str]:
    """Node ids like ``beijing-1``, ``new-delhi-1``; a repeated city counts up."""
    seen: dict[str, int] = {}
    out = []
    for city in cities:
        slug = "-".join((geo.canonical_city(city) or city).lower().replace("'", "").split())
        if (geo.canonical_city(city) or "") == "Hohhot":
            slug = "neimeng"
        seen[slug] = seen.get(slug, 0) + 1
        out.append(f"{slug}-{seen[slug]}")
    return out


def table1(hosts: int | None = None) -> LatencyMatrix:
    """The paper's Table 1 cities; ``hosts`` > 12 cycles through them again (second server per city)."""
    n = len(TABLE1_CITIES) if hosts is None else hosts
    if n < 1:
        raise InputError(f"need at least one host, got {n}", field="--hosts")
    cities = [TABLE1_CITIES[i % len(TABLE1_CITIES)] for i in range(n)]
    return from_cities(cities)


def _number(text: str, path: str, line: int, field: str) -> float:
    try:
        value = float(text)
    except (TypeError, ValueError):
        raise InputError(f"expected a number of milliseconds, got {text!r}",
                         path=path, line=line, field=field) from None
    if not math.isfinite(value) or value < 0:
        raise InputError(f"expected a finite RTT >= 0 ms, got {text!r}", path=path, line=line,
                         field=field)
    return value


def _check_symmetric(rtt: list[list[float]], names: list[str], path: str) -> None:
    for i in range(len(names)):
        if rtt[i][i] != 0:
            raise InputError(f"diagonal must be 0, got {rtt[i][i]}", path=path,
                             field=f"{names[i]}->{names[i]}")
        for j in range(i + 1, len(names)):
            if abs(rtt[i][j] - rtt[j][i]) > 1e-9:
                raise InputError(f"matrix must be symmetric: {rtt[i][j]} vs {rtt[j][i]}",
                                 path=path, field=f"{names[i]}<->{names[j]}")


def load(path: str | Path) -> LatencyMatrix:
    """A matrix from a .yaml/.yml or .csv file (formats in the module docstring)."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as err:
        raise InputError(f"cannot read: {err.strerror}", path=str(p)) from None
    if p.suffix.lower() == ".csv":
        return _load_csv(text, str(p))
    if p.suffix.lower() in (".yaml", ".yml"):
        return _load_yaml(text, str(p))
    raise InputError("expected a .yaml, .yml or .csv latency matrix", path=str(p))


def _load_csv(text: str, path: str) -> LatencyMatrix:
    rows = [r for r in csv.reader(text.splitlines())]
    rows_with_line = [(i + 1, r) for i, r in enumerate(rows) if any(c.strip() for c in r)]
    if not rows_with_line:
        raise InputError("empty file; expected a header row of host names", path=path, line=1)
    header_line, header = rows_with_line[0]
    names = [c.strip() for c in header[1:]]
    if not names or any(not n for n in names):
        raise InputError("header must be an empty cell then one host name per column",
                         path=path, line=header_line)
    body = rows_with_line[1:]
    if len(body) != len(names):
        raise InputError(f"expected {len(names)} rows after the header, got {len(body)}",
                         path=path, line=header_line)
    rtt: list[list[float]] = []
    for k, (line, row) in enumerate(body):
        if len(row) != len(names) + 1:
            raise InputError(f"expected {len(names) + 1} cells, got {len(row)}", path=path, line=line)
        if row[0].strip() != names[k]:
            raise InputError(f"row {k + 1} must be host {names[k]!r}, got {row[0].strip()!r}",
                             path=path, line=line)
        rtt.append([_number(c.strip(), path, line, f"{names[k]}->{names[j]}")
                    for j, c in enumerate(row[1:])])
    _check_symmetric(rtt, names, path)
    hosts = tuple(Host(n, geo.canonical_city(n)) for n in names)
    return LatencyMatrix(hosts, tuple(tuple(r) for r in rtt))


def _load_yaml(text: str, path: str) -> LatencyMatrix:
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        raise InputError(f"invalid YAML: {getattr(err, 'problem', err)}", path=path,
                         line=mark.line + 1 if mark else None) from None
    if not isinstance(doc, dict):
        raise InputError("expected a mapping with 'hosts' and optionally 'rtt_ms'", path=path)
    raw_hosts = doc.get("hosts")
    if not isinstance(raw_hosts, list) or not raw_hosts:
        raise InputError("expected a non-empty list", path=path, field="hosts")
    hosts: list[Host] = []
    for k, item in enumerate(raw_hosts):
        if isinstance(item, str):
            hosts.append(Host(item, geo.canonical_city(item)))
        elif isinstance(item, dict) and isinstance(item.get("name"), str):
            city = item.get("city")
            if city is not None and geo.canonical_city(str(city)) is None:
                raise InputError(f"unknown city {city!r}", path=path, field=f"hosts[{k}].city")
            hosts.append(Host(item["name"], str(city) if city is not None else None))
        else:
            raise InputError("expected a host name or {name, city}", path=path, field=f"hosts[{k}]")
    names = [h.name for h in hosts]
    raw = doc.get("rtt_ms")
    if raw is None:
        # No matrix: derive it from the cities, which then must all be known.
        missing = [h.name for h in hosts if h.city is None]
        if missing:
            raise InputError(f"no rtt_ms given and hosts {missing} have no known city",
                             path=path, field="rtt_ms")
        return from_cities([h.city for h in hosts], names)
    if not isinstance(raw, list) or len(raw) != len(hosts):
        raise InputError(f"expected a {len(hosts)}x{len(hosts)} list of lists", path=path,
                         field="rtt_ms")
    rtt: list[list[float]] = []
    for i, row in enumerate(raw):
        if not isinstance(row, list) or len(row) != len(hosts):
            raise InputError(f"expected {len(hosts)} numbers", path=path, field=f"rtt_ms[{i}]")
        rtt.append([_number(v, path, None, f"rtt_ms[{i}][{j}]") for j, v in enumerate(row)])
    _check_symmetric(rtt, names, path)
    return LatencyMatrix(tuple(hosts), tuple(tuple(r) for r in rtt))
