"""The calibrated cost model in serve: job records keep their placement's stages, the
calibration data reads them, the refit task fits the store and every planning network carries
the result; a store filled through its public methods, as serve fills it."""

from __future__ import annotations

import logging
import sqlite3
from dataclasses import replace

import numpy as np
import pytest

from hulk.errors import InputError
from hulk.wire.broker import plan_topic
from hulk.wire.placement import parse_summary
from hulk.wire.progress import StepProgress
from hulk.wire.records import LaunchState, LaunchStatus
from planner.core.calibration import Calibration, Factor, gpu_key
from planner.core.costmodel import Placement, Stage, estimate
from planner.core.fleet import Fleet, Link, Node, complete
from planner.core.jobs import Job
from planner.core.lifecycle import PLACED, RUNNING
from planner.core.placements import job_spec, placement_from_stages, stages_doc
from planner.methods import planner_for
from planner.service.calibration_data import calibration_data
from planner.service.calibration_refit import (ServeCalibration, add_to_runtime, describe,
                                               fitted_only, planned_with)
from planner.service.graph import fleet_from_store
from planner.service.job_records import record_pushed_plan
from planner.service.lifecycle import JobLifecycle
from planner.service.metrics import PlannerMetrics
from planner.service.publisher import InMemoryPublisher
from planner.service.recovery import Replanner
from planner.service.runtime import BackgroundTask
from planner.service.seams import ServeOptions, StoreDirectory
from planner.service.store import Store
from tests.helpers.plans import job as catalog_job, two_city_net
from tests.helpers.serve import OPTIONS, FakeNodes, current_plan, store_jobs
from tests.helpers.signing import VERIFIER

# A100s run at 0.5 of the reference throughput; V100s a little faster than it (not so much that
# the fit leaves their one job out as an outlier), but only one job measures them.
TRUE = Calibration(compute={"A100": Factor.prior(0.5), "V100": Factor.prior(1.04)})
NOW = 1_000_000


async def here(fn, *args, **kwargs):      # the store's thread, in a test: this one
    return fn(*args, **kwargs)


def small_job(name: str, layers: int = 12) -> Job:
    return Job(name, params=3e8, layers=layers, hidden=1024, seq_len=512, global_batch=64,
               micro_batch=2, steps=100)


def fleet() -> Fleet:
    """Four A100 servers (n0-n3) and two V100 servers (n4, n5) on two sites."""
    nodes = tuple(Node(f"n{i}", gpus=1, gpu_name="A100" if i < 4 else "V100", memory_gb=40.0,
                       site=f"site{i % 2}") for i in range(6))
    links = tuple(Link(a.id, b.id, rtt_ms=0.5 if a.site == b.site else 12.0, samples=10)
                  for i, a in enumerate(nodes) for b in nodes[i + 1:])
    return Fleet(nodes, links)


def reference_net(store: Store):
    return complete(fleet_from_store(store))


def place(store: Store, name: str, placement: Placement, net, *, stages: bool = True,
          estimate_s: float | None = None) -> list[str]:
    """A placed, running job's record as serve writes it (stages kept unless told)."""
    ids = [net.ids[i] for i in placement.nodes]
    record = store.submit_job(name, job_spec(placement.job))
    store.update_job(record.id, state=PLACED, plan_id=f"p-{name}", nodes=ids,
                     estimate_s=estimate(placement, net).job_s if estimate_s is None
                     else estimate_s, stages=stages_doc(placement, net) if stages else None)
    store.update_job(record.id, state=RUNNING)
    return ids


def report(store: Store, name: str, ids: list[str], iteration_s: float) -> None:
    """Every rank of job ``name`` reports ``iteration_s`` a step in its heartbeat."""
    for node in ids:
        store.heartbeat(node, launch=LaunchStatus(
            LaunchState.RUNNING, plan_id=f"p-{name}", job=name, progress=StepProgress(
                steps=60, total_steps=100, iteration_s=iteration_s,
                iteration_p90_s=iteration_s * 1.1, compute_s=0.0, communication_s=0.0,
                samples=50, updated_ms=1)))


# ---------------------------------------------------------------------------- stored stages

