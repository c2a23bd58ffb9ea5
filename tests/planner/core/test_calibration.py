"""The calibrated cost model: hop overhead in the reference formulas, fitting factors back from
synthetic runs made with estimate() itself, outliers, evidence, bandwidth classes, apply, JSON."""

from __future__ import annotations

import json
import math
import random
import statistics
from dataclasses import replace

import numpy as np
import pytest

from hulk.errors import InputError
from planner.core.calibration import (BandwidthObservation, Calibration, Factor, Observation,
                                      class_gbps, fit, fit_bandwidth, gpu_key, link_class,
                                      site_class)
from planner.core.costmodel import Placement, Stage, estimate, transfer_s
from planner.core.fleet import GBIT, Fleet, Network, Node, SiteLink, bandwidth_from_rtt, complete
from planner.core.jobs import Job

GPUS = ("A100", "RTX 4090", "V100")
JOB = Job("j", params=1e9, layers=24, hidden=1024, seq_len=1024, global_batch=256, micro_batch=2)
TRUE = Calibration(compute={"A100": Factor.prior(0.6), "RTX 4090": Factor.prior(0.8),
                            "V100": Factor.prior(1.3)},
                   hop_overhead_s=Factor.prior(0.01), communication=Factor.prior(1.5))


def random_net(rng: random.Random, gpus=GPUS) -> Network:
    n = rng.randint(8, 10)
    sites = [f"s{k}" for k in range(rng.randint(2, 4))]
    nodes = [Node(id=f"n{i}", gpus=rng.choice([1, 2, 4]), gpu_name=rng.choice(gpus),
                  memory_gb=320, site=rng.choice(sites)) for i in range(n)]
    rtt = np.zeros((n, n))
    for i in range(n):
        for j in range(i + 1, n):
            same = nodes[i].site == nodes[j].site
            rtt[i, j] = rtt[j, i] = 0.5 if same else rng.uniform(2, 30)
    return Network.from_matrix(nodes, rtt)


def random_placement(rng: random.Random, net: Network, micro_batch: int = 2) -> Placement:
    k, d = rng.randint(1, 4), rng.randint(1, 2)
    chosen = rng.sample(range(net.n), k * d)
    cut = [round(JOB.layers * s / k) for s in range(k + 1)]
    return Placement(JOB, tuple(Stage(cut[s], cut[s + 1], tuple(chosen[s * d:(s + 1) * d]))
                                for s in range(k)), micro_batch=micro_batch)


def synthetic_runs(count: int, seed: int, noise: float = 0.01, gpus=GPUS, truth=TRUE,
                   sizes=(2,)) -> list[Observation]:
    """Runs measured on a world whose truth is ``truth``, with lognormal noise of ``noise``,
    each at a micro-batch size drawn from ``sizes``."""
    rng = random.Random(seed)
    out = []
    for r in range(count):
        net = random_net(rng, gpus)
        p = random_placement(rng, net, rng.choice(sizes))
        t = estimate(p, truth.apply(net)).iteration_s
        out.append(Observation(p, net, t * math.exp(rng.gauss(0.0, noise)), f"run{r}"))
    return out


def assert_recovers(cal: Calibration, rel: float = 0.03) -> None:
    for gpu, truth in TRUE.compute.items():
        assert cal.compute[gpu].fitted
        assert cal.compute[gpu].value == pytest.approx(truth.value, rel=rel), gpu
        assert cal.compute[gpu].low <= cal.compute[gpu].value <= cal.compute[gpu].high
    assert cal.hop_overhead_s.value == pytest.approx(0.01, rel=rel * 2)
    assert cal.communication.value == pytest.approx(1.5, rel=rel)


# ----------------------------------------------------------------------------------- cost model

def test_hop_overhead_is_added_once_per_hop_and_zero_changes_nothing():
    rng = random.Random(1)
    net = random_net(rng)
    p = random_placement(rng, net)
    src, dst = np.array([0, 1]), np.array([2, 3])
    reference = transfer_s(net, src, dst, 4e6)
    assert np.array_equal(reference, 2.0 * (net.rtt_ms[src, dst] / 2000.0 + 4e6 / net.bw[src, dst]))
    slow = Network.from_matrix(net.nodes, net.rtt_ms, net.bw)
    slow.hop_overhead_s = 0.25
    assert np.allclose(transfer_s(slow, src, dst, 4e6), reference + 0.25)
    # An identity calibration is the reference model, number for number.
    assert estimate(p, Calibration().apply(net)) == estimate(p, net)
    assert Calibration().identity and not TRUE.identity


