"""The outer-sync factor of the calibrated cost model: it multiplies a DiLoCo job's outer sync and
nothing else, fit() recovers it from runs timed over whole rounds at different H, a median step
of a job syncing every H > 2 steps is fitted against the inner step and says nothing of it, and
hulk-calibration/4 files still read."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from hulk.errors import InputError
from planner.core.calibration import FORMAT, Calibration, Factor, Observation, fit
from planner.core.costmodel import OuterSync, estimate
from planner.service.calibration_refit import describe, factors, fitted_only
from tests.helpers.calibration_nets import (JOB, diloco_placement, lab_net,
                                                      step_placement)

TRUTH = Calibration(compute={"A100": Factor.prior(0.8)}, outer_sync=Factor.prior(1.8))


def at_h(h: int, steps: int = 40):
    p = diloco_placement(replace(JOB, steps=steps))
    return replace(p, outer=OuterSync(inner_steps=h, compression="int8"))


def test_the_factor_multiplies_the_outer_sync_and_nothing_else():
    net = lab_net()
    p = diloco_placement()
    reference = estimate(p, net)
    assert estimate(p, Calibration(outer_sync=Factor.prior(1.0)).apply(net)) == reference
    slow = estimate(p, Calibration(outer_sync=Factor.prior(1.8)).apply(net))
    assert not Calibration(outer_sync=Factor.prior(1.8)).identity
    assert slow.outer_sync_s == pytest.approx(1.8 * reference.outer_sync_s, rel=1e-12)
    assert slow.inner_step_s == reference.inner_step_s > 0
    h = p.outer.inner_steps
    assert slow.iteration_s == pytest.approx(reference.iteration_s + 0.8 * reference.outer_sync_s / h,
                                             rel=1e-12)
    # A sync: step placement has no outer sync to scale; a calibrated sub-network keeps it.
    step = step_placement()
    assert estimate(step, Calibration(outer_sync=Factor.prior(1.8)).apply(net)) == estimate(step, net)
    assert Calibration(outer_sync=Factor.prior(1.8)).apply(net).subset([0, 1]).outer_sync_factor == 1.8


def test_the_median_step_is_the_inner_step_once_h_passes_two():
    net = lab_net()
    for h, expect in ((1, "iteration"), (2, "iteration"), (3, "inner"), (20, "inner")):
        e = estimate(at_h(h), net)
        assert e.inner_steps == h
        assert e.median_step_s == (e.inner_step_s if expect == "inner" else e.iteration_s)
        assert e.inner_step_s < e.iteration_s
    step = estimate(step_placement(), net)
    assert step.median_step_s == step.iteration_s


def test_fit_recovers_the_factor_from_runs_over_whole_rounds():
    net = lab_net()
    obs = [Observation(step_placement(), net, estimate(step_placement(), TRUTH.apply(net)).iteration_s,
                       "step")]
    obs += [Observation(at_h(h), net, estimate(at_h(h), TRUTH.apply(net)).iteration_s, f"h{h}")
            for h in (2, 5, 10)]
    cal = fit(obs, seed=0, min_runs=3, communication=False)
    assert cal.outer_sync.fitted and cal.outer_sync.runs == 3
    assert cal.outer_sync.value == pytest.approx(1.8, rel=1e-3)
    assert cal.outer_sync.low <= cal.outer_sync.value <= cal.outer_sync.high
    judged = at_h(20)
    assert estimate(judged, cal.apply(net)).iteration_s == pytest.approx(
        estimate(judged, TRUTH.apply(net)).iteration_s, rel=1e-3)
    # Fewer runs with outer syncs than asked for: the factor keeps its prior.
    held = fit(obs, seed=0, min_runs=3, communication=False, min_outer_runs=4)
    assert not held.outer_sync.fitted and held.outer_sync.value == 1.0 and held.outer_sync.runs == 3


def test_a_median_step_fits_the_inner_step_and_leaves_the_factor_alone():
    """What ranks report (their median step) of a job syncing every 20 steps: only the inner step
    is in it. Fitted against the iteration, the compute factor would absorb the outer sync."""
    net = lab_net()
    obs = [Observation(at_h(20), net, estimate(at_h(20), TRUTH.apply(net)).median_step_s,
                       f"job{i}", median_step=True) for i in range(3)]
    cal = fit(obs, seed=0, communication=False)
    assert not cal.outer_sync.fitted and cal.outer_sync.runs == 0
    assert cal.compute["A100"].value == pytest.approx(0.8, rel=1e-3)
    # The same figures read as whole iterations would price compute wrong.
    wrong = fit([replace(o, median_step=False) for o in obs], seed=0, communication=False)
    assert wrong.compute["A100"].value > 0.85
    # With H = 2 the median is the mean of a short and a long step: it counts as an outer run.
    two = [Observation(at_h(2), net, estimate(at_h(2), TRUTH.apply(net)).median_step_s,
                       f"two{i}", median_step=True) for i in range(3)]
    assert fit(two, seed=0, communication=False).outer_sync.runs == 3


def test_json_round_trip_and_older_formats():
    net = lab_net()
    obs = [Observation(at_h(h), net, estimate(at_h(h), TRUTH.apply(net)).iteration_s, f"h{h}")
           for h in (2, 5, 10)]
    cal = fit(obs, seed=0, communication=False)
    data = json.loads(json.dumps(cal.to_json()))
    assert data["format"] == FORMAT == "hulk-calibration/5"
    assert data["outer_sync"]["fitted"] is True
    assert Calibration.from_json(data, "cal.json") == cal
    # A /4 file has no outer-sync factor: it reads at its prior, 1.
    old = dict(data, format="hulk-calibration/4")
    old.pop("outer_sync")
    read = Calibration.from_json(old, "cal.json")
    assert read == replace(cal, outer_sync=Factor.prior(1.0))
    assert read.apply(net).outer_sync_factor == 1.0
    # A /5 file must carry it, positive.
    missing = dict(data)
    missing.pop("outer_sync")
    with pytest.raises(InputError) as err:
        Calibration.from_json(missing, "cal.json")
    assert str(err.value).startswith("cal.json: outer_sync: ")
    bad = json.loads(json.dumps(data))
    bad["outer_sync"]["value"] = 0
    with pytest.raises(InputError) as err:
        Calibration.from_json(bad, "cal.json")
    assert "outer_sync.value" in str(err.value) and "from 0.001" in str(err.value)


def test_serve_exports_and_describes_the_factor_once_fitted():
    fitted = Calibration(outer_sync=Factor(1.8, 1.6, 2.0, runs=3, fitted=True))
    assert factors(fitted)["outer_sync"] == 1.8
    assert "outer sync 1.8x" in describe(fitted)
    prior_only = Calibration(outer_sync=Factor(1.8, 1.8, 1.8, runs=1, fitted=False))
    assert fitted_only(prior_only).outer_sync == Factor.prior(1.0, 1)
    assert "outer sync" not in describe(prior_only)