def test_stages_round_trip_through_the_job_record(tmp_path):
    with Store(tmp_path / "s.sqlite") as store:
        store.import_fleet(fleet())
        net = reference_net(store)
        # An uneven split no planner's balancing gives: only the kept stages can say it.
        p = Placement(small_job("a"), (Stage(0, 3, (net.index["n0"], net.index["n1"])),
                                       Stage(3, 12, (net.index["n2"], net.index["n3"]))), 4)
        place(store, "a", p, net)
        record = store.job_by_name("a")
        assert record.stages == {"micro_batch": 4, "stages": [[0, 2, ["n0", "n1"]],
                                                              [3, 11, ["n2", "n3"]]]}
        assert placement_from_stages(record.job, record.stages, net) == p
        store.update_job(record.id, nodes=["n4"])       # new nodes without stages: none kept
        assert store.job_by_name("a").stages is None
        record_pushed_plan(store, {"a": (job_spec(p.job), ["n0", "n1", "n2", "n3"],
                                         stages_doc(p, net))}, "p-push")   # plan --push
        assert placement_from_stages(p.job, store.job_by_name("a").stages, net) == p


def test_a_store_from_before_kept_stages_gains_the_column(tmp_path):
    path = tmp_path / "old.sqlite"
    with Store(path) as store:
        store.submit_job("a", job_spec(small_job("a")))
    conn = sqlite3.connect(path)
    conn.execute("ALTER TABLE jobs DROP COLUMN stages_json")      # as an older planner left it
    conn.commit()
    conn.close()
    with Store(path) as store:
        record = store.job_by_name("a")
        assert record.stages is None
        store.update_job(record.id, nodes=["n0"], stages={"micro_batch": 1,
                                                          "stages": [[0, 11, ["n0"]]]})
        assert store.job_by_name("a").stages["stages"] == [[0, 11, ["n0"]]]


def test_stored_stages_that_do_not_fit_the_job_are_refused_naming_the_field():
    net = complete(fleet())
    job = small_job("a")
    for doc, field in [({"micro_batch": 0, "stages": [[0, 11, ["n0"]]]}, "a.micro_batch"),
                       ({"micro_batch": 2, "stages": [[0, 5, ["n0"]]]}, "a.stages"),
                       ({"micro_batch": 2, "stages": [[0, 5, ["n0"]], [7, 11, ["n1"]]]},
                        "a.stages[1]"),
                       ({"micro_batch": 2, "stages": [[0, 11, ["gone"]]]}, "a.stages[0]")]:
        with pytest.raises(InputError) as err:
            placement_from_stages(job, doc, net)
        assert err.value.field == field


def test_calibration_data_uses_kept_stages_and_rebuilds_only_records_without(tmp_path):
    with Store(tmp_path / "s.sqlite") as store:
        store.import_fleet(fleet())
        net = reference_net(store)
        i = net.index
        uneven = Placement(small_job("uneven"), (Stage(0, 3, (i["n0"],)),
                                                 Stage(3, 12, (i["n1"],))), 4)
        # Its estimate is not the reference's (a calibrated plan's): no rebuild would match it.
        ids = place(store, "uneven", uneven, net, estimate_s=123.0)
        report(store, "uneven", ids, 0.5)
        balanced = Placement(small_job("old"), (Stage(0, 6, (i["n2"],)),
                                                Stage(6, 12, (i["n3"],))), 2)
        ids = place(store, "old", balanced, net, stages=False)   # placed before stages were kept
        report(store, "old", ids, 0.5)
        ids = place(store, "lost", Placement(small_job("lost"), uneven.stages, 4), net,
                    stages=False, estimate_s=123.0)
        report(store, "lost", ids, 0.5)
        data = calibration_data(store)
    by_name = {o.name.split("@")[0]: o.placement for o in data.observations}
    assert by_name["uneven"] == uneven          # exactly the kept stages, no guessing
    assert by_name["old"].stages == balanced.stages and by_name["old"].micro_batch == 2
    assert "lost" not in by_name
    assert [line.split(":")[0] for line in data.skipped] == ["lost@p-lost"]