def test_subset_keeps_calibrated_throughput_and_overheads():
    net = replace(TRUE, micro_batch_overhead_s=Factor.prior(0.002)).apply(
        random_net(random.Random(2)))
    sub = net.subset([3, 1])
    assert sub.ids == [net.ids[3], net.ids[1]]
    assert list(sub.thr) == [net.thr[3], net.thr[1]]
    assert sub.hop_overhead_s == 0.01 and sub.micro_batch_overhead_s == 0.002
    assert sub.rtt_ms[0, 1] == net.rtt_ms[3, 1] and sub.bw[0, 1] == net.bw[3, 1]


def test_keys_and_link_classes():
    assert gpu_key(Node("a", gpu_name="NVIDIA A100-SXM4-40GB")) == "A100"
    assert gpu_key(Node("a", gpu_name="Mystery GPU")) == "Mystery GPU"
    assert gpu_key(Node("a", compute_capability=8.0)) == "cc8.0"
    assert gpu_key(Node("a")) == "unknown"
    assert link_class(Node("a", site="s1"), Node("b", site="s1")) == "intra-site"
    assert link_class(Node("a", site="aws:us-east-1"), Node("b", site="gcp:europe-west1")) \
        == "aws>gcp"
    assert site_class("aws:us-east-1", "paris") == "inter-site"


# ----------------------------------------------------------------------------------- fit

def test_fit_recovers_known_factors_from_synthetic_runs():
    cal = fit(synthetic_runs(36, seed=3), seed=0)
    assert_recovers(cal)
    assert cal.outliers == ()
    assert cal.compute["A100"].runs >= 3 and cal.hop_overhead_s.runs >= 3
    # Seeded: the same runs give the same intervals.
    again = fit(synthetic_runs(36, seed=3), seed=0)
    assert again.compute["A100"] == cal.compute["A100"]


def test_fit_recovers_a_micro_batch_overhead_from_runs_of_varied_micro_batch_size():
    # The overhead per micro-batch and stage is told from slower compute by runs whose
    # micro-batch count differs for the same work.
    truth = replace(TRUE, micro_batch_overhead_s=Factor.prior(0.02))
    cal = fit(synthetic_runs(40, seed=12, truth=truth, sizes=(1, 2, 4, 8)), seed=0)
    mbo = cal.micro_batch_overhead_s
    assert mbo.fitted and mbo.runs == 40
    assert mbo.value == pytest.approx(0.02, rel=0.05) and mbo.low <= mbo.value <= mbo.high
    assert_recovers(cal)
    # Runs that all have one micro-batch count on one stage cannot tell it from compute.
    same = [o for o in synthetic_runs(60, seed=13, truth=truth, sizes=(4,))
            if o.placement.num_stages == 1 and o.placement.replicas == 1]
    assert len(same) >= 3
    flat = fit(same)
    assert flat.micro_batch_overhead_s == Factor.prior(0.0, len(same))


def test_outliers_are_listed_and_do_not_move_the_factors():
    runs = synthetic_runs(36, seed=4)
    clean = fit(runs)
    throttled = Observation(runs[5].placement, runs[5].net, runs[5].measured_iteration_s * 3.0,
                            "throttled")
    failed = Observation(runs[6].placement, runs[6].net, math.nan, "failed")
    dirty = fit([*runs, throttled, failed])
    assert set(dirty.outliers) == {"throttled", "failed"}
    assert_recovers(dirty)
    for gpu in TRUE.compute:
        assert dirty.compute[gpu].value == pytest.approx(clean.compute[gpu].value, rel=0.005)
    assert dirty.communication.value == pytest.approx(clean.communication.value, rel=0.005)


