"""The DiLoCo lab benchmark's pure parts: the two continents, the planner's view of them, the
DiLoCo placement and its estimate, the throughput fitted on the step run (no lab, no training)."""

from __future__ import annotations

import pytest

import bench.diloco_lab_bench as B
from lab.train import JobRun, NodeRun
from planner.core.costmodel import estimate, problems
from planner.core.fleet import GBIT

GBPS = {("east", "east"): 0.4, ("west", "west"): 0.4, ("east", "west"): 0.0038, ("west", "east"): 0.0038}


def test_two_continents_behind_a_slow_link_fit_the_machine():
    hosts = B.TOPOLOGY.hosts()
    assert [h for h, _ in hosts] == ["east-1", "east-2", "west-1", "west-2"]
    assert sum(site.cores for _, site in hosts) < 1.5
    m = B.TOPOLOGY.matrix()
    assert m.rtt(0, 2) >= 100 and m.rtt(0, 1) == 1.0
    assert B.TOPOLOGY.rates()[("east-1", "west-2")] == B.WAN[1]


def test_the_diloco_placement_has_one_island_per_continent_and_a_priced_outer_sync():
    job = B.the_job(40)
    net = B.lab_network(job, GBPS)
    i, j = net.index["east-1"], net.index["west-1"]
    assert net.bw[i, j] == pytest.approx(0.0038 * GBIT) and net.rtt_ms[i, j] == B.WAN[0]
    p = B.diloco_placement(job, net, 20, "int8", 1)
    assert problems(p, net) == [] and p.island_sizes() == (2, 2)
    assert [net.ids[n] for n in p.stages[0].nodes] == ["east-1", "east-2", "west-1", "west-2"]
    e = estimate(p, net)
    # The int8 outer all-reduce between the two islands: P bytes each way over the slow link.
    assert e.outer_sync_s == pytest.approx(job.params / (0.0038 * GBIT), rel=0.2)
    assert e.iteration_s < e.outer_sync_s


def test_the_jobs_are_priced_at_train_gpts_fp32_and_the_outer_exchange_at_int8():
    from dataclasses import replace

    from planner.core.costmodel import gradient_bytes, pseudo_gradient_bytes

    net = B.lab_network(B.the_job(40), GBPS)
    step_p = B.Placement(B.the_job(40), (B.Stage(0, B.LAYERS, (net.index["west-1"],
                                                               net.index["west-2"])),), 1)
    placements = [*B.calibration_placements(step_p, net), B.every_host_step_placement(
        B.the_job(12), net, 1), B.diloco_placement(B.the_job(40), net, 20, "int8", 1)]
    assert {(p.job.gradient_dtype, p.job.activation_dtype)
            for p in placements} == {("fp32", "fp32")}
    job = B.the_job(40)
    assert gradient_bytes(job, B.LAYERS) == 4 * job.params
    assert pseudo_gradient_bytes(job, B.LAYERS, "int8") == job.params
    # The run over both continents: its all-reduce over the slow link at 4 bytes a gradient.
    wide = B.every_host_step_placement(job, net, 1)
    fp16 = replace(wide, job=replace(job, gradient_dtype="fp16", activation_dtype="fp16"))
    latency = 2 * (4 - 1) * B.WAN[0] / 2000      # 2 (D - 1) a_max: the bytes' part doubles
    assert estimate(wide, net).allreduce_s - latency == pytest.approx(
        2 * (estimate(fp16, net).allreduce_s - latency))
    dil = B.diloco_placement(job, net, 20, "int8", 1)
    assert estimate(dil, net).outer_sync_s == estimate(replace(dil, job=fp16.job), net).outer_sync_s


def test_the_throughput_fitted_on_one_run_reproduces_that_run():
    job = B.the_job(40)
    net = B.lab_network(job, GBPS)
    p = B.diloco_placement(job, net, 20, "int8", 1)
    measured = estimate(p, net).iteration_s * 1.7
    fitted, factor = B.fitted_network(net, p, measured)
    assert estimate(p, fitted).iteration_s == pytest.approx(measured, rel=1e-6)
    assert factor < 1 and (net.thr == B.lab_network(job, GBPS).thr).all()   # net untouched


