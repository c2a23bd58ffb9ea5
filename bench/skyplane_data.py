"""Skyplane's inter-region measurements read into directed pairs, and the error figures the
public-data benchmark (bench/skyplane_bench.py) reports.

The files (../shared/data/skyplane-interregion/, its README): iperf3 throughput with 64 streams
and ping RTT between VMs of AWS, Azure and Google Cloud regions. Only premium-tier rows are used
(the standard tier is another network path), self pairs are left out, a pair measured more than
once takes the median of its runs, and the RTT is ``avg_rtt``.
"""

from __future__ import annotations

import csv
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hulk.errors import InputError

DATA = Path("data") / "skyplane-interregion"
TIER = "PREMIUM"

REQUIRED = {"throughput": ("src_region", "dst_region", "src_tier", "dst_tier",
                           "throughput_received"),
            "gcp": ("src_region", "dst_region", "throughput_recieved"),
            "latency": ("src_region", "dst_region", "src_tier", "dst_tier", "avg_rtt")}


@dataclass(frozen=True)
class Pair:
    """One directed region pair with both a throughput and an RTT measurement."""

    src: str
    dst: str
    rtt_ms: float
    measured_gbps: float
    runs: int


# ------------------------------------------------------------------------------------ reading

def read_rows(lines: Iterable[str], where: str, kind: str) -> list[dict[str, str]]:
    """CSV rows of one Skyplane file (``kind``: a key of :data:`REQUIRED`)."""
    reader = csv.DictReader(lines)
    missing = [c for c in REQUIRED[kind] if c not in (reader.fieldnames or ())]
    if missing:
        raise InputError(f"missing column(s) {', '.join(missing)}", path=where)
    return list(reader)


def _number(row: dict[str, str], column: str, where: str, line: int) -> float:
    try:
        value = float(row[column])
    except (TypeError, ValueError):
        raise InputError(f"expected a number, got {row[column]!r}", path=where, line=line,
                         field=column) from None
    if not math.isfinite(value) or value < 0:
        raise InputError(f"expected a finite number >= 0, got {value}", path=where, line=line,
                         field=column)
    return value


def _kept(row: dict[str, str], tiered: bool) -> bool:
    if row["src_region"] == row["dst_region"]:
        return False
    return not tiered or (row["src_tier"] == TIER and row["dst_tier"] == TIER)


def throughput_runs(rows: Sequence[dict[str, str]], where: str, *, column: str,
                    tiered: bool = True) -> dict[tuple[str, str], list[float]]:
    """Gbit/s of every run per directed pair (rows with a throughput of 0 are failed runs)."""
    runs: dict[tuple[str, str], list[float]] = defaultdict(list)
    for line, row in enumerate(rows, start=2):
        if _kept(row, tiered):
            bits = _number(row, column, where, line)
            if bits > 0:
                runs[(row["src_region"], row["dst_region"])].append(bits / 1e9)
    return dict(runs)


def rtts(rows: Sequence[dict[str, str]], where: str) -> dict[tuple[str, str], float]:
    """Average RTT (ms) per directed pair, the median of repeated rows."""
    seen: dict[tuple[str, str], list[float]] = defaultdict(list)
    for line, row in enumerate(rows, start=2):
        if _kept(row, True):
            rtt = _number(row, "avg_rtt", where, line)
            if rtt > 0:
                seen[(row["src_region"], row["dst_region"])].append(rtt)
    return {k: float(np.median(v)) for k, v in seen.items()}


def join_pairs(runs: Mapping[tuple[str, str], list[float]],
               rtt: Mapping[tuple[str, str], float]) -> list[Pair]:
    """Pairs with both figures, sorted (the order every seeded draw starts from)."""
    return [Pair(s, d, rtt[(s, d)], float(np.median(runs[(s, d)])), len(runs[(s, d)]))
            for s, d in sorted(set(runs) & set(rtt))]


@dataclass(frozen=True)
class Data:
    pairs: list[Pair]
    runs: dict[tuple[str, str], list[float]]        # throughput.csv, premium tier
    gcp_runs: dict[tuple[str, str], list[float]]    # gcp_intracloud_throughput.csv
    rtt: dict[tuple[str, str], float]


