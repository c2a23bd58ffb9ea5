"""Property-based tests of every parser that reads outside input: jobs.yaml, fleet files, placement
messages, and gRPC requests against the real servicer. Whatever arrives, the answer is a value or
one clear hulk error (one line, naming the source), never a crash."""

from __future__ import annotations

import copy
import importlib
import json
import tempfile
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hulk.errors import HulkError

SETTINGS = settings(max_examples=150, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.function_scoped_fixture])


def _module(name: str):
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name == name:
            pytest.skip(f"{name} does not exist in this checkout; its parser cannot be fuzzed")
        raise


scalars = (st.none() | st.booleans() | st.integers(min_value=-2**70, max_value=2**70)
           | st.floats() | st.text(max_size=30))
json_values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4)
                           | st.dictionaries(st.text(max_size=12), inner, max_size=5),
                           max_leaves=25)


def _paths(doc, prefix=()):
    """Every (path) into a nested dict/list document."""
    yield prefix
    if isinstance(doc, dict):
        for key, value in doc.items():
            yield from _paths(value, prefix + (key,))
    elif isinstance(doc, list):
        for i, value in enumerate(doc):
            yield from _paths(value, prefix + (i,))


@st.composite
def mutations(draw, valid):
    """A valid document with one to three places replaced by random values or deleted."""
    doc = copy.deepcopy(valid)
    for _ in range(draw(st.integers(1, 3))):
        paths = [p for p in _paths(doc) if p]
        if not paths:
            return draw(json_values)
        path = draw(st.sampled_from(paths))
        parent = doc
        for key in path[:-1]:
            parent = parent[key]
        if isinstance(parent, dict) and draw(st.booleans()):
            del parent[path[-1]]
        else:
            parent[path[-1]] = draw(json_values)
    return doc


def _one_clear_line(err: BaseException, source: str | None = None) -> None:
    assert isinstance(err, HulkError), f"{type(err).__name__}: {err}"
    text = str(err)
    assert text.strip() and "\n" not in text, repr(text)
    assert "Traceback" not in text
    if source is not None:
        assert source in text, text


# ----------------------------------------------------------------------------------- jobs.yaml

VALID_JOBS = {"jobs": [
    {"name": "opt", "model": "opt-175b", "steps": 10, "command": "python train.py"},
    {"name": "custom", "model": "mine", "params": 1.0e9, "layers": 24, "hidden": 2048,
     "seq_len": 1024, "global_batch": 64, "micro_batch": 2, "steps": 5},
]}


def _check_jobs(text: str) -> None:
    jobfile = _module("planner.files.jobs")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "jobs.yaml"
        path.write_text(text, encoding="utf-8", errors="surrogatepass")
        try:
            jobs = jobfile.load_jobs(path)
        except Exception as err:  # noqa: BLE001 - the property is about which errors escape
            _one_clear_line(err, str(path))
        else:
            assert isinstance(jobs, list)


def test_valid_jobs_file_parses():
    jobfile = _module("planner.files.jobs")
    assert [j.name for j in jobfile.parse_jobs(yaml.safe_dump(VALID_JOBS))] == ["opt", "custom"]


@pytest.mark.slow   # a fuzzer: 80-150 examples
@SETTINGS
@given(mutations(VALID_JOBS))
def test_jobs_yaml_mutated_documents(doc):
    _check_jobs(yaml.safe_dump(doc, allow_unicode=True))


@pytest.mark.slow   # a fuzzer: 80-150 examples
@SETTINGS
@given(st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=300))
def test_jobs_yaml_arbitrary_text(text):
    _check_jobs(text)


# --------------------------------------------------------------------------------- fleet files

VALID_FLEET = {"nodes": [
    {"id": "beijing-1", "city": "Beijing", "gpus": 8, "gpu_name": "NVIDIA A100-SXM4-40GB",
     "compute_capability": 8.0, "memory_gb": 320},
    {"id": "tokyo-2", "city": "Tokyo", "gpus": 8, "gpu_name": "NVIDIA A100-SXM4-40GB",
     "compute_capability": 8.0, "memory_gb": 320}],
    "links": [{"src": "beijing-1", "dst": "tokyo-2", "rtt_ms": 74.3, "bandwidth_gbps": None,
               "loss": 0.0, "samples": 1200}]}


def _check_fleet_file(name: str, data: bytes) -> None:
    fleetio = _module("planner.files.fleet")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / name
        path.write_bytes(data)
        try:
            fleetio.load_fleet(path)
        except Exception as err:  # noqa: BLE001
            _one_clear_line(err, str(path))


