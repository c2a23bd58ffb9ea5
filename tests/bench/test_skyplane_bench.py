"""bench.skyplane_bench and bench.skyplane_data: reading Skyplane's files and the error arithmetic,
on a slice of the real files in ../shared and on small hand-made pairs."""

from __future__ import annotations

import itertools
import math
import statistics
from dataclasses import dataclass

import pytest

from bench.skyplane_bench import calibration_api, covered_regions, fleet_for, plan_cases
from bench.skyplane_data import (DATA, Data, Pair, formula_case, join_pairs, read_rows,
                                 retest_case, rtts, stats, throughput_runs)
from bench.skyplane_models import CalibrationApi, fit_model, held_out_case
from hulk.errors import InputError
from planner.core.fleet import GBIT, complete

SLICE = 400   # lines of each file


def _slice(shared_dir, name: str, kind: str):
    path = shared_dir / DATA / name
    with path.open(newline="", encoding="utf-8") as f:
        return read_rows(list(itertools.islice(f, SLICE)), str(path), kind), str(path)


@pytest.fixture(scope="module")
def real(shared_dir):
    thr = _slice(shared_dir, "throughput.csv", "throughput")
    lat = _slice(shared_dir, "latency.csv", "latency")
    return thr, lat


def test_only_premium_rows_between_two_regions_are_read_in_gbit_per_s(real):
    (rows, where), _ = real
    runs = throughput_runs(rows, where, column="throughput_received")
    kept = [r for r in rows if r["src_tier"] == r["dst_tier"] == "PREMIUM"
            and r["src_region"] != r["dst_region"]]
    assert kept and len(kept) < len(rows)        # the slice holds both tiers
    assert sum(len(v) for v in runs.values()) == len(kept)
    first = kept[0]
    assert float(first["throughput_received"]) / 1e9 in runs[(first["src_region"],
                                                               first["dst_region"])]
    assert all(s != d for s, d in runs)


def test_pairs_join_throughput_and_rtt_and_the_formula_error_is_the_log_ratio(real):
    (trows, twhere), (lrows, lwhere) = real
    runs = throughput_runs(trows, twhere, column="throughput_received")
    rtt = rtts(lrows, lwhere)
    pairs = join_pairs(runs, rtt)
    assert pairs and {(p.src, p.dst) for p in pairs} == set(runs) & set(rtt)
    assert all(p.measured_gbps == statistics.median(runs[(p.src, p.dst)]) for p in pairs)
    by_hand = [abs(math.log(min(10.0, 80.0 / p.rtt_ms) / p.measured_gbps)) for p in pairs]
    result = formula_case(pairs)["all"]
    assert result["pairs"] == len(pairs)
    assert result["median_abs_log"] == pytest.approx(statistics.median(by_hand))


def test_formula_error_by_hand():
    pairs = [Pair("aws:a", "gcp:b", rtt_ms=40.0, measured_gbps=8.0, runs=1),     # 2 vs 8
             Pair("gcp:b", "aws:a", rtt_ms=4.0, measured_gbps=5.0, runs=1)]      # 10 (cap) vs 5
    result = formula_case(pairs)
    assert result["by_provider_pair"]["aws>gcp"]["median_abs_log"] == pytest.approx(math.log(4))
    assert result["by_provider_pair"]["gcp>aws"]["median_ratio"] == pytest.approx(2.0)
    # The median of ln 4 and ln 2 is their mean: a factor of sqrt(8) either way.
    assert result["all"]["median_factor"] == pytest.approx(math.sqrt(8))


def test_stats_median_p90_and_ratio():
    s = stats([1, 2, 4, 8, 16], [1, 1, 1, 1, 1])
    assert s["median_abs_log"] == pytest.approx(math.log(4))
    assert s["p90_factor"] == pytest.approx(2 ** 3.6)
    assert s["median_ratio"] == pytest.approx(4.0)
    assert stats([], []) == {"pairs": 0}


def test_bad_rows_are_one_line_errors_naming_file_line_and_field():
    with pytest.raises(InputError, match=r"t.csv: missing column\(s\) avg_rtt"):
        read_rows(["src_region,dst_region,src_tier,dst_tier\n"], "t.csv", "latency")
    rows = read_rows(["src_region,dst_region,src_tier,dst_tier,avg_rtt\n",
                      "aws:a,aws:b,PREMIUM,PREMIUM,12\n", "aws:a,aws:c,PREMIUM,PREMIUM,fast\n"],
                     "t.csv", "latency")
    with pytest.raises(InputError, match=r"t.csv:3: avg_rtt: expected a number, got 'fast'"):
        rtts(rows, "t.csv")


# A stand-in for planner.core.calibration, built from its records: one figure per provider
# pair, the median measured Gbit/s, kept at the prior (the formula) below min_runs.
@dataclass(frozen=True)
class Factor:
    value: float
    low: float
    high: float
    runs: int
    fitted: bool