def test_figures_average_the_replicas_and_count_outer_steps():
    def node(replica, steps, loss, end, outer=""):
        return NodeRun(f"h{replica}", replica, 0, replica, 0, outer, step_s=steps, loss=loss,
                       end_s=end)

    # Node 1 is slower in step 3; node 0 waits for it in its outer step 4, which the per-step
    # maximum counts again (1 + 2 + 3) where the wall clock does not (9 -> 14: 5 s, 3 steps).
    run = JobRun([node(0, [9.0, 1.0, 1.0, 3.0], [4.0, 3.0, 2.0, 1.0], [9.0, 10.0, 11.0, 14.0],
                       "step 4/4 stage 0 replica 0 time 3.000s loss 1.0 outer 1 2.000s"),
                  node(1, [9.0, 1.0, 2.0, 1.0], [2.0, 1.0, 2.0, 3.0], [9.0, 10.0, 12.0, 13.9])])
    f = B.figures(run, skip=1)
    assert f["iteration_s"] == pytest.approx(5.0 / 3)
    assert f["step_max_mean_s"] == pytest.approx(2.0)         # mean of 1, 2, 3
    assert f["tokens_per_s"] == pytest.approx(B.GLOBAL_BATCH * B.SEQ_LEN / (5.0 / 3))
    assert f["loss"] == [3.0, 2.0, 2.0, 2.0] and f["final_loss"] == 2.0
    assert f["outer_syncs"] == 1 and f["outer_sync_s"] == [2.0]


def test_each_node_gets_its_island_from_the_planners_roles():
    job = B.the_job(40)
    net = B.lab_network(job, GBPS)
    env_for = B.diloco_env(B.diloco_placement(job, net, 20, "int8", 1), net)
    assert [env_for(0, r)["HULK_ISLAND"] for r in range(4)] == ["0", "0", "1", "1"]
    assert env_for(0, 3) | {"HULK_ISLAND": "x"} == {
        "HULK_SYNC": "diloco", "HULK_INNER_STEPS": "20", "HULK_OUTER_COMPRESSION": "int8",
        "HULK_STREAMING_FRAGMENTS": "0", "HULK_ISLAND": "x", "HULK_NUM_ISLANDS": "2"}


def test_outer_phases_split_the_leaders_wait_from_the_exchange():
    def line(total, exchange, broadcast, enter):
        return (f"step 20/20 stage 0 replica 0 time 1.0s outer 1 {total}s exchange {exchange}s "
                f"broadcast {broadcast}s enter {enter}")

    # Leader a arrives 1.5 s before leader b, waits in its all_gather, b's exchange is the
    # transfer alone; c (a's island mate) waits in its broadcast for both.
    run = JobRun([NodeRun("a", 0, 0, 0, 0, line(3.6, 3.5, 0.1, 100.0)),
                  NodeRun("b", 1, 0, 1, 0, line(2.1, 2.0, 0.1, 101.5)),
                  NodeRun("c", 2, 0, 2, 0, line(3.7, 0.0, 3.65, 100.0))])
    [got] = B.outer_phases(run, {"a", "b"})
    assert got["round"] == 1 and got["wait_s"] == pytest.approx(1.5)
    assert got["exchange_s"] == 2.0 and got["broadcast_s"] == 3.65 and got["total_s"] == 3.7


def test_the_calibration_runs_recover_a_step_overhead_none_of_them_the_diloco_run():
    from planner.core.calibration import Calibration, Factor

    job = B.the_job(40)
    net = B.lab_network(job, GBPS)
    step_p = B.Placement(job, (B.Stage(0, B.LAYERS, (net.index["west-1"], net.index["west-2"])),), 1)
    placements = B.calibration_placements(step_p)
    assert all(p.outer is None for p in placements)
    assert {p.replicas for p in placements} == {1, 2}
    truth = Calibration(compute={"lab-cpu-30": Factor.prior(1.3)},
                        step_overhead_s=Factor.prior(0.19))
    runs = [{"iteration_s": estimate(p, truth.apply(net)).iteration_s} for p in placements]
    cal = B.calibrated(placements, net, runs)
    # The step placement's runs alone, their all-reduce the same at every batch: communication
    # held at 1, else it could stand in for the step overhead.
    assert cal.step_overhead_s.fitted and not cal.communication.fitted
    one_host = B.calibrated(placements, net, runs, one_host=True)
    assert one_host.step_overhead_s.value == pytest.approx(0.19, rel=0.02)
    assert cal.step_overhead_s.value == pytest.approx(0.19, rel=0.02)
    assert cal.compute["lab-cpu-30"].value == pytest.approx(1.3, rel=0.02)
    dil = B.diloco_placement(job, net, 20, "int8", 1)
    assert estimate(dil, cal.apply(net)).iteration_s == pytest.approx(
        estimate(dil, truth.apply(net)).iteration_s, rel=0.01)
    assert B.calibration_json(cal)["step_overhead_s"]["value"] == cal.step_overhead_s.value


