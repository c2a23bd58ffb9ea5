"""A job's wire precision (gradient_dtype, activation_dtype; docs/COSTMODEL.md section 3): the
bytes the cost model counts, an estimate where only the priced traffic moves, and the fields'
way through a job spec (submit, the store, the plan summary) and back, fp16 when absent."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from hulk.errors import InputError
from hulk.validate import Invalid
from hulk.wire.placement import parse_summary
from planner.core.costmodel import (OuterSync, Placement, Stage, estimate, gradient_bytes,
                                    pseudo_gradient_bytes)
from planner.core.jobs import DTYPE_FIELDS, Job, catalog_job, check_dtype
from planner.core.placements import (build_node_placements, build_summary, job_from_spec,
                                     job_spec, plan_from_summary)
from planner.core.plan import Plan
from tests.helpers.plans import make_net, two_city_net

# P = 8e8 over L = 4 layers; A = 2 * s * b * h = 2 * 100 * 2 * 1000 = 4e5 bytes at fp16.
JOB = Job(name="j", params=8e8, layers=4, hidden=1000, seq_len=100, global_batch=8, micro_batch=2,
          steps=10)
FP32 = replace(JOB, gradient_dtype="fp32", activation_dtype="fp32")


def test_fp16_is_the_default_and_bf16_counts_the_same_bytes():
    assert (JOB.gradient_dtype, JOB.activation_dtype) == ("fp16", "fp16")
    assert gradient_bytes(JOB, 2) == 2 * 8e8 * 2 / 4 == 8e8
    assert JOB.activation_bytes() == 4e5
    bf16 = replace(JOB, gradient_dtype="bf16", activation_dtype="bf16")
    assert gradient_bytes(bf16, 2) == 8e8 and bf16.activation_bytes() == 4e5


def test_fp32_doubles_the_gradient_and_activation_bytes():
    assert gradient_bytes(FP32, 2) == 4 * 8e8 * 2 / 4 == 1.6e9
    assert FP32.activation_bytes() == 8e5 and FP32.activation_bytes(micro_batch=1) == 4e5
    # Each field prices its own traffic only.
    assert replace(JOB, gradient_dtype="fp32").activation_bytes() == 4e5
    assert gradient_bytes(replace(JOB, activation_dtype="fp32"), 2) == 8e8


def test_the_outer_exchange_stays_priced_by_its_compression():
    for compression, c in (("none", 4), ("int8", 1)):
        assert pseudo_gradient_bytes(FP32, 2, compression) == c * 8e8 * 2 / 4
        assert pseudo_gradient_bytes(JOB, 2, compression) == c * 8e8 * 2 / 4


def test_fp32_gradients_change_only_the_allreduce_of_a_step_estimate():
    # Two A100 replicas 20 ms apart, one stage: no stage boundary, so only the all-reduce moves.
    net = make_net([("A100", 1, 40), ("A100", 1, 40)], [[0, 20], [20, 0]])
    p16 = Placement(JOB, (Stage(0, 4, (0, 1)),), micro_batch=2)
    p32 = replace(p16, job=replace(JOB, gradient_dtype="fp32"))
    e16, e32 = estimate(p16, net), estimate(p32, net)
    assert e32.pipeline_s == e16.pipeline_s and e32.compute_s == e16.compute_s
    assert e32.peak_memory_fraction == e16.peak_memory_fraction
    # T_ar = 2 (D - 1) (a + S / (D bw)): the latency part stays, the bytes' part doubles.
    a = 0.010
    bw = net.bw[0, 1]
    assert e16.allreduce_s == pytest.approx(2 * (a + 2 * 8e8 / (2 * bw)))    # S = 2 P: fp16
    assert e32.allreduce_s - 2 * a == pytest.approx(2 * (e16.allreduce_s - 2 * a))
    assert e32.iteration_s - e16.iteration_s == pytest.approx(e32.allreduce_s - e16.allreduce_s)


def test_fp32_activations_double_a_stage_boundarys_transfer():
    net = make_net([("A100", 1, 40), ("A100", 1, 40)], [[0, 20], [20, 0]])
    p16 = Placement(JOB, (Stage(0, 2, (0,)), Stage(2, 4, (1,))), micro_batch=2)
    p32 = replace(p16, job=replace(JOB, activation_dtype="fp32"))
    e16, e32 = estimate(p16, net), estimate(p32, net)
    assert e16.allreduce_s == e32.allreduce_s == 0.0
    assert e32.pipeline_s > e16.pipeline_s and e32.compute_s == e16.compute_s


@pytest.mark.parametrize("value", ["FP32", "fp8", "", 4, True, ["fp32"]])
def test_a_bad_dtype_is_invalid_naming_the_field(value):
    for key in DTYPE_FIELDS:
        with pytest.raises(Invalid) as err:
            check_dtype(key, value)
        assert err.value.field == key and "expected one of fp16, bf16, fp32" in err.value.expected
    with pytest.raises(Invalid):
        catalog_job("gpt2-xl", gradient_dtype=value)


def test_a_spec_carries_only_dtypes_other_than_the_default():
    spec = job_spec(JOB)
    assert not set(DTYPE_FIELDS) & set(spec)   # a fp16 job's spec is what it was before them
    assert job_from_spec("j", spec) == JOB
    spec32 = job_spec(FP32)
    assert spec32["gradient_dtype"] == spec32["activation_dtype"] == "fp32"
    assert job_from_spec("j", json.loads(json.dumps(spec32))) == FP32


def test_a_spec_stored_before_the_dtypes_loads_as_fp16():
    old = {"model": None, "params": 8e8, "layers": 4, "hidden": 1000, "seq_len": 100,
           "global_batch": 8, "micro_batch": 2, "steps": 10, "command": None}
    job = job_from_spec("j", old)
    assert (job.gradient_dtype, job.activation_dtype) == ("fp16", "fp16") and job == JOB


def test_a_spec_with_a_bad_dtype_is_an_error_naming_it():
    with pytest.raises(InputError) as err:
        job_from_spec("j", {**job_spec(JOB), "gradient_dtype": "fp64"})
    assert "j.spec.gradient_dtype" in str(err.value) and "fp16, bf16, fp32" in str(err.value)


def test_submitted_jobs_keep_their_dtypes_in_the_store(tmp_path):
    from planner.service.store import Store

    store = Store(tmp_path / "s.sqlite")
    store.submit_jobs([("j", job_spec(FP32)), ("k", job_spec(replace(JOB, name="k")))])
    assert store.job_by_name("j").job == FP32
    k = store.job_by_name("k").job
    assert (k.gradient_dtype, k.activation_dtype) == ("fp16", "fp16")


def test_the_plan_summary_round_trips_the_dtypes():
    net = two_city_net()
    job = replace(catalog_job("gpt2-xl", name="a"), gradient_dtype="fp32", activation_dtype="bf16")
    placement = Placement(job, (Stage(0, 24, (0, 1)), Stage(24, 48, (2, 3))), micro_batch=4,
                          islands=(1, 1), outer=OuterSync(10, "int8"))
    plan = Plan(method="manual", placements=[placement])
    nodes = build_node_placements(plan, net, fleet="lab", plan_id="p1")
    doc = build_summary(plan, net, fleet="lab", plan_id="p1", issued_at_ms=5, node_placements=nodes)
    rebuilt, _, missing = plan_from_summary(parse_summary(json.dumps(doc)), net)
    assert missing == [] and rebuilt.placements[0].job == job
