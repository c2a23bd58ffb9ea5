"""`hulk-planner calibrate` and `plan --cost-model`: a store filled through its public methods
with jobs whose step times a known calibration made, fitted back, written, planned with."""

from __future__ import annotations

import json
import math
import random

import numpy as np
import pytest

from hulk.wire.progress import StepProgress
from hulk.wire.records import LaunchState, LaunchStatus
from planner.cli import main
from planner.commands.calibrate import factor_rows
from planner.core.calibration import Calibration, Factor
from planner.core.costmodel import estimate
from planner.core.fleet import GBIT, Fleet, Link, Node, bandwidth_from_rtt, complete
from planner.core.jobs import Job
from planner.core.lifecycle import PLACED, RUNNING
from planner.core.placements import job_spec
from planner.files.plan import read_plan
from planner.search.arrangement import placement_from_grid
from planner.service.calibration_data import bandwidth_observations, calibration_data
from planner.service.graph import fleet_from_store
from planner.service.store import Store

TRUE = Calibration(compute={"A100": Factor.prior(0.55), "V100": Factor.prior(1.2)},
                   hop_overhead_s=Factor.prior(0.004), communication=Factor.prior(1.4))
JOBS_YAML = ("jobs:\n  - {name: small, params: 3.0e8, layers: 12, hidden: 1024, seq_len: 512, "
             "global_batch: 64, micro_batch: 2, steps: 100}\n")


def run(capsys, *argv):
    code = main([*map(str, argv)])
    out = capsys.readouterr()
    return code, out.out, out.err


def lab_fleet() -> Fleet:
    nodes = tuple(Node(f"n{i}", gpus=1, gpu_name="A100" if i % 2 else "V100", memory_gb=40.0,
                       site=f"site{i % 3}") for i in range(9))
    rng = random.Random(0)
    links = tuple(Link(a.id, b.id, rtt_ms=0.4 if a.site == b.site else rng.uniform(3, 25),
                       samples=10) for i, a in enumerate(nodes) for b in nodes[i + 1:])
    return Fleet(nodes, links)


def fill_store(path, runs: int = 10) -> None:
    """Jobs placed on random nodes of ``lab_fleet``, each rank reporting the step time TRUE
    gives, with the plan's reference estimate stored as serve stores it."""
    rng = random.Random(1)
    with Store(path) as store:
        store.import_fleet(lab_fleet())
        net = complete(fleet_from_store(store))
        for r in range(runs):
            job = Job(f"job{r}", params=3e8, layers=12, hidden=1024, seq_len=512,
                      global_batch=64, micro_batch=2, steps=100)
            k, d = rng.choice([(1, 1), (2, 1), (3, 1), (2, 2), (1, 2), (4, 1)])
            grid = np.array(rng.sample(range(net.n), k * d)).reshape(k, d)
            p = placement_from_grid(job, net, grid, 2)
            ids = [net.ids[i] for i in p.nodes]
            record = store.submit_job(job.name, job_spec(job))
            store.update_job(record.id, state=PLACED, plan_id=f"p{r}", nodes=ids,
                             estimate_s=estimate(p, net).job_s)
            store.update_job(record.id, state=RUNNING)
            measured = estimate(p, TRUE.apply(net)).iteration_s
            for node in ids:
                store.heartbeat(node, launch=LaunchStatus(
                    LaunchState.RUNNING, plan_id=f"p{r}", job=job.name, progress=StepProgress(
                        steps=60, total_steps=100, iteration_s=measured,
                        iteration_p90_s=measured * 1.1, compute_s=0.0, communication_s=0.0,
                        samples=50, updated_ms=1)))


@pytest.fixture(scope="module")
def store_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("cal") / "planner.sqlite"
    fill_store(path)
    return path


def test_store_adapter_rebuilds_every_placement(store_path):
    with Store(store_path) as store:
        data = calibration_data(store)
    assert data.skipped == [] and len(data.observations) == 10
    assert data.bandwidth == []     # no throughput test ran
    # Ranks report their median step: a DiLoCo job's would be its inner step.
    assert all(o.median_step for o in data.observations)


def test_calibrate_prints_factors_and_writes_json(store_path, tmp_path, capsys):
    out_file = tmp_path / "cal.json"
    code, out, _ = run(capsys, "calibrate", "--db", store_path, "--out", out_file)
    assert code == 0
    assert "compute A100" in out and "hop overhead" in out and "communication" in out
    assert "micro-batch overhead" in out and "bandwidth exponent" in out and "outer sync" in out
    assert "fitted" in out and f"calibration written to {out_file}" in out
    cal = Calibration.from_json(json.loads(out_file.read_text()), str(out_file))
    assert cal.compute["A100"].value == pytest.approx(0.55, rel=0.05)
    assert cal.compute["V100"].value == pytest.approx(1.2, rel=0.05)
    assert cal.communication.value == pytest.approx(1.4, rel=0.05)
    code, out, _ = run(capsys, "calibrate", "--db", store_path, "--json")
    assert code == 0 and json.loads(out) == json.loads(out_file.read_text())


