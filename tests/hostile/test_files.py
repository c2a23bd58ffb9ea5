"""Hostile file formats: fleet JSON, jobs.yaml, plan JSON and the calibration file, each a valid
document with places replaced by hostile values (huge, negative, NaN, long and control-character
texts, many items), plus arbitrary bytes. The reader gives a value within docs/BOUNDS.md or one
InputError line naming the file; never another exception."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hulk.errors import InputError
from planner.bounds import CALIBRATION, FLEET_JSON, JOBS_YAML, PLAN_JSON
from planner.commands.calibrate import load_calibration_file
from planner.core.calibration import Calibration, Factor
from planner.files.fleet import load_fleet
from planner.files.jobs import load_jobs
from planner.files.plan import read_plan
from tests.helpers.hostile import HUGE_INTEGER, deep, documents, dumps, one_clear_line, within

FUZZ = settings(max_examples=200, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
QUICK = settings(FUZZ, max_examples=80)   # the fast lane's share: arbitrary bytes
raw = st.binary(max_size=300)


def read(reader, name: str, data: bytes):
    """``reader`` on a file ``name`` holding ``data``: its value, or None after checking the
    refusal is one InputError line naming the file."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / name
        path.write_bytes(data)
        try:
            return reader(str(path))
        except InputError as err:
            one_clear_line(err, str(path))
            return None
        except Exception as err:  # noqa: BLE001 - the property is which errors escape
            one_clear_line(err, str(path))   # fails: names the exception


# ----------------------------------------------------------------------------- fleet JSON

VALID_FLEET = {"nodes": [
    {"id": "beijing-1", "city": "Beijing", "site": "bj", "gpus": 8,
     "gpu_name": "NVIDIA A100-SXM4-40GB", "compute_capability": 8.0, "memory_gb": 320,
     "latitude": 39.9, "longitude": 116.4},
    {"id": "tokyo-2", "city": "Tokyo", "gpus": 8, "gpu_name": "NVIDIA A100-SXM4-40GB",
     "compute_capability": 8.0, "memory_gb": 320}],
    "links": [{"src": "beijing-1", "dst": "tokyo-2", "rtt_ms": 74.3, "bandwidth_gbps": 10.0,
               "loss": 0.0, "samples": 1200}]}


def check_fleet(fleet) -> None:
    if fleet is None:
        return
    text = FLEET_JSON.limit("nodes[].city, site, gpu_name")
    for node in fleet.nodes:
        assert within(FLEET_JSON.limit("nodes[].gpus"), node.gpus), node
        assert within(FLEET_JSON.limit("nodes[].memory_gb"), node.memory_gb), node
        for value in (node.city, node.site, node.gpu_name):
            assert within(text, value), node


def test_the_valid_fleet_reads():
    fleet = read(load_fleet, "fleet.json", json.dumps(VALID_FLEET).encode())
    assert [n.id for n in fleet.nodes] == ["beijing-1", "tokyo-2"]
    check_fleet(fleet)


@pytest.mark.slow   # a fuzzer: 200 examples
@FUZZ
@given(documents(VALID_FLEET))
def test_fleet_json_hostile_documents(doc):
    check_fleet(read(load_fleet, "fleet.json", dumps(doc).encode()))


@QUICK
@given(raw)
def test_fleet_json_arbitrary_bytes(data):
    check_fleet(read(load_fleet, "fleet.json", data))


# ------------------------------------------------------------------------------- jobs.yaml

VALID_JOBS = {"jobs": [
    {"name": "opt", "model": "opt-175b", "steps": 10, "command": "python train.py",
     "checkpoint_dir": "ckpt"},
    {"name": "custom", "model": "mine", "params": 1.0e9, "layers": 24, "hidden": 2048,
     "seq_len": 1024, "global_batch": 64, "micro_batch": 2, "steps": 5, "max_restarts": 2,
     "command": ["python", "train.py", "--lr", "0.1"]},
]}


def check_jobs(jobs) -> None:
    for job in jobs or ():
        assert within(JOBS_YAML.limit("jobs[].name"), job.name)
        assert within(JOBS_YAML.limit("jobs[].model"), job.model)
        for field in ("params", "layers", "hidden", "seq_len", "global_batch", "micro_batch",
                      "steps"):
            assert within(JOBS_YAML.limit(f"jobs[].{field}"), getattr(job, field)), (field, job)
        assert job.command is None or len(job.command) <= 256


def test_the_valid_jobs_read():
    jobs = read(load_jobs, "jobs.yaml", yaml.safe_dump(VALID_JOBS).encode())
    assert [j.name for j in jobs] == ["opt", "custom"]
    check_jobs(jobs)