def _check_paper_folder(nodes: str, edges: str) -> None:
    fleetio = _module("planner.files.fleet")
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "paper"
        folder.mkdir()
        (folder / "node_feature.csv").write_text(nodes)
        (folder / "edge.txt").write_text(edges)
        try:
            fleetio.load_fleet(folder)
        except Exception as err:  # noqa: BLE001
            _one_clear_line(err, str(folder))


def test_valid_fleet_json_parses(tmp_path):
    fleetio = _module("planner.files.fleet")
    path = tmp_path / "fleet.json"
    path.write_text(json.dumps(VALID_FLEET))
    assert fleetio.load_fleet(path) is not None


@pytest.mark.slow   # a fuzzer: 80-150 examples
@SETTINGS
@given(mutations(VALID_FLEET))
def test_fleet_json_mutated_documents(doc):
    _check_fleet_file("fleet.json", json.dumps(doc).encode())


@pytest.mark.slow   # a fuzzer: 80-150 examples
@SETTINGS
@given(st.binary(max_size=300))
def test_fleet_arbitrary_bytes(data):
    _check_fleet_file("fleet.json", data)


csv_cells = st.text(alphabet="0123456789.-eE ,abcxyz\"", max_size=8)


@SETTINGS
@given(st.lists(st.lists(csv_cells, min_size=0, max_size=5), max_size=6),
       st.lists(st.lists(st.text(alphabet="0123456789.- abcnNaif", max_size=6), max_size=4),
                max_size=6))
@pytest.mark.slow   # a fuzzer: 80-150 examples
def test_paper_folder_random_rows(node_rows, edge_rows):
    nodes = "node,City,Capability,Memory\n" + "\n".join(",".join(r) for r in node_rows)
    edges = "\n".join(" ".join(r) for r in edge_rows)
    _check_paper_folder(nodes, edges)


# -------------------------------------------------------------------------- placement messages

def _valid_placement() -> dict:
    placements = _module("hulk.wire.placement")
    role = placements.Role(plan_id="p1", job="opt", phase=0, stage=1, num_stages=2, layer_lo=12,
                           layer_hi=24, replica=0, num_replicas=1, rank=1, world_size=2,
                           rendezvous_address="10.0.0.1", rendezvous_port=29500, micro_batch=1,
                           command="python train.py")
    return placements.NodePlacement(fleet="f1", node="n2", plan_id="p1", roles=(role,)).to_json()


def _check_placement(data: bytes) -> None:
    placements = _module("hulk.wire.placement")
    try:
        placement = placements.parse_placement(data, source="hulk/v1/f1/nodes/n2/placement")
    except Exception as err:  # noqa: BLE001
        _one_clear_line(err, "hulk/v1/f1/nodes/n2/placement")
    else:
        assert placement.node and placement.fleet


def test_valid_placement_round_trips():
    placements = _module("hulk.wire.placement")
    doc = _valid_placement()
    assert placements.parse_placement(json.dumps(doc)).to_json() == doc


@pytest.mark.slow   # a fuzzer: 80-150 examples
@SETTINGS
@given(st.builds(lambda: None).flatmap(lambda _: mutations(_valid_placement())))
def test_placement_mutated_documents(doc):
    _check_placement(json.dumps(doc).encode())


@pytest.mark.slow   # a fuzzer: 80-150 examples
@SETTINGS
@given(st.binary(max_size=200) | json_values.map(lambda v: json.dumps(v).encode()))
def test_placement_arbitrary_payloads(data):
    _check_placement(data)


# --------------------------------------------------------------------- gRPC requests, real server

@pytest.fixture(scope="module")
def fuzz_planner(tmp_path_factory):
    from planner.security.guard import RateLimit
    from planner.security.tls import init_pki

    from tests.helpers.threaded_planner import ThreadedPlanner, bearer, channel, register_request

    from hulk.v1 import hulk_pb2_grpc
    tmp = tmp_path_factory.mktemp("fuzz")
    pki = init_pki(tmp / "pki", ["127.0.0.1"])
    planner = ThreadedPlanner(tmp / "p.sqlite", pki, rate_limit=RateLimit(1e6, 1e6))
    tokens = {n: planner.credentials.issue(n).token for n in ("n1", "n2")}
    ch = channel(planner.target, pki)
    stub = hulk_pb2_grpc.PlannerStub(ch)
    stub.Register(register_request("n1", "127.0.0.2"), metadata=bearer(tokens["n1"]), timeout=10)
    stub.Register(register_request("n2", "127.0.0.3"), metadata=bearer(tokens["n2"]), timeout=10)
    yield planner, stub, bearer(tokens["n1"])
    ch.close()
    planner.stop()