def load(shared: Path) -> Data:
    folder = Path(shared) / DATA
    tables = {}
    for kind, name in (("throughput", "throughput.csv"), ("latency", "latency.csv"),
                       ("gcp", "gcp_intracloud_throughput.csv")):
        path = folder / name
        if not path.is_file():
            raise InputError("no such file (the Skyplane data; see its README)", path=str(path))
        with path.open(newline="", encoding="utf-8") as f:
            tables[kind] = (read_rows(f, str(path), kind), str(path))
    runs = throughput_runs(*tables["throughput"], column="throughput_received")
    gcp = throughput_runs(*tables["gcp"], column="throughput_recieved", tiered=False)
    rtt = rtts(*tables["latency"])
    return Data(join_pairs(runs, rtt), runs, gcp, rtt)


# ------------------------------------------------------------------------------ error figures

def formula_gbps(rtt_ms: float) -> float:
    from planner.core.fleet import GBIT, bandwidth_from_rtt

    return float(bandwidth_from_rtt(rtt_ms)) / GBIT


def provider_pair(src: str, dst: str) -> str:
    """``aws>gcp`` for a pair of ``provider:region`` names (the reports' grouping)."""
    return f"{src.split(':', 1)[0]}>{dst.split(':', 1)[0]}"


def log_errors(assumed: Sequence[float], measured: Sequence[float]) -> np.ndarray:
    """|ln(assumed / measured)| per pair: 0.69 is a factor of 2 either way."""
    return np.abs(np.log(np.asarray(assumed, float) / np.asarray(measured, float)))


def stats(assumed: Sequence[float], measured: Sequence[float]) -> dict:
    """Median and p90 of |ln ratio|, as factors too, and the median ratio assumed/measured."""
    if len(assumed) == 0:
        return {"pairs": 0}
    err = log_errors(assumed, measured)
    ratio = np.asarray(assumed, float) / np.asarray(measured, float)
    med, p90 = float(np.median(err)), float(np.percentile(err, 90))
    return {"pairs": len(err), "median_abs_log": med, "p90_abs_log": p90,
            "median_factor": math.exp(med), "p90_factor": math.exp(p90),
            "median_ratio": float(np.median(ratio))}


def grouped(pairs: Sequence[Pair], assumed: Sequence[float]) -> dict:
    """:func:`stats` over all pairs and per provider pair."""
    groups: dict[str, list[int]] = defaultdict(list)
    for k, p in enumerate(pairs):
        groups[provider_pair(p.src, p.dst)].append(k)
    measured = [p.measured_gbps for p in pairs]
    return {"all": stats(assumed, measured),
            "by_provider_pair": {g: stats([assumed[k] for k in ks], [measured[k] for k in ks])
                                 for g, ks in sorted(groups.items())}}


def formula_case(pairs: Sequence[Pair]) -> dict:
    return grouped(pairs, [formula_gbps(p.rtt_ms) for p in pairs])


def retest_case(data: Data) -> dict:
    """The noise floor of a measured pair: (i) repeated premium runs of one pair in
    throughput.csv, each run against the pair's median; (ii) the later Google Cloud run against
    throughput.csv's median for the same pair."""
    repeated = {k: v for k, v in data.runs.items() if len(v) > 1}
    run, median = [], []
    for v in repeated.values():
        run += v
        median += [float(np.median(v))] * len(v)
    later = sorted(set(data.gcp_runs) & set(data.runs))
    spread = {k: v for k, v in stats(run, median).items() if k != "pairs"}
    return {"repeated_runs": {"pairs": len(repeated), "runs": len(run), **spread,
                              "note": "each premium run of a pair measured more than once "
                                      "over the median of its runs"},
            "gcp_later_run": {**stats([float(np.median(data.gcp_runs[k])) for k in later],
                                      [float(np.median(data.runs[k])) for k in later]),
                              "note": "gcp_intracloud_throughput.csv (a later run) over "
                                      "throughput.csv, same zone pairs"}}