@dataclass(frozen=True)
class BandwidthObservation:
    link_class: str
    formula_gbps: float
    measured_gbps: float


def _link_class(a, b) -> str:
    return "intra-site" if a.site == b.site else f"{a.site.split(':')[0]}>{b.site.split(':')[0]}"


@dataclass(frozen=True)
class BandwidthFit:
    classes: dict
    exponent: Factor


def _fit_bandwidth(obs, *, min_runs: int = 3):
    gbps: dict[str, list[float]] = {}
    for o in obs:
        gbps.setdefault(o.link_class, []).append(o.measured_gbps)
    return BandwidthFit({c: Factor(statistics.median(r), min(r), max(r), len(r), True)
                         if len(r) >= min_runs else Factor(1.0, 1.0, 1.0, len(r), False)
                         for c, r in gbps.items()}, Factor(0.0, 0.0, 0.0, 0, False))


STAND_IN = CalibrationApi(_fit_bandwidth, _link_class, BandwidthObservation)


def _pairs(n: int, gbps: dict[str, float], per_formula: bool = False) -> list[Pair]:
    """``n`` pairs per provider pair of RTTs 20-300 ms, each measured at its class's Gbit/s, or
    with ``per_formula`` at the formula times it."""
    out = []
    for k in range(n):
        rtt = 20.0 + 7 * k
        for cls, c in gbps.items():
            a, b = cls.split(">")
            out.append(Pair(f"{a}:r{k}", f"{b}:s{k}", rtt,
                            min(10.0, 80.0 / rtt) * c if per_formula else c, 1))
    return out


def test_class_figures_are_exact_where_throughput_ignores_rtt_and_the_factor_is_not():
    pairs = _pairs(40, {"aws>gcp": 6.0, "azure>azure": 17.0})
    result = held_out_case(pairs, STAND_IN, fractions=(0.25,), draws=2)["25%"]
    assert result["measured_pairs"] == 20
    models = result["models"]
    assert models["calibrated"]["all"]["pairs"] == 2 * 60     # held-out pairs, pooled
    for m in ("calibrated", "median", "lower quartile", "conservative", "power law"):
        assert models[m]["all"]["p90_abs_log"] == pytest.approx(0.0, abs=1e-12), m
        assert models[m]["overrated_1.2x_share"] == 0.0
    # The formula falls with RTT, so one factor on it is off at both ends of the RTT range.
    assert models["factor"]["all"]["p90_abs_log"] > 0.5
    assert result["calibrated_gbps_first_draw"]["azure>azure"] == pytest.approx(17.0)


def test_a_class_with_too_few_measured_pairs_keeps_the_formula_in_every_model():
    pairs = _pairs(40, {"aws>gcp": 6.0}) + _pairs(2, {"gcp>aws": 4.0}, per_formula=True)
    result = held_out_case(pairs, STAND_IN, fractions=(0.1,), draws=3)["10%"]
    for m, x in result["models"].items():
        unfitted = x["by_provider_pair"].get("gcp>aws")
        # Two pairs can never reach min_runs: held out, they are judged on the formula, 4x off.
        assert unfitted is not None and unfitted["median_factor"] == pytest.approx(4.0), m


def test_the_models_by_hand():
    pairs = [Pair("aws:a", f"gcp:b{k}", rtt, gbps, 1)
             for k, (rtt, gbps) in enumerate([(8.0, 4.0), (16.0, 10.0), (40.0, 4.0), (80.0, 2.0)])]
    # formula: 10, 5, 2, 1 Gbit/s; ratios 0.4, 2, 2, 2
    factor = fit_model("factor", STAND_IN, pairs)
    assert factor.exponent == 1.0 and factor.gbps("aws>gcp", 40.0) == pytest.approx(2.0 * 2.0)
    assert fit_model("median", STAND_IN, pairs).gbps("aws>gcp", 1.0) == pytest.approx(4.0)
    assert fit_model("lower quartile", STAND_IN, pairs).gbps("aws>gcp", 1.0) \
        == pytest.approx(3.5)
    assert fit_model("median", STAND_IN, pairs).gbps("gcp>aws", 40.0) == pytest.approx(2.0)
    # Throughput that follows the formula's square root: the power law finds it.
    rooted = [Pair(p.src, p.dst, p.rtt_ms, 3.0 * math.sqrt(min(10.0, 80.0 / p.rtt_ms)), 1)
              for p in pairs]
    law = fit_model("power law", STAND_IN, rooted)
    assert law.exponent == pytest.approx(0.5)
    assert law.gbps("aws>gcp", 20.0) == pytest.approx(3.0 * 2.0)
    # The tuned comparison: every pair within the 80 ms knee, so the median up to it, then
    # falling as (80 ms / RTT) ** 0.3.
    tuned = fit_model("tuned", STAND_IN, pairs)
    assert tuned.gbps("aws>gcp", 30.0) == pytest.approx(4.0)
    assert tuned.gbps("aws>gcp", 320.0) == pytest.approx(4.0 * 0.25 ** 0.3)
    # Four pairs: the bootstrap's 16th percentile of their median lies below it.
    assert 2.0 <= fit_model("conservative", STAND_IN, pairs).gbps("aws>gcp", 1.0) < 4.0