async def test_the_lifecycle_keeps_the_stages_and_estimate_it_planned_with(tmp_path):
    reference = two_city_net(per_city=2)
    slow = Calibration(compute={gpu_key(reference.nodes[0]): Factor(0.5, 0.4, 0.6, 5, True)},
                       communication=Factor(3.0, 2.5, 3.5, 5, True))
    net = slow.apply(reference)                  # the calibrated network serve plans on
    store = Store(tmp_path / "s.sqlite")
    broker = InMemoryPublisher()
    nodes = FakeNodes(net, {n: NOW for n in net.ids})
    lifecycle = JobLifecycle(current_plan(broker), nodes, store_jobs(store), options=OPTIONS,
                             planner=planner_for("search"), clock_ms=lambda: NOW)
    store.submit_job("a", job_spec(catalog_job("a", "bert-large", ("python", "train.py"))))
    await lifecycle.run_once()
    record = store.job_by_name("a")
    summary = parse_summary(broker.retained[plan_topic("lab")], verifier=VERIFIER)
    [planned] = summary.jobs
    assert record.stages == {"micro_batch": planned.micro_batch,
                             "stages": [[lo, hi - 1, list(nodes)]
                                        for lo, hi, nodes in planned.stages]}
    # `jobs show` compares measured steps with the estimate the plan was made with.
    placement = placement_from_stages(record.job, record.stages, net)
    assert record.estimate_s == pytest.approx(estimate(placement, net).job_s)
    assert record.estimate_s > 1.5 * estimate(placement, reference).job_s
    # Recovery moves it off a silent node: the record keeps the new placement's stages.
    nodes.seen[record.nodes[0]] = NOW - 10_000
    replanner = Replanner(current_plan(broker), nodes, store_jobs(store), options=OPTIONS,
                          planner=planner_for("search"), clock_ms=lambda: NOW, started_ms=0)
    report = await replanner.run_once()
    moved = store.job_by_name("a")
    assert report.replanned == ["a"] and record.nodes[0] not in moved.nodes
    assert [n for _, _, ids in moved.stages["stages"] for n in ids] == list(moved.nodes)
    again = placement_from_stages(moved.job, moved.stages, net)
    assert moved.estimate_s == pytest.approx(estimate(again, net).job_s)
    store.close()


# ---------------------------------------------------------------------------- serve's refit

def fill(store: Store, net) -> None:
    """Four one-server jobs on the A100s, one on a V100, each reporting what TRUE gives."""
    truth = TRUE.apply(net)
    for k, node in enumerate(["n0", "n1", "n2", "n3", "n4"]):
        p = Placement(small_job(f"j{k}"), (Stage(0, 12, (net.index[node],)),), 2)
        ids = place(store, f"j{k}", p, net)
        report(store, f"j{k}", ids, estimate(p, truth).iteration_s)


async def test_refit_picks_up_progress_and_calibrates_only_gpus_with_evidence(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="planner.service.calibration_refit")
    metrics = PlannerMetrics()
    with Store(tmp_path / "s.sqlite") as store:
        store.import_fleet(fleet())
        serve_cal = ServeCalibration(store, here, events=metrics)
        directory = StoreDirectory(store, here, fleet="default", window_days=90,
                                   calibrate=serve_cal.apply)
        reference = reference_net(store)
        await serve_cal.refit()                       # nothing measured yet: the reference
        assert np.array_equal((await directory.network()).thr, reference.thr)
        fill(store, reference)
        cal = await serve_cal.refit()
        planning = await directory.network()
        await serve_cal.refit()                       # nothing new: nothing logged
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2 and "no factor fitted yet" in lines[0]
    assert lines[1].startswith("calibration: compute A100 0.5") and "V100" not in lines[1]
    assert cal.compute["A100"].fitted and not cal.compute["V100"].fitted
    assert cal.compute["V100"].runs == 1 and cal.outliers == ()
    a100 = [i for i, n in enumerate(reference.nodes) if n.gpu_name == "A100"]
    v100 = [i for i, n in enumerate(reference.nodes) if n.gpu_name == "V100"]
    assert planning.thr[a100] == pytest.approx(0.5 * reference.thr[a100], rel=0.02)
    assert np.array_equal(planning.thr[v100], reference.thr[v100])
    sample = metrics.registry.get_sample_value
    assert sample("hulk_calibration_factor", {"factor": "compute:A100"}) == \
        pytest.approx(0.5, rel=0.02)
    assert sample("hulk_calibration_factor", {"factor": "compute:V100"}) == 1.0
    assert sample("hulk_calibration_factor", {"factor": "communication"}) == 1.0
    assert sample("hulk_calibration_factor", {"factor": "hop_overhead_s"}) == 0.0
    assert sample("hulk_calibration_factor", {"factor": "micro_batch_overhead_s"}) == 0.0