def test_a_factor_with_too_little_evidence_keeps_its_prior():
    runs = synthetic_runs(30, seed=5, gpus=("A100", "V100"))
    rare = synthetic_runs(1, seed=6, gpus=("T4",))
    cal = fit([*runs, *rare], min_runs=3)
    t4 = cal.compute["T4"]
    assert (t4.value, t4.low, t4.high, t4.runs, t4.fitted) == (1.0, 1.0, 1.0, 1, False)
    assert cal.compute["A100"].fitted
    # Single-stage, single-replica runs only: nothing says anything about hops or communication.
    alone = [o for o in runs if len(o.placement.nodes) == 1][:3]
    assert len(alone) == 3
    solo = fit(alone)
    assert not solo.hop_overhead_s.fitted and solo.hop_overhead_s.value == 0.0
    assert not solo.communication.fitted and solo.communication.value == 1.0


def shaped_tests(truth: dict[str, float], exponent: float, per_class: int, seed: int,
                 noise: float = 0.02, rtt_ms=(8.0, 270.0)) -> list[BandwidthObservation]:
    """Tests whose throughput is each class's figure times the formula's Gbit/s to the power
    ``exponent``, at log-uniform RTTs in ``rtt_ms``, with lognormal noise."""
    rng = random.Random(seed)
    out = []
    for cls, gbps in truth.items():
        for _ in range(per_class):
            rtt = math.exp(rng.uniform(*map(math.log, rtt_ms)))
            formula = bandwidth_from_rtt(rtt) / GBIT
            out.append(BandwidthObservation(cls, formula, gbps * formula ** exponent
                                            * math.exp(rng.gauss(0.0, noise))))
    return out


def test_fit_bandwidth_recovers_the_exponent_and_class_figures_and_ignores_an_outlier():
    truth = {"intra-site": 40.0, "aws>gcp": 7.7, "inter-site": 2.5}
    clean = shaped_tests(truth, 0.45, 12, seed=7)
    obs = clean + [BandwidthObservation("aws>gcp", 5.0, 0.05)]   # a failed test
    obs += [BandwidthObservation("azure>aws", 1.0, 9.0)] * 2      # too few for a figure
    fitted = fit_bandwidth(obs, min_runs=3)
    e = fitted.exponent
    assert e.fitted and e.value == pytest.approx(0.45, abs=0.02) and e.low <= e.value <= e.high
    for cls, gbps in truth.items():
        f = fitted.classes[cls]
        assert f.fitted and f.runs == 12          # the failed test left out
        assert f.value == pytest.approx(gbps, rel=0.03)
        assert f.low <= f.value <= f.high
    assert not fitted.classes["azure>aws"].fitted and fitted.classes["azure>aws"].runs == 2
    # The failed test moves nothing: the same figures as without it.
    alone = fit_bandwidth(clean, min_runs=3)
    assert alone.exponent.value == pytest.approx(e.value, abs=1e-3)
    assert alone.classes["aws>gcp"].value == pytest.approx(fitted.classes["aws>gcp"].value,
                                                          rel=2e-3)
    # Seeded: the same tests give the same figures.
    assert fit_bandwidth(obs, min_runs=3) == fitted


@pytest.mark.parametrize("exponent", [0.0, 1.0])
def test_the_exponent_stays_within_zero_and_one(exponent):
    # Throughput rising with RTT, or falling faster than the formula: the bound holds.
    beyond = -0.5 if exponent == 0.0 else 1.6
    fitted = fit_bandwidth(shaped_tests({"aws>gcp": 3.0}, beyond, 20, seed=3))
    assert fitted.exponent.fitted and fitted.exponent.value == pytest.approx(exponent, abs=1e-6)


@pytest.mark.parametrize("pairs, rtt_ms", [(7, (10.0, 300.0)),   # too few pairs
                                           (41, (50.0, 140.0))])  # RTTs within 2.8x
def test_thin_evidence_gives_exponent_zero_and_the_class_median(pairs, rtt_ms):
    obs = shaped_tests({"aws>gcp": 3.0}, 0.5, pairs, seed=5, rtt_ms=rtt_ms)
    fitted = fit_bandwidth(obs)
    assert not fitted.exponent.fitted and fitted.exponent.value == 0.0
    f = fitted.classes["aws>gcp"]
    assert f.fitted and f.value == pytest.approx(statistics.median(o.measured_gbps for o in obs),
                                                 rel=1e-9)