def test_retest_spread_is_each_run_against_the_pairs_median():
    data = Data(pairs=[], runs={("gcp:a", "gcp:b"): [4.0, 6.0], ("gcp:b", "gcp:a"): [7.0]},
                gcp_runs={("gcp:b", "gcp:a"): [14.0]}, rtt={})
    floor = retest_case(data)
    assert floor["repeated_runs"]["pairs"] == 1 and floor["repeated_runs"]["runs"] == 2
    assert floor["repeated_runs"]["median_abs_log"] == pytest.approx(
        (math.log(5 / 4) + math.log(6 / 5)) / 2)
    assert floor["gcp_later_run"]["median_ratio"] == pytest.approx(2.0)


def test_covered_regions_drop_the_region_missing_a_pair():
    pairs = [Pair(s, d, 10.0, 5.0, 1) for s, d in
             [("aws:a", "aws:b"), ("aws:b", "aws:c"), ("aws:c", "aws:a"), ("aws:d", "aws:a")]]
    assert covered_regions(pairs) == ["aws:a", "aws:b", "aws:c"]


def test_fleet_carries_each_cases_bandwidth_between_regions_and_the_same_rtt():
    pairs = [Pair("aws:a", "gcp:b", 40.0, 6.0, 1), Pair("gcp:b", "aws:a", 40.0, 8.0, 1)]
    data = Data(pairs, {}, {}, {})
    cases = plan_cases(data, None)
    assert set(cases) == {"formula", "measured"}
    rtt = {(p.src, p.dst): p.rtt_ms for p in pairs}
    nets = {name: complete(fleet_for(["aws:a", "gcp:b"], 0, case.bandwidth, rtt))
            for name, case in cases.items()}
    a, b = (next(i for i, n in enumerate(nets["measured"].nodes) if n.site == s)
            for s in ("aws:a", "gcp:b"))
    assert nets["measured"].bw[a, b] == pytest.approx(7.0 * GBIT)   # both directions merged
    assert nets["formula"].bw[a, b] == pytest.approx(2.0 * GBIT)
    assert nets["formula"].rtt_ms[a, b] == nets["measured"].rtt_ms[a, b] == 40.0
    assert 2 <= sum(n.site == "aws:a" for n in nets["formula"].nodes) <= 4


def test_plan_cases_keep_measured_pairs_and_give_the_others_their_class_figure():
    api = calibration_api()
    if api is None:
        pytest.skip("planner.core.calibration is not in this tree")
    regions = [f"aws:r{k}" for k in range(4)] + [f"gcp:s{k}" for k in range(4)]
    gbps = {"aws>aws": 9.0, "aws>gcp": 6.0, "gcp>gcp": 3.0}
    # One direction per pair, each class's throughput the formula's to the power 0.4: the
    # calibration fits that exponent from the measured half.
    pairs = [Pair(a, b, rtt, gbps[f"{a[:3]}>{b[:3]}"] * (80.0 / rtt) ** 0.4, 1)
             for k, (a, b) in enumerate((a, b) for a in regions for b in regions if a < b)
             for rtt in [20.0 + 5 * k]]     # RTTs of 20-155 ms: every pair differs
    cases = plan_cases(Data(pairs, {}, {}, {}), api, fraction=0.5)
    assert list(cases) == ["formula", "factor", "median", "calibrated", "measured"]
    calibrated = cases["calibrated"]
    measured = {k for k, v in calibrated.bandwidth.items() if v is not None}
    assert len(measured) == len(pairs) // 2
    rtt = {(p.src, p.dst): p.rtt_ms for p in pairs}
    nets = {name: cases[name].calibration.apply(complete(fleet_for(regions, 0, known, rtt)))
            for name in ("factor", "median", "calibrated")
            for known in [cases[name].bandwidth]}
    first, off = {}, {"factor": 0, "median": 0}
    for i, node in enumerate(nets["calibrated"].nodes):
        first.setdefault(node.site, i)
    for p in pairs:
        i, j = first[p.src], first[p.dst]
        got = nets["calibrated"].bw[i, j] / GBIT
        assert got == pytest.approx(p.measured_gbps, rel=1e-6), p
        for name in ("factor", "median"):
            got = nets[name].bw[i, j] / GBIT
            if (p.src, p.dst) in measured:
                assert got == pytest.approx(p.measured_gbps, rel=1e-6), (name, p)
            else:
                off[name] += got != pytest.approx(p.measured_gbps, rel=0.01)
    # A factor on the formula, or a constant: off for most pairs where the class's RTTs vary.
    assert min(off.values()) > 0.8 * (len(pairs) - len(measured))