def test_a_calibration_run_over_the_slow_link_fits_the_communication_factor():
    from planner.core.calibration import Calibration, Factor

    job = B.the_job(40)
    net = B.lab_network(job, GBPS)
    step_p = B.Placement(job, (B.Stage(0, B.LAYERS, (net.index["west-1"], net.index["west-2"])),), 1)
    placements = B.calibration_placements(step_p, net)
    wide = placements[-1]
    assert wide.replicas == 4 and wide.outer is None
    assert wide.job.steps == B.CALIBRATION_EVERY_HOST_STEPS and B.warmup_steps(wide) == B.EVERY_HOST_SKIP
    # Training's transfers at half the throughput tests' rate (TCP's shortfall over the slow
    # link, say), a per-step cost and slower cores.
    truth = Calibration(compute={"lab-cpu-30": Factor.prior(1.3)},
                        step_overhead_s=Factor.prior(0.09), communication=Factor.prior(2.0))
    runs = [{"iteration_s": estimate(p, truth.apply(net)).iteration_s} for p in placements]
    cal = B.calibrated(placements, net, runs)
    assert cal.communication.fitted and cal.communication.value == pytest.approx(2.0, rel=0.02)
    assert cal.step_overhead_s.value == pytest.approx(0.09, rel=0.05)
    dil = B.diloco_placement(job, net, 20, "int8", 1)
    assert estimate(dil, cal.apply(net)).iteration_s == pytest.approx(
        estimate(dil, truth.apply(net)).iteration_s, rel=0.01)
    # Without the run over the slow link the factor cannot be told apart: held at 1.
    alone = B.calibrated(placements[:-1], net, runs[:-1])
    assert not alone.communication.fitted


def test_diloco_calibration_runs_fit_the_outer_sync_factor():
    """The judged placement at small H prices its outer sync: an outer sync taking 1.7x its
    price (both directions of the slow link at once, quantisation under the quota), which no
    step run shows, is recovered, and with it the judged run at H = 20."""
    from planner.core.calibration import Calibration, Factor

    job = B.the_job(40)
    net = B.lab_network(job, GBPS)
    step_p = B.Placement(job, (B.Stage(0, B.LAYERS, (net.index["west-1"], net.index["west-2"])),), 1)
    dil = B.diloco_placement(job, net, 20, "int8", 1)
    placements = B.calibration_placements(step_p, net, dil_p=dil)
    outer = [p for p in placements if p.outer is not None]
    assert [p.outer.inner_steps for p in outer] == list(B.DILOCO_CALIBRATION_H)
    assert all(p.job.steps == p.outer.inner_steps * (1 + B.DILOCO_CALIBRATION_ROUNDS)
               and B.warmup_steps(p) == p.outer.inner_steps and p.islands == dil.islands
               for p in outer)
    truth = Calibration(compute={"lab-cpu-30": Factor.prior(1.2)},
                        step_overhead_s=Factor.prior(0.09), communication=Factor.prior(1.07),
                        outer_sync=Factor.prior(1.7))
    runs = [{"iteration_s": estimate(p, truth.apply(net)).iteration_s} for p in placements]
    cal = B.calibrated(placements, net, runs)
    assert cal.outer_sync.fitted and cal.outer_sync.runs == len(outer)
    assert cal.outer_sync.value == pytest.approx(1.7, rel=0.02)
    assert estimate(dil, cal.apply(net)).iteration_s == pytest.approx(
        estimate(dil, truth.apply(net)).iteration_s, rel=0.01)
    # Without them the factor stays at its prior, and the judged run is priced under.
    without = B.calibrated(placements, net, runs, outer_runs=False)
    assert not without.outer_sync.fitted and without.outer_sync.value == 1.0
    assert estimate(dil, without.apply(net)).iteration_s < 0.95 * estimate(
        dil, truth.apply(net)).iteration_s
    assert B.calibration_json(cal)["outer_sync"]["value"] == cal.outer_sync.value