# Statuses that are a clear answer to bad input; INTERNAL/UNKNOWN would be a crash.
CLEAR = {"OK", "INVALID_ARGUMENT", "NOT_FOUND", "PERMISSION_DENIED", "FAILED_PRECONDITION",
         "RESOURCE_EXHAUSTED", "UNAUTHENTICATED"}

node_ids = st.sampled_from(["n1", "n1", "n1", "n2", ""]) | st.text(max_size=20)
doubles = st.floats(allow_nan=True, allow_infinity=True)
int64 = st.integers(min_value=-2**63, max_value=2**63 - 1)
uint32 = st.integers(min_value=0, max_value=2**32 - 1)
short_text = st.text(max_size=40)


def _call(stub_method, request, metadata) -> str:
    import grpc
    try:
        stub_method(request, metadata=metadata, timeout=20)
        return "OK"
    except grpc.RpcError as err:
        code = err.code().name
        assert code in CLEAR, f"{code}: {err.details()}"
        details = err.details() or ""
        assert details.strip() and "\n" not in details and "Traceback" not in details, details
        return code


@st.composite
def report_requests(draw):
    from hulk.v1 import hulk_pb2
    samples = draw(st.lists(st.builds(
        hulk_pb2.Sample,
        peer_id=st.sampled_from(["n2", "n1", "nobody", ""]) | short_text,
        sent_at_ms=int64 | st.integers(1_700_000_000_000, 1_900_000_000_000),
        kind=st.integers(min_value=-5, max_value=5),
        payload_bytes=uint32, lost=st.booleans(),
        rtt_ms=doubles | st.floats(0.0, 5000.0), timeout_ms=doubles | st.just(2000.0)),
        max_size=20))
    return hulk_pb2.ReportRequest(node_id=draw(node_ids), batch_id=draw(short_text),
                                  samples=samples, spool_dropped=draw(st.integers(0, 2**64 - 1)))


@pytest.mark.slow   # a fuzzer: 80-150 examples
@settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck))
@given(report_requests())
def test_grpc_report_random_fields(fuzz_planner, request_):
    planner, stub, metadata = fuzz_planner
    code = _call(stub.Report, request_, metadata)
    if request_.node_id != "n1":
        assert code == "PERMISSION_DENIED"


@pytest.mark.slow   # a fuzzer: 80-150 examples
@settings(max_examples=80, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.data())
def test_grpc_register_and_heartbeat_random_fields(fuzz_planner, data):
    from hulk.v1 import hulk_pb2
    planner, stub, metadata = fuzz_planner
    location = hulk_pb2.Location(city=data.draw(short_text), has_coordinates=data.draw(st.booleans()),
                                 latitude=data.draw(doubles), longitude=data.draw(doubles))
    gpus = data.draw(st.lists(st.builds(hulk_pb2.Gpu, name=short_text, uuid=short_text,
                                        compute_capability=doubles,
                                        memory_bytes=st.integers(0, 2**64 - 1)), max_size=3))
    register = hulk_pb2.RegisterRequest(
        node_id="n1", hostname=data.draw(short_text), location=location,
        agent_version=data.draw(short_text),
        inventory=hulk_pb2.GpuInventory(gpus=gpus, driver_version=data.draw(short_text),
                                        unavailable_reason=data.draw(short_text)),
        address=data.draw(st.sampled_from(["127.0.0.2", "", "::1", "not an ip"]) | short_text),
        probe_port=data.draw(uint32))
    _call(stub.Register, register, metadata)
    beat = hulk_pb2.HeartbeatRequest(
        node_id=data.draw(node_ids), time_ms=data.draw(int64), spool_depth=data.draw(
            st.integers(0, 2**64 - 1)), spool_dropped=data.draw(st.integers(0, 2**64 - 1)),
        launch=hulk_pb2.LaunchStatus(plan_id=data.draw(short_text), job=data.draw(short_text),
                                     state=data.draw(st.integers(-3, 9)),
                                     exit_code=data.draw(st.integers(-2**31, 2**31 - 1)),
                                     detail=data.draw(short_text), changed_at_ms=data.draw(int64)))
    _call(stub.Heartbeat, beat, metadata)
    # Put n1 back where the report fuzzing expects it.
    from tests.helpers.threaded_planner import register_request
    stub.Register(register_request("n1", "127.0.0.2"), metadata=metadata, timeout=10)