def test_class_figures_scale_the_formula_to_the_exponent():
    formula = bandwidth_from_rtt(np.array([2.0, 80.0, 320.0])) / GBIT    # 10, 1, 0.25 Gbit/s
    assert class_gbps(4.0, formula, 0.0) == pytest.approx([4.0, 4.0, 4.0])      # a constant
    assert class_gbps(4.0, formula, 1.0) == pytest.approx(4.0 * formula)        # the formula's
    # Between: where the formula says 1 Gbit/s (80 ms), the figure itself.
    assert class_gbps(4.0, formula, 0.3) == pytest.approx(4.0 * formula ** 0.3)
    assert class_gbps(4.0, formula, 0.3)[1] == pytest.approx(4.0)


def test_fit_bandwidth_is_the_median_with_an_interval_that_narrows_with_evidence():
    rng = random.Random(8)

    def tests(n: int) -> list[BandwidthObservation]:     # at 80 ms: the formula's 1 Gbit/s
        return [BandwidthObservation("aws>gcp", 1.0, 5.0 * math.exp(rng.gauss(0.0, 0.3)))
                for _ in range(n)]

    few = [BandwidthObservation("aws>gcp", 1.0, g) for g in (4.0, 4.6, 5.0, 5.5, 6.5)]
    many = tests(401)
    for obs in (few, many):
        f = fit_bandwidth(obs).classes["aws>gcp"]
        # Many tests: the rare one past 3 scaled MADs is left out, moving the median a little.
        assert f.value == pytest.approx(statistics.median(o.measured_gbps for o in obs),
                                        rel=0.02 if obs is many else 1e-9)
        assert f.low < f.value < f.high
    thin, thick = fit_bandwidth(few).classes["aws>gcp"], fit_bandwidth(many).classes["aws>gcp"]
    assert thick.high / thick.low < thin.high / thin.low


def test_apply_scales_only_unmeasured_pairs_and_divides_by_communication():
    nodes = (Node("a", gpus=1, gpu_name="A100", memory_gb=80, site="aws:us-east-1"),
             Node("b", gpus=1, gpu_name="A100", memory_gb=80, site="gcp:europe-west1"),
             Node("c", gpus=1, gpu_name="V100", memory_gb=32, site="gcp:asia-east1"))
    fleet = Fleet(nodes, site_links=(
        SiteLink("aws:us-east-1", "gcp:europe-west1", rtt_ms=80.0, bandwidth_gbps=3.0),
        SiteLink("aws:us-east-1", "gcp:asia-east1", rtt_ms=160.0),
        SiteLink("gcp:europe-west1", "gcp:asia-east1", rtt_ms=200.0)))
    net = complete(fleet)
    cal = Calibration(compute={"A100": Factor.prior(0.5)},
                      bandwidth={"aws>gcp": Factor(4.0, 4.0, 4.5, 5, True),
                                 "gcp>gcp": Factor.prior(1.0, 2)},
                      communication=Factor.prior(2.0), hop_overhead_s=Factor.prior(0.003),
                      bandwidth_exponent=Factor(0.3, 0.25, 0.35, 9, True))
    out = cal.apply(net)
    assert out.bw[0, 1] == pytest.approx(3.0 * GBIT / 2.0)                  # measured: kept
    # The class's figure, at the formula's 0.5 Gbit/s for 160 ms.
    assert out.bw[0, 2] == pytest.approx(4.0 * 0.5 ** 0.3 * GBIT / 2.0)
    assert out.bw[1, 2] == pytest.approx(bandwidth_from_rtt(200.0) / 2.0)   # unfitted: formula
    assert list(out.thr) == pytest.approx([net.thr[0] * 0.5, net.thr[1] * 0.5, net.thr[2]])
    assert out.hop_overhead_s == 0.003 and net.hop_overhead_s == 0.0
    assert net.bw[0, 2] == pytest.approx(bandwidth_from_rtt(160.0))          # input untouched
    # Only unfitted classes: the reference network, number for number.
    thin = Calibration(bandwidth={"aws>gcp": Factor.prior(1.0, 2)})
    assert thin.identity and np.array_equal(thin.apply(net).bw, net.bw)