@pytest.mark.slow   # a fuzzer: 100 examples (PyYAML reads slowly)
@settings(FUZZ, max_examples=100)
@given(documents(VALID_JOBS))
def test_jobs_yaml_hostile_documents(doc):
    # YAML is a superset of JSON: the same hostile values, NaN and huge numbers included.
    check_jobs(read(load_jobs, "jobs.yaml", dumps(doc).encode()))


@QUICK
@given(raw)
def test_jobs_yaml_arbitrary_bytes(data):
    check_jobs(read(load_jobs, "jobs.yaml", data))


# ------------------------------------------------------------------------------- plan JSON

ESTIMATE = {"iteration_s": 1.5, "compute_s": 1.0, "communication_s": 0.5, "job_s": 150.0}
VALID_PLAN = {
    "format": "hulk-plan/1", "method": "hulk", "fleet": {"nodes": 3},
    "jobs": [{"name": "opt", "phase": 0, "micro_batch": 1, "estimate": ESTIMATE,
              "stages": [{"layers": [0, 48], "nodes": ["a"]}, {"layers": [48, 96], "nodes": ["b"]}]}],
    "totals": {"makespan_s": 150.0, "sum_jct_s": 150.0},
    "unplaced": [{"name": "big", "reason": "no room"}],
}


def check_plan(doc) -> None:
    if doc is None:
        return
    for job in doc.jobs:
        assert within(PLAN_JSON.limit("jobs[].name"), job.name)
        assert within(PLAN_JSON.limit("jobs[].phase"), job.phase)
        assert within(PLAN_JSON.limit("jobs[].micro_batch"), job.micro_batch)
        for stage in job.stages:
            assert within(PLAN_JSON.limit("jobs[].stages[].layers"), stage.hi)
            for node in stage.nodes:
                assert within(PLAN_JSON.limit("jobs[].stages[].nodes[]"), node)
    assert within(PLAN_JSON.limit("fleet.nodes"), doc.fleet_nodes)


def test_the_valid_plan_reads():
    doc = read(read_plan, "plan.json", json.dumps(VALID_PLAN).encode())
    assert [j.name for j in doc.jobs] == ["opt"]
    check_plan(doc)


@pytest.mark.slow   # a fuzzer: 200 examples
@FUZZ
@given(documents(VALID_PLAN))
def test_plan_json_hostile_documents(doc):
    check_plan(read(read_plan, "plan.json", dumps(doc).encode()))


@QUICK
@given(raw)
def test_plan_json_arbitrary_bytes(data):
    check_plan(read(read_plan, "plan.json", data))


@pytest.mark.parametrize("text", [deep(), HUGE_INTEGER, '{"format": ' + HUGE_INTEGER + "}"])
def test_plan_json_nested_too_deeply_or_a_huge_integer_is_refused(text):
    assert read(read_plan, "plan.json", text.encode()) is None


@pytest.mark.parametrize("change, field", [
    ({"method": "m" * 1000}, "method"),
    ({"fleet": {"nodes": 2 ** 40}}, "fleet.nodes"),
])
def test_plan_json_top_fields_past_their_bounds_are_refused(change, field):
    with pytest.raises(InputError, match=field):
        read_plan_doc({**VALID_PLAN, **change})


@pytest.mark.parametrize("key, value", [
    ("name", "../../etc"), ("name", "x" * 65), ("phase", 2 ** 40), ("micro_batch", 2 ** 40)])
def test_plan_json_job_fields_past_their_bounds_are_refused(key, value):
    job = {**VALID_PLAN["jobs"][0], key: value}
    with pytest.raises(InputError, match=f"jobs\\[0\\].{key}"):
        read_plan_doc({**VALID_PLAN, "jobs": [job]})


def test_plan_json_layers_and_node_ids_past_their_bounds_are_refused():
    for stage, field in (({"layers": [0, 10 ** 9], "nodes": ["a"]}, "layers"),
                         ({"layers": [0, 96], "nodes": ["n" * 1000]}, "nodes")):
        job = {**VALID_PLAN["jobs"][0], "stages": [stage]}
        with pytest.raises(InputError, match=f"stages\\[0\\].{field}"):
            read_plan_doc({**VALID_PLAN, "jobs": [job]})
    with pytest.raises(InputError, match="unplaced"):
        read_plan_doc({**VALID_PLAN, "unplaced": [{"name": "big", "reason": "r" * 10_000}]})


def read_plan_doc(doc):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "plan.json"
        path.write_text(json.dumps(doc))
        return read_plan(path)


# ------------------------------------------------------------------------ calibration file

VALID_CALIBRATION = Calibration(
    compute={"NVIDIA A100-SXM4-40GB": Factor(1.1, 1.0, 1.2, 5, True)},
    bandwidth={"intra-site": Factor(9.0, 8.0, 10.0, 3, True)},
    outliers=("job-7",)).to_json()


