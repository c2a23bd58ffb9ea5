"""The per-iteration step overhead of the calibrated cost model: added once to every replica's
iteration (sync: step and DiLoCo inner steps alike), zero changes nothing, fit() recovers it
from runs of different work per replica and leaves it at its prior where the runs cannot tell
it apart, and hulk-calibration/3 files still read."""

from __future__ import annotations

import copy
import json
import math
import random
from dataclasses import replace

import pytest

from hulk.errors import InputError
from planner.core.calibration import FORMAT, Calibration, Factor, Observation, fit
from planner.core.costmodel import Placement, Stage, estimate
from tests.helpers.calibration_nets import JOB, diloco_placement, lab_net, step_placement

STEP_S = 0.19


@pytest.mark.parametrize("placement", [step_placement(), diloco_placement()],
                         ids=["step", "diloco"])
def test_the_step_overhead_adds_exactly_itself_to_the_iteration(placement):
    net = lab_net()
    reference = estimate(placement, net)
    # Zero is the reference model, number for number.
    assert estimate(placement, Calibration(step_overhead_s=Factor.prior(0.0)).apply(net)) \
        == reference
    cal = Calibration(step_overhead_s=Factor.prior(STEP_S))
    assert not cal.identity and Calibration().identity
    slow = estimate(placement, cal.apply(net))
    assert slow.iteration_s == pytest.approx(reference.iteration_s + STEP_S, abs=1e-12)
    assert slow.compute_s == pytest.approx(reference.compute_s + STEP_S, abs=1e-12)
    assert slow.pipeline_s == pytest.approx(reference.pipeline_s + STEP_S, abs=1e-12)
    assert slow.outer_sync_s == reference.outer_sync_s
    assert slow.job_s == pytest.approx(reference.job_s + JOB.steps * STEP_S, rel=1e-12)
    assert net.step_overhead_s == 0.0 and net.subset([1, 0]).step_overhead_s == 0.0
    assert cal.apply(net).subset([1, 0]).step_overhead_s == STEP_S


def one_host_runs(counts, truth: Calibration, seed: int = 0, noise: float = 0.005):
    """Runs of the whole model on node 0 at global batches of ``counts`` micro-batches, measured
    on a world whose truth is ``truth`` with lognormal noise of ``noise``."""
    rng = random.Random(seed)
    net = lab_net(1)
    out = []
    for r, m in enumerate(counts):
        job = replace(JOB, global_batch=m * JOB.micro_batch)
        p = Placement(job, (Stage(0, 24, (0,)),), micro_batch=JOB.micro_batch)
        t = estimate(p, truth.apply(net)).iteration_s * math.exp(rng.gauss(0.0, noise))
        out.append(Observation(p, net, t, f"run{r}"))
    return out


def test_fit_recovers_a_step_overhead_from_runs_at_two_micro_batch_counts():
    truth = Calibration(compute={"A100": Factor.prior(0.7)}, step_overhead_s=Factor.prior(STEP_S))
    cal = fit(one_host_runs([4, 8, 4, 8, 4, 8], truth), seed=0)
    step = cal.step_overhead_s
    assert step.fitted and step.runs == 6
    assert step.value == pytest.approx(STEP_S, rel=0.05) and step.low <= step.value <= step.high
    assert cal.compute["A100"].value == pytest.approx(0.7, rel=0.02)
    # One micro-batch count: the overhead is as good as slower compute, so it stays at 0.
    flat = fit(one_host_runs([8] * 6, truth), seed=0)
    assert flat.step_overhead_s == Factor.prior(0.0, 6)


def test_a_step_overhead_every_run_could_trade_for_the_communication_factor_stays_at_prior():
    """Runs of one two-replica placement at two batches all spend the same seconds in their
    all-reduce: a per-iteration overhead moves them exactly as slower communication does."""
    net = lab_net(2)
    truth = Calibration(compute={"A100": Factor.prior(0.7)}, step_overhead_s=Factor.prior(STEP_S))
    obs = []
    for r, m in enumerate([4, 8, 4, 8]):
        job = replace(JOB, global_batch=2 * m * JOB.micro_batch)
        p = Placement(job, (Stage(0, 24, (0, 1)),), micro_batch=JOB.micro_batch)
        obs.append(Observation(p, net, estimate(p, truth.apply(net)).iteration_s, f"run{r}"))
    cal = fit(obs, seed=0)
    assert cal.step_overhead_s == Factor.prior(0.0, 4)
    # Communication held at 1 (throughput tests measured the links): the runs pin s down.
    held = fit(obs, seed=0, communication=False)
    assert held.communication == Factor.prior(1.0, 4)
    assert held.step_overhead_s.fitted
    assert held.step_overhead_s.value == pytest.approx(STEP_S, rel=1e-3)


def test_step_overhead_json_round_trip_and_old_format():
    truth = Calibration(compute={"A100": Factor.prior(0.7)}, step_overhead_s=Factor.prior(STEP_S))
    cal = fit(one_host_runs([4, 8, 4, 8], truth), seed=0)
    data = json.loads(json.dumps(cal.to_json()))
    assert data["format"] == FORMAT == "hulk-calibration/5"
    assert Calibration.from_json(data, "cal.json") == cal
    # A hulk-calibration/3 file has no step overhead (nor outer-sync factor): it reads at its
    # prior, 0 s.
    old = copy.deepcopy(data)
    old["format"] = "hulk-calibration/3"
    old.pop("step_overhead_s")
    old.pop("outer_sync")
    read = Calibration.from_json(old, "cal.json")
    assert read == replace(cal, step_overhead_s=Factor.prior(0.0))
    assert read.apply(lab_net()).step_overhead_s == 0.0
    # A /4 or /5 file must carry it.
    data.pop("step_overhead_s")
    with pytest.raises(InputError) as err:
        Calibration.from_json(data, "cal.json")
    assert str(err.value).startswith("cal.json: step_overhead_s: ")
