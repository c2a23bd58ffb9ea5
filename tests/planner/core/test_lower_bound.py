"""The lower bound: never above a plan the cost model scores (every planner's, and the true
optimum of tiny instances found by brute force), and above the compute bound where
communication or memory cannot be avoided."""

from __future__ import annotations

import dataclasses
import itertools
import math

import numpy as np
import pytest

from planner.core import costmodel as cm
from planner.core.costmodel import Placement, Stage
from planner.core.evaluate import evaluate
from planner.core.fleet import Network, Node, complete
from planner.core.generate import generate_fleet, generate_jobs
from planner.core.jobs import Job
from planner.core import lower_bound as lower_bound_module
from planner.core.lower_bound import LowerBound, area_bound_s, lower_bound
from planner.methods import planner_for
from tests.helpers.brute_force import set_partitions

REL = 1e-9   # the bound and the model sum the same terms in other orders
GPUS = ("NVIDIA A100-SXM4-40GB", "Tesla V100-SXM2-32GB", "NVIDIA GeForce RTX 3090")


def tiny_network(rng: np.random.Generator, n: int, overheads: bool = False) -> Network:
    """``n`` one-GPU servers in two or three cities, RTTs of a few to a hundred ms."""
    cities = ["Tokyo", "Paris", "Denver"][: int(rng.integers(1, 4))]
    nodes = [Node(id=f"n{i}", city=cities[i % len(cities)], gpus=1,
                  gpu_name=GPUS[int(rng.integers(len(GPUS)))],
                  memory_gb=float(rng.choice([16.0, 24.0, 40.0])))
             for i in range(n)]
    rtt = rng.uniform(1.0, 100.0, size=(n, n))
    rtt = np.triu(rtt, 1) + np.triu(rtt, 1).T
    for i, j in itertools.product(range(n), repeat=2):
        if nodes[i].city == nodes[j].city and i != j:
            rtt[i, j] = 0.5
    net = Network.from_matrix(nodes, rtt)
    if overheads:
        net = dataclasses.replace(net, hop_overhead_s=0.002, micro_batch_overhead_s=0.001)
    return net


def tiny_job(rng: np.random.Generator, name: str) -> Job:
    """A job of 2-3 layers whose state needs from a third of a server to two servers."""
    return Job(name=name, params=float(rng.uniform(0.4e9, 4.5e9)), layers=int(rng.integers(2, 4)),
               hidden=int(rng.choice([1024, 8192, 65536])), seq_len=int(rng.choice([512, 4096])),
               global_batch=int(rng.integers(1, 5)), micro_batch=1, steps=10)


def job_options(job: Job, net: Network) -> dict[frozenset, float]:
    """Every placement of ``job`` (any node grid, layer split and micro-batch): the least
    job time of each node set."""
    best: dict[frozenset, float] = {}
    for size in range(1, net.n + 1):
        for order in itertools.permutations(range(net.n), size):
            for k in (k for k in range(1, min(size, job.layers) + 1) if size % k == 0):
                d = size // k
                rows = [order[r * d:(r + 1) * d] for r in range(k)]
                for cuts in itertools.combinations(range(1, job.layers), k - 1):
                    bounds = (0, *cuts, job.layers)
                    stages = tuple(Stage(bounds[r], bounds[r + 1], tuple(rows[r]))
                                   for r in range(k))
                    for b in range(1, job.global_batch + 1):
                        p = Placement(job, stages, b)
                        e = cm.estimate(p, net)
                        if e.feasible:
                            key = frozenset(order)
                            best[key] = min(best.get(key, math.inf), e.job_s)
    return best


def phase_time(block: list[int], options: list[dict[frozenset, float]], used=frozenset()) -> float:
    """Least max job time of the jobs of ``block`` side by side on disjoint node sets."""
    if not block:
        return 0.0
    head, rest = block[0], block[1:]
    out = math.inf
    for nodes, t in options[head].items():
        if not nodes & used and t < out:
            out = min(out, max(t, phase_time(rest, options, used | nodes)))
    return out


def optimum(jobs: list[Job], net: Network) -> float:
    options = [job_options(j, net) for j in jobs]
    if any(not o for o in options):
        return math.inf
    return min(sum(phase_time(block, options) for block in part)
               for part in set_partitions(list(range(len(jobs)))))


