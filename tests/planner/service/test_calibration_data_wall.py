"""calibration_data.observations observes a DiLoCo job of two or more islands by its wall clock
a step over two whole rounds or more (outer syncs included: what fits ``outer_sync``), and every
other job, or one timed over fewer rounds, by its slowest rank's median step."""

from __future__ import annotations

from dataclasses import replace

import pytest

from planner.core.calibration import Calibration, Factor, fit
from planner.core.costmodel import OuterSync, estimate
from planner.service.calibration_data import observations
from planner.service.job_progress import JobIteration
from tests.helpers.calibration_nets import (JOB, diloco_placement, lab_net,
                                                      step_placement)

MEDIAN_S, WALL_S = 0.2, 0.4


def iteration(name: str, wall_s: float = WALL_S, wall_steps: int = 0) -> JobIteration:
    return JobIteration(name, "p1", {}, [], MEDIAN_S, 50, None, None, wall_s, wall_steps)


def observed(placement, it: JobIteration):
    (obs,), skipped = observations([it], lab_net(), placements={it.job_name: placement})
    assert skipped == [] and obs.name == f"{it.job_name}@p1"
    return obs.measured_iteration_s, obs.median_step


def test_a_two_island_diloco_job_timed_over_two_rounds_is_observed_by_its_wall_clock():
    p = diloco_placement()                                     # two islands, H = 10
    assert len(p.island_columns()) == 2 and p.outer.inner_steps == 10
    assert observed(p, iteration("j", wall_steps=20)) == (WALL_S, False)
    assert observed(p, iteration("j", wall_steps=5000)) == (WALL_S, False)


@pytest.mark.parametrize("wall_s, wall_steps", [(WALL_S, 19), (0.0, 500), (WALL_S, 0)])
def test_fewer_than_two_rounds_or_no_wall_figure_keeps_the_median(wall_s, wall_steps):
    assert observed(diloco_placement(), iteration("j", wall_s, wall_steps)) == (MEDIAN_S, True)


def test_a_sync_step_job_and_a_one_island_job_keep_the_median():
    assert observed(step_placement(), iteration("j", wall_steps=5000)) == (MEDIAN_S, True)
    one = replace(diloco_placement(), islands=(4,))
    assert len(one.island_columns()) == 1
    assert observed(one, iteration("j", wall_steps=5000)) == (MEDIAN_S, True)


def test_the_fleets_wall_figures_fit_the_outer_sync():
    net = lab_net()
    truth = Calibration(compute={"A100": Factor.prior(0.8)}, outer_sync=Factor.prior(1.8))
    placements, its = {"step": step_placement()}, []
    step = estimate(step_placement(), truth.apply(net))
    its.append(JobIteration("step", "p1", {}, [], step.median_step_s, 50, None, None,
                            step.iteration_s, 1000))
    for h in (2, 5, 10):
        p = replace(diloco_placement(replace(JOB, steps=40)),
                    outer=OuterSync(inner_steps=h, compression="int8"))
        e = estimate(p, truth.apply(net))
        placements[f"h{h}"] = p
        its.append(JobIteration(f"h{h}", "p1", {}, [], e.median_step_s, 50, None, None,
                                e.iteration_s, 4 * h))
    obs, skipped = observations(its, net, placements=placements)
    assert skipped == [] and [o.median_step for o in obs] == [True, False, False, False]
    cal = fit(obs, seed=0, min_runs=3, communication=False)
    assert cal.outer_sync.fitted and cal.outer_sync.value == pytest.approx(1.8, rel=1e-3)