def test_a_factor_moves_only_when_fitted():
    thin = Calibration(compute={"A100": Factor(0.7, 0.6, 0.8, 2, False),
                                "V100": Factor(1.3, 1.2, 1.4, 5, True)},
                       hop_overhead_s=Factor(0.01, 0.0, 0.02, 1, False),
                       micro_batch_overhead_s=Factor(0.003, 0.0, 0.005, 2, False),
                       communication=Factor(2.0, 1.5, 2.5, 1, False))
    kept = fitted_only(thin)
    assert kept.compute["A100"] == Factor.prior(1.0, 2) and kept.compute["V100"].value == 1.3
    assert kept.hop_overhead_s.value == 0.0 and kept.communication.value == 1.0
    assert kept.micro_batch_overhead_s == Factor.prior(0.0, 2)
    net = complete(fleet())
    v100 = [i for i, n in enumerate(net.nodes) if n.gpu_name == "V100"]
    a100 = [i for i, n in enumerate(net.nodes) if n.gpu_name == "A100"]
    planning = kept.apply(net)
    assert np.array_equal(planning.thr[a100], net.thr[a100])
    assert planning.thr[v100] == pytest.approx(1.3 * net.thr[v100])
    assert planning.hop_overhead_s == planning.micro_batch_overhead_s == 0.0
    assert np.array_equal(planning.bw, net.bw)


class Runtime:
    """What add_to_runtime needs of serve's PlannerRuntime."""

    def __init__(self, store: Store):
        self.store, self.in_store, self.window_days = store, here, 90
        self.tasks: list[BackgroundTask] = []

    def add_task(self, task: BackgroundTask) -> None:
        self.tasks.append(task)


def test_interval_zero_keeps_the_reference_model(tmp_path):
    with Store(tmp_path / "s.sqlite") as store:
        store.import_fleet(fleet())
        fill(store, reference_net(store))
        runtime = Runtime(store)
        assert add_to_runtime(runtime, ServeOptions(calibration_interval_s=0)) is None
        assert runtime.tasks == []
        on = add_to_runtime(runtime, ServeOptions(calibration_interval_s=30))
        [task] = runtime.tasks
        assert (task.name, task.interval_s, task.run_at_start) == ("calibration", 30, True)
        assert on.calibration is None
        net = reference_net(store)
        assert on.apply(net) is net            # before the first fit: the reference network


def test_serve_flag_reaches_the_options_and_is_checked():
    from hulk.errors import ConfigError
    from planner.cli import build_parser
    from planner.commands.serve import check_flags, serve_options
    from planner.settings import PlannerSettings

    def parsed(*flags):
        return build_parser(PlannerSettings(), "serve").parse_args(
            ["serve", "--db", "x.sqlite", "--insecure", *flags])

    runtime = type("R", (), {"fleet": "default"})()
    assert serve_options(runtime, parsed()).calibration_interval_s == 600.0
    off = parsed("--calibration-interval", "0")
    check_flags(off)
    assert serve_options(runtime, off).calibration_interval_s == 0
    with pytest.raises(ConfigError) as err:
        check_flags(parsed("--calibration-interval", "-5"))
    assert err.value.field == "--calibration-interval"


def test_a_change_of_the_bandwidth_exponent_alone_is_a_change_serve_logs():
    base = Calibration(compute={}, bandwidth={"inter-site": Factor(2.0, 1.8, 2.2, 5, True)},
                       hop_overhead_s=Factor.prior(0.0), communication=Factor.prior(1.0))
    fitted = replace(base, bandwidth_exponent=Factor(0.3, 0.25, 0.35, 9, True))
    assert planned_with(base) != planned_with(fitted)
    assert "bandwidth exponent 0.3" in describe(fitted)
    assert "bandwidth exponent" not in describe(base)