@pytest.mark.parametrize("exact_counts", [16, 0])
def test_bound_is_at_most_the_brute_force_optimum(exact_counts, monkeypatch):
    """Over seeded tiny instances (two or three servers, up to three jobs, with and without a
    calibrated model's overheads), the bound never exceeds the optimum; and enough instances are
    both plannable and decided by more than the compute bound that the check means something.
    With ``exact_counts`` 0 every replica and micro-batch count is judged in ranges."""
    monkeypatch.setattr(lower_bound_module, "EXACT_COUNT", exact_counts)
    monkeypatch.setattr(lower_bound_module, "RANGE_GROWTH", 2.0 if exact_counts == 0 else 1.25)
    plannable = above = 0
    for seed in range(150):
        rng = np.random.default_rng([29, seed])
        net = tiny_network(rng, int(rng.integers(2, 4)), overheads=seed % 3 == 0)
        jobs = [tiny_job(rng, f"j{i}") for i in range(int(rng.integers(1, 4)))]
        best = optimum(jobs, net)
        if not math.isfinite(best):   # some job fits no placement: no plan to bound
            continue
        bound = lower_bound(jobs, net)
        compute = cm.compute_bound_s(jobs, net)
        assert compute * (1 - REL) <= bound.seconds <= best * (1 + REL), (seed, bound, best)
        plannable += 1
        above += bound.seconds > 1.01 * compute
    assert plannable >= 60
    assert above >= 20


PLANNERS = {"search": {}, "portfolio": {"starts": 2, "workers": 1}, "system-a": {},
            "system-b": {}, "dtfm": {}}


@pytest.mark.parametrize("seed", range(5))
def test_bound_is_at_most_every_planners_makespan(seed):
    rng = np.random.default_rng([2929, seed])
    n = int(rng.integers(3, 13))
    net = complete(generate_fleet(n, seed=seed))
    if seed % 2:
        net = dataclasses.replace(net, hop_overhead_s=0.01, micro_batch_overhead_s=0.002)
    jobs = generate_jobs(int(rng.integers(1, 6)), seed=seed, max_params=20e9)
    bound = lower_bound(jobs, net)
    judged = 0
    for method, options in PLANNERS.items():
        report = evaluate(planner_for(method)(jobs, net, seed=0, **options), net)
        if report.complete:
            judged += 1
            assert bound.seconds <= report.makespan_s * (1 + REL), (method, report.makespan_s)
    assert judged >= 2


def test_bound_is_at_most_plans_that_use_many_replicas():
    """70 servers: System A's replicas (every server holding the model) and the search's wide
    groups fall in the replica counts the bound judges in ranges."""
    net = complete(generate_fleet(70, seed=11))
    jobs = generate_jobs(4, seed=11, max_params=3e9)
    bound = lower_bound(jobs, net)
    replicas = 0
    for method in ("search", "system-a", "system-b"):
        plan = planner_for(method)(jobs, net, seed=0)
        report = evaluate(plan, net)
        assert report.complete
        assert bound.seconds <= report.makespan_s * (1 + REL), (method, bound, report.makespan_s)
        replicas = max(replicas, max(p.replicas for p in plan.placements))
    assert replicas > lower_bound_module.EXACT_COUNT
    assert bound.seconds > cm.compute_bound_s(jobs, net)


def test_memory_forces_pipelines_across_sites():
    """A model larger than any site: every replica's pipeline crosses a slow link, so the bound
    counts that hop, above the compute bound."""
    nodes = [Node(id=f"n{i}", city=city, gpus=1, gpu_name=GPUS[0], memory_gb=40.0)
             for i, city in enumerate(["Tokyo", "Tokyo", "Paris", "Paris"])]
    rtt = np.array([[0, 0.5, 200, 200], [0.5, 0, 200, 200], [200, 200, 0, 0.5],
                    [200, 200, 0.5, 0]], dtype=float)
    net = Network.from_matrix(nodes, rtt)
    job = Job(name="big", params=7e9, layers=8, hidden=4096, seq_len=2048, global_batch=64,
              micro_batch=1, steps=10)     # 112 GB of state: more than a site's 80 GB
    bound = lower_bound([job], net)
    # all but the first micro-batch's activations cross the 200 ms link (the first is counted
    # on the best link)
    cross = cm.hop_s(200.0, float(net.bw[0, 2]), job.activation_bytes(1) * (job.global_batch - 1))
    assert bound.seconds >= 0.99 * job.steps * cross
    assert bound.seconds > 3 * cm.compute_bound_s([job], net)