# ----------------------------------------------------------------------------------- JSON

def test_an_older_format_is_a_one_line_error_saying_what_to_do():
    data = {**TRUE.to_json(), "format": "hulk-calibration/1"}
    with pytest.raises(InputError) as err:
        Calibration.from_json(data, "cal.json")
    message = str(err.value)
    assert message.startswith("cal.json: format: hulk-calibration/1 is an older format")
    assert "Gbit/s" in message and "hulk-planner calibrate --out" in message
    assert "\n" not in message


def test_json_round_trip():
    cal = fit(synthetic_runs(12, seed=8), bandwidth={"inter-site": Factor(2.0, 1.8, 2.3, 7, True)},
              bandwidth_exponent=Factor(0.4, 0.3, 0.5, 20, True))
    assert cal.bandwidth_exponent.value == 0.4
    data = json.loads(json.dumps(cal.to_json()))
    assert Calibration.from_json(data, "cal.json") == cal
    # A file written without the micro-batch overhead reads with it at its prior.
    data.pop("micro_batch_overhead_s")
    assert Calibration.from_json(data, "cal.json") == replace(
        cal, micro_batch_overhead_s=Factor.prior(0.0))


@pytest.mark.parametrize("mutate, field", [
    (lambda d: d.update(format="other/1"), "format"),
    (lambda d: d["compute"].update(A100={"value": -1, "low": 0, "high": 1, "runs": 3,
                                         "fitted": True}), "compute.A100.value"),
    (lambda d: d["communication"].update(runs="many"), "communication.runs"),
    (lambda d: d["hop_overhead_s"].update(fitted="yes"), "hop_overhead_s.fitted"),
    (lambda d: d["micro_batch_overhead_s"].update(value=-0.1), "micro_batch_overhead_s.value"),
    (lambda d: d.update(bandwidth=[1, 2]), "bandwidth"),
    (lambda d: d.pop("communication"), "communication"),
    (lambda d: d.update(outliers="run3"), "outliers"),
    (lambda d: d.pop("bandwidth_exponent"), "bandwidth_exponent"),
    (lambda d: d["bandwidth_exponent"].update(value=1.5, high=1.5),
     "bandwidth_exponent.value"),
])
def test_from_json_rejects_bad_files_naming_the_field(mutate, field):
    data = TRUE.to_json()
    mutate(data)
    with pytest.raises(InputError) as err:
        Calibration.from_json(data, "cal.json")
    message = str(err.value)
    assert message.startswith(f"cal.json: {field}: ") and "\n" not in message


def test_a_gpu_model_no_run_is_limited_by_keeps_its_prior_instead_of_drifting_to_the_bound():
    """Every run pairs an A100 stage with a far slower V100 stage: the runs bound the A100's
    figure from below only (any faster one explains them as well), so a planner must not trust
    whatever value the optimizer drifted to."""
    rng = random.Random(11)
    truth = Calibration(compute={"A100": Factor.prior(100.0), "V100": Factor.prior(1.0)},
                        hop_overhead_s=Factor.prior(0.0), communication=Factor.prior(1.0))
    runs = []
    for r in range(12):
        nodes = [Node(id="a", gpus=1, gpu_name="A100", memory_gb=320, site="s0"),
                 Node(id="v", gpus=1, gpu_name="V100", memory_gb=320, site="s1")]
        rtt = rng.uniform(2, 30)
        net = Network.from_matrix(nodes, np.array([[0.0, rtt], [rtt, 0.0]]))
        cut = rng.randint(6, 18)
        p = Placement(JOB, (Stage(0, cut, (0,)), Stage(cut, JOB.layers, (1,))), micro_batch=2)
        t = estimate(p, truth.apply(net)).iteration_s
        runs.append(Observation(p, net, t * math.exp(rng.gauss(0.0, 0.01)), f"run{r}"))
    cal = fit(runs, min_runs=3)
    assert cal.compute["V100"].fitted
    assert not cal.compute["A100"].fitted and cal.compute["A100"].value == 1.0
    assert cal.compute["A100"].runs == 12
