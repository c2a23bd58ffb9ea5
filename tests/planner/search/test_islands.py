"""Islands for low-communication jobs (planner.search.islands): where the search puts a
``sync: diloco`` or ``sync: auto`` job, and which H and compression ``auto`` picks."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from planner.core.costmodel import estimate, estimate_plan, problems
from planner.core.fleet import Network, Node
from planner.core.generate import generate_jobs, generate_network
from planner.core.jobs import COMPRESSION_BYTES, Sync, catalog_job
from planner.core.plan import Plan
from planner.search import exact, plan_search
from planner.search.clusters import network_clusters
from planner.search.groups import solve_group
from planner.search.islands import (fastest_setting, islands_of, outer_settings, step_twin,
                                    uses_islands, with_islands)
from planner.search.options import Effort
from planner.search.portfolio_run import run_baseline
from planner.search.state import SearchRun
from tests.helpers.plan_checks import assert_valid

AUTO = Sync("auto", 500, ("none", "bf16", "int8"))


def two_continents(per_site: int = 6, wan_ms: float = 200.0) -> Network:
    """Two sites of ``per_site`` 8-A100 servers, 1 ms inside a site, ``wan_ms`` between."""
    nodes = [Node(id=f"{'east' if i < per_site else 'west'}-{i}",
                  city="east" if i < per_site else "west", gpus=8, gpu_name="A100",
                  memory_gb=640.0) for i in range(2 * per_site)]
    site = np.array([0] * per_site + [1] * per_site)
    return Network.from_matrix(nodes, np.where(site[:, None] == site[None, :], 1.0, wan_ms))


def one_site(n: int = 6) -> Network:
    nodes = [Node(id=f"n{i}", city="east", gpus=8, gpu_name="A100", memory_gb=640.0)
             for i in range(n)]
    return Network.from_matrix(nodes, np.ones((n, n)))


def job13(name: str = "big", sync: Sync = Sync()):
    return dataclasses.replace(catalog_job("gpt3-13b"), name=name, sync=sync)


def _site(net: Network, nodes) -> set[str]:
    return {net.nodes[i].city for i in nodes}


def test_a_diloco_job_spans_both_continents_and_beats_the_best_step_plan():
    net = two_continents()
    diloco = job13(sync=Sync("diloco", 500, ("int8",)))
    plan = plan_search([diloco], net)
    assert_valid(plan, net, [diloco])
    (p,) = plan.placements
    assert p.outer is not None and p.outer.inner_steps == 500 and p.outer.compression == "int8"
    assert len(p.islands) >= 2 and sum(p.islands) == p.replicas
    sites = [_site(net, island) for island in islands_of(p)]
    assert all(len(s) == 1 for s in sites)          # an island stays in its continent
    assert set().union(*sites) == {"east", "west"}  # and both continents are used
    step = plan_search([step_twin(diloco)], net)
    assert estimate(p, net).job_s < estimate(step.placements[0], net).job_s
    assert estimate(p, net).outer_sync_s > 0


def test_auto_spreads_over_continents_within_the_users_limits():
    net = two_continents()
    plan = plan_search([job13(sync=AUTO)], net)
    (p,) = plan.placements
    assert p.outer is not None and len(p.islands) == 2
    assert p.outer.inner_steps <= 500 and p.outer.compression in AUTO.compressions
    assert problems(p, net) == []


def test_auto_picks_step_on_a_single_site_fleet():
    net = one_site()
    auto = job13(sync=AUTO)
    (p,) = plan_search([auto], net).placements
    assert p.outer is None and p.islands == ()
    step = plan_search([step_twin(auto)], net).placements[0]
    assert estimate(p, net) == estimate(step, net)
    assert p.stages == step.stages


def test_diloco_on_a_single_site_is_one_island():
    net = one_site()
    (p,) = plan_search([job13(sync=Sync("diloco", 50, ("bf16",)))], net).placements
    assert p.outer is not None and p.islands == (p.replicas,)
    assert estimate(p, net).outer_sync_s == 0.0
    assert problems(p, net) == []


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_auto_never_leaves_the_users_limits(seed):
    """Random limits (fixed seeds): the chosen H is at most the user's, the compression one of
    those allowed, and the choice is the fastest the limits allow."""
    rng = np.random.default_rng(seed)
    net = two_continents(per_site=3, wan_ms=150.0)
    run = SearchRun([], net)
    nodes = np.arange(net.n)
    for _ in range(4):
        comps = tuple(c for c in COMPRESSION_BYTES if rng.random() < 0.6) or ("none",)
        sync = Sync("auto", int(rng.integers(1, 2000)), comps, int(rng.choice([0, 0, 4])))
        job = job13(sync=sync)
        step = run.solve(step_twin(job), nodes)
        p, e = with_islands(job, net, nodes, run.labels, step)
        if p.outer is None:
            continue
        assert 1 <= p.outer.inner_steps <= sync.inner_steps
        assert p.outer.compression in comps
        assert p.outer.streaming_fragments == sync.streaming_fragments
        best = min(estimate(dataclasses.replace(p, outer=o), net).job_s
                   for o in outer_settings(sync))
        assert e.job_s <= best * (1 + 1e-9)


def test_outer_settings_are_the_users_for_diloco_and_within_limits_for_auto():
    assert outer_settings(Sync("diloco", 70, ("bf16",))) == [
        fastest_setting(Sync("diloco", 70, ("bf16",)))]
    auto = outer_settings(Sync("auto", 70, ("int8", "none")))
    assert {o.inner_steps for o in auto} == {1, 2, 5, 10, 20, 50, 70}
    assert {o.compression for o in auto} == {"int8", "none"}
    assert auto[0].compression == "none" and auto[0].inner_steps == 1   # mildest first
    fast = fastest_setting(Sync("auto", 70, ("int8", "none")))
    assert (fast.inner_steps, fast.compression) == (70, "int8")


def test_streaming_lets_auto_take_a_smaller_h_that_hides_the_outer_sync():
    net = two_continents(per_site=3, wan_ms=150.0)
    run = SearchRun([], net)
    nodes = np.arange(net.n)
    job = job13(sync=Sync("auto", 5000, ("bf16",), streaming_fragments=8))
    p, e = with_islands(job, net, nodes, run.labels, run.solve(step_twin(job), nodes))
    assert p.outer is not None
    largest = estimate(dataclasses.replace(p, outer=fastest_setting(job.sync)), net)
    assert e.job_s <= largest.job_s * (1 + 1e-9)
    assert p.outer.inner_steps < 5000   # the mildest H with the same time


def test_a_diloco_job_and_a_step_job_get_disjoint_nodes():
    net = two_continents(per_site=8)
    jobs = [job13("d", Sync("diloco", 100, ("bf16",))),
            dataclasses.replace(catalog_job("gpt3-2.7b"), name="s")]
    plan = plan_search(jobs, net)
    assert_valid(plan, net, jobs)
    by = {p.job.name: p for p in plan.placements}
    assert by["d"].outer is not None and by["s"].outer is None and by["s"].islands == ()
    same_phase = by["d"].phase == by["s"].phase
    assert not same_phase or not set(by["d"].nodes) & set(by["s"].nodes)
    assert all(problems(p, net) == [] for p in plan.placements)


def test_step_jobs_never_reach_the_island_search():
    net = generate_network(40, seed=3)
    jobs = generate_jobs(3, seed=3)
    assert not any(uses_islands(j) for j in jobs)
    plan = plan_search(jobs, net)
    assert all(p.outer is None and p.islands == () for p in plan.placements)
    run = SearchRun(jobs, net)
    nodes = np.arange(net.n)
    assert run.solve(jobs[0], nodes) == solve_group(jobs[0], net, nodes, Effort.FAST, None,
                                                    network_clusters(net))


def test_the_exact_search_and_synchronous_baselines_leave_diloco_jobs_alone():
    net = two_continents(per_site=3)
    diloco = job13(sync=Sync("diloco", 100, ("bf16",)))
    assert not exact.applies([diloco], net)
    assert exact.applies([step_twin(diloco)], net)
    step_plan = plan_search([step_twin(diloco)], net)
    as_diloco = Plan("system-a", [dataclasses.replace(p, job=diloco)
                                  for p in step_plan.placements])
    result = run_baseline(9, "system-a", [diloco], net, 0, as_diloco)
    assert result.plan is None and "diloco" in result.error
    assert estimate_plan(step_plan.placements, net).makespan_s > 0


def test_island_layouts_make_room_for_the_outer_optimizer_state():
    # 30B parameters: 480 GB of training state fits one 640 GB server, 720 GB with the outer
    # optimizer's 8 bytes per parameter does not.
    from planner.core.jobs import Job
    from planner.search import algorithm1 as alg1

    job = Job("wide", params=30e9, layers=48, hidden=7168, seq_len=512, global_batch=64,
              steps=100, sync=Sync("diloco", 100, ("bf16",)))
    net = two_continents(per_site=3)
    assert alg1.fits(step_twin(job), net, [0]) and not alg1.fits(job, net, [0])
    plan = plan_search([job], net)
    assert_valid(plan, net, [job])
    (p,) = plan.placements
    assert p.outer is not None and p.num_stages >= 2


def test_a_repair_re_plans_a_diloco_job_in_full_and_keeps_its_islands():
    from planner.search.repair import repair_jobs

    net = two_continents(per_site=4)
    diloco = job13(sync=Sync("diloco", 100, ("bf16",)))
    plan = plan_search([diloco], net)
    (before,) = plan.placements
    assert len(before.islands) >= 2
    down = net.nodes[before.nodes[0]].id
    result = repair_jobs(plan, net, [diloco], [down],
                         search=lambda jobs, sub, seed=0: plan_search(jobs, sub))
    (after,) = result.plan.placements
    assert result.replanned == [diloco.name]
    assert after.outer is not None and sum(after.island_sizes()) == after.replicas
    assert net.index[down] not in after.nodes and problems(after, net) == []