def test_the_valid_calibration_reads():
    cal = read(load_calibration_file, "cal.json", json.dumps(VALID_CALIBRATION).encode())
    assert cal.compute["NVIDIA A100-SXM4-40GB"].value == 1.1


@pytest.mark.slow   # a fuzzer: 200 examples
@FUZZ
@given(documents(VALID_CALIBRATION))
def test_calibration_hostile_documents(doc):
    cal = read(load_calibration_file, "cal.json", dumps(doc).encode())
    if cal is not None:
        assert within(CALIBRATION.limit("bandwidth_exponent.value, low, high"),
                      cal.bandwidth_exponent.high)


def test_calibration_runs_and_names_past_their_bounds_are_refused():
    factor = VALID_CALIBRATION["compute"]["NVIDIA A100-SXM4-40GB"]
    for doc, field in (
            ({**VALID_CALIBRATION, "compute": {"g": {**factor, "runs": 2 ** 70}}}, "compute.g.runs"),
            ({**VALID_CALIBRATION, "compute": {"g" * 1000: factor}}, "compute"),
            ({**VALID_CALIBRATION, "outliers": ["o" * 1000]}, "outliers")):
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "cal.json"
            path.write_text(json.dumps(doc))
            with pytest.raises(InputError, match=field):
                load_calibration_file(str(path))


@pytest.mark.parametrize("text", [deep(), HUGE_INTEGER])
def test_calibration_nested_too_deeply_or_a_huge_integer_is_refused(text):
    assert read(load_calibration_file, "cal.json", text.encode()) is None


# Every numeric field of a calibration file and its row in docs/BOUNDS.md.
CALIBRATION_FIELDS = {
    ("compute", "NVIDIA A100-SXM4-40GB"): "compute.*.value, low, high",
    ("bandwidth", "intra-site"): "bandwidth.*.value, low, high",
    ("communication",): "communication.value, low, high",
    ("outer_sync",): "outer_sync.value, low, high",
    ("hop_overhead_s",): "hop_overhead_s.value, low, high",
    ("micro_batch_overhead_s",): "micro_batch_overhead_s.value, low, high",
    ("step_overhead_s",): "step_overhead_s.value, low, high",
    ("bandwidth_exponent",): "bandwidth_exponent.value, low, high",
}


def _with_number(where: tuple[str, ...], key: str, x) -> dict:
    doc = json.loads(json.dumps(VALID_CALIBRATION))
    factor = doc
    for part in where:
        factor = factor[part]
    factor[key] = x
    if key == "value":     # keep low <= value <= high where the number allows it
        factor["low"], factor["high"] = x, x
    return doc


@pytest.mark.parametrize("where", list(CALIBRATION_FIELDS))
@pytest.mark.parametrize("x", [1e308, 1.7e308, 5e-324, -1.0, 2 ** 70])
def test_calibration_numbers_past_their_bounds_are_refused_naming_the_field(where, x):
    limit = CALIBRATION.limit(CALIBRATION_FIELDS[where])
    if limit.low <= x <= limit.high:
        pytest.skip("inside this field's bounds")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "cal.json"
        path.write_text(json.dumps(_with_number(where, "value", x)))
        with pytest.raises(InputError) as err:
            load_calibration_file(str(path))
    one_clear_line(err.value, str(path), ".".join(where) + ".value")


@settings(FUZZ, max_examples=120, derandomize=True)
@given(st.sampled_from(list(CALIBRATION_FIELDS)), st.sampled_from(["value", "low", "high"]),
       st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-2 ** 80, 2 ** 80)))
def test_calibration_every_number_is_within_its_bound_or_refused(where, key, x):
    cal = read(load_calibration_file, "cal.json", dumps(_with_number(where, key, x)).encode())
    if cal is None:
        return
    factor = (cal.compute if where[0] == "compute" else cal.bandwidth)[where[1]] \
        if len(where) == 2 else getattr(cal, where[0])
    limit = CALIBRATION.limit(CALIBRATION_FIELDS[where])
    for number in (factor.value, factor.low, factor.high):
        assert within(limit, number), (where, key, x)


@pytest.mark.timeout(20)
def test_infinite_stage_throughputs_never_make_the_layer_split_loop():
    # A compute factor of 1e308 made every throughput inf: inf / inf shares cast to a huge
    # negative integer and the split added layers one by one for ever (plan ran past 150 s).
    import numpy as np

    from planner.core.jobs import catalog_job
    from planner.search.arrangement import balance_layers
    job = catalog_job("opt-175b")
    layers = balance_layers(job, np.array([np.inf, np.inf, 1.0]), np.array([96, 96, 96]))
    assert layers is not None and layers.sum() == job.layers and (layers >= 1).all()