def test_jobs_that_cannot_share_a_phase_add_up():
    """Two jobs each needing most of the fleet's memory run one after the other."""
    nodes = [Node(id=f"n{i}", city="Tokyo", gpus=1, gpu_name=GPUS[0], memory_gb=40.0)
             for i in range(4)]
    net = Network.from_matrix(nodes, np.full((4, 4), 0.5))
    jobs = [Job(name=f"j{i}", params=6e9, layers=8, hidden=1024, seq_len=512, global_batch=16,
                steps=10) for i in range(2)]   # 96 GB each; the fleet has 160 GB
    bound = lower_bound(jobs, net)
    assert bound.seconds == pytest.approx(sum(bound.job_alone_s.values()))
    assert bound.binding.startswith("phases (")


def test_lab_fleet_bound_is_above_the_compute_bound():
    """The WAN lab's five servers: the bound sees llama-7b's communication."""
    from planner.files.fleet import load_fleet_with_report
    from planner.files.jobs import load_jobs

    net = complete(load_fleet_with_report("examples/fleets/lab-5.json")[0])
    jobs = load_jobs("examples/jobs.yaml")
    bound = lower_bound(jobs, net)
    assert bound.seconds > 1.05 * cm.compute_bound_s(jobs, net)
    assert bound.parts["compute"] == cm.compute_bound_s(jobs, net)


def test_gap_and_edge_cases():
    bound = LowerBound(100.0, "compute", {"compute": 100.0})
    assert bound.gap(150.0) == pytest.approx(0.5)
    assert bound.gap(100.0 * (1 - 1e-12)) == 0.0
    assert bound.gap(math.inf) is None
    assert LowerBound(0.0, "compute").gap(10.0) is None
    assert area_bound_s([], 1.0) == math.inf
    empty = lower_bound([], complete(generate_fleet(3, seed=1)))
    assert empty.seconds == 0.0


def test_plan_file_carries_the_bound_and_reads_files_without_it(tmp_path):
    from hulk.errors import InputError
    from planner.files.plan import parse_plan, plan_to_json, read_plan, write_plan

    net = complete(generate_fleet(6, seed=3))
    jobs = generate_jobs(2, seed=3, max_params=3e9)
    plan = planner_for("system-b")(jobs, net)
    report = evaluate(plan, net)
    bound = lower_bound(jobs, net)
    path = tmp_path / "plan.json"
    write_plan(plan, net, path, report, lower_bound=bound)
    doc = read_plan(path)
    assert doc.lower_bound["binding"] == bound.binding
    assert doc.lower_bound["seconds"] == pytest.approx(bound.seconds)
    assert doc.lower_bound["gap"] == pytest.approx(bound.gap(report.makespan_s), abs=1e-6)
    assert parse_plan(plan_to_json(plan, net, report)).lower_bound is None   # as before
    bad = plan_to_json(plan, net, report, lower_bound=bound)
    bad["lower_bound"]["binding"] = 7
    with pytest.raises(InputError, match="lower_bound.binding"):
        parse_plan(bad, "plan.json")


def test_plan_prints_the_gap():
    from rich.console import Console

    from planner.commands.plan import MethodResult, print_lower_bound

    net = complete(generate_fleet(5, seed=4))
    jobs = generate_jobs(2, seed=4, max_params=3e9)
    plan = planner_for("system-b")(jobs, net)
    report = evaluate(plan, net)
    console = Console(record=True, width=200)
    bound = print_lower_bound(console, jobs, net, MethodResult("system-b", plan, report, 0.0))
    text = console.export_text()
    assert text.startswith("lower bound: ") and f"({bound.binding})" in text
    assert f"at most {bound.gap(report.makespan_s):.0%} above the optimum" in text