def test_bandwidth_rows_are_in_gbit_per_s_and_say_formula_while_unfitted():
    cal = Calibration(bandwidth={"aws>gcp": Factor(4.2, 4.2, 5.1, 6, True),
                                 "inter-site": Factor.prior(1.0, 2)},
                      bandwidth_exponent=Factor(0.31, 0.25, 0.4, 8, True))
    rows = {row[0]: row[1:] for row in factor_rows(cal)}
    assert rows["bandwidth exponent"] == ("0.31", "0.25 - 0.40", "8", "fitted")
    assert rows["bandwidth aws>gcp"] == ("4.2 Gbit/s", "4.2 Gbit/s - 5.1 Gbit/s", "6", "fitted")
    assert rows["bandwidth inter-site"] == ("formula", "-", "2", "prior")
    assert rows["communication"] == ("1x", "-", "0", "prior")


def test_calibrate_without_data_is_a_one_line_error(tmp_path, capsys):
    empty = tmp_path / "empty.sqlite"
    Store(empty).close()
    code, out, err = run(capsys, "calibrate", "--db", empty)
    assert code == 2 and out == ""
    assert err.startswith(f"hulk-planner: no measured iterations in {empty}: ")
    assert err.count("\n") == 1


def test_plan_with_a_calibration_file_says_so_in_output_and_json(tmp_path, capsys):
    fleet = tmp_path / "fleet.json"
    f = lab_fleet()
    fleet.write_text(json.dumps({
        "nodes": [{"id": n.id, "gpus": n.gpus, "gpu_name": n.gpu_name, "memory_gb": n.memory_gb,
                   "site": n.site} for n in f.nodes],
        "links": [{"src": k.src, "dst": k.dst, "rtt_ms": k.rtt_ms} for k in f.links]}))
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text(JOBS_YAML)
    cal_file = tmp_path / "cal.json"
    cal_file.write_text(json.dumps(TRUE.to_json()))
    plan_file = tmp_path / "plan.json"
    code, out, err = run(capsys, "plan", jobs, "--fleet", fleet, "--method", "system-b",
                         "--calibration", cal_file, "--out", plan_file)
    assert code == 0, err
    assert f"cost model: calibrated ({cal_file})" in out
    assert "comparison (calibrated" in out and "makespan (reference)" in out
    assert json.loads(plan_file.read_text())["cost_model"] == f"calibrated ({cal_file})"
    assert read_plan(plan_file).method == "system-b"
    code, out, err = run(capsys, "plan", jobs, "--fleet", fleet, "--method", "system-b",
                         "--no-compare", "--cost-model", "reference")
    assert code == 0 and "cost model: reference" in out
    code, out, err = run(capsys, "plan", jobs, "--fleet", fleet, "--cost-model", "calibrated")
    assert code == 2 and err.startswith("hulk-planner: --cost-model: ")
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({**TRUE.to_json(), "communication": {"value": math.inf}}))
    code, out, err = run(capsys, "plan", jobs, "--fleet", fleet, "--calibration", bad)
    assert code == 2 and err == f"hulk-planner: {bad}: communication.value: expected a number " \
                                "from 0.001 to 1000, got inf\n"


def test_plan_from_a_store_with_calibration_data_defaults_to_calibrated(store_path, tmp_path,
                                                                          capsys):
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text(JOBS_YAML)
    code, out, err = run(capsys, "plan", jobs, "--db", store_path, "--method", "system-b",
                         "--no-compare")
    assert code == 0, err
    assert f"cost model: calibrated ({store_path})" in out
    code, out, err = run(capsys, "plan", jobs, "--db", store_path, "--method", "system-b",
                         "--no-compare", "--cost-model", "reference")
    assert code == 0 and "cost model: reference" in out


def test_throughput_tests_become_bandwidth_observations_against_the_formula():
    net = complete(lab_fleet())
    obs = bandwidth_observations({("site0", "site1"): (5.0, 3), ("site1", "site1"): (9.0, 2),
                                  ("elsewhere", "site0"): (1.0, 4)}, net)
    assert [(o.link_class, o.measured_gbps) for o in obs] == [("inter-site", 5.0),
                                                               ("intra-site", 9.0)]
    between = [net.rtt_ms[i, j] for i in range(net.n) for j in range(net.n)
               if (net.nodes[i].site, net.nodes[j].site) == ("site0", "site1")]
    assert obs[0].formula_gbps == pytest.approx(bandwidth_from_rtt(float(np.median(between)))
                                                / GBIT)
    assert obs[1].formula_gbps == pytest.approx(bandwidth_from_rtt(0.4) / GBIT)


def test_a_site_pair_with_no_rtt_is_left_out():
    f = lab_fleet()
    alone = Node("far", gpus=1, gpu_name="A100", memory_gb=40.0, site="site9")
    net = complete(Fleet((*f.nodes, alone), f.links))
    assert not np.isfinite(net.rtt_ms[0, net.index["far"]])
    obs = bandwidth_observations({("site0", "site9"): (2.5, 3), ("site0", "site1"): (5.0, 3)},
                                 net)
    assert [(o.link_class, o.measured_gbps) for o in obs] == [("inter-site", 5.0)]
