"""Hostile gRPC requests against the planner's servicer (PlannerServicer over IngestService and a
real SQLite store): every field of Register, Heartbeat and Report set to hostile values. Each
call is answered OK, and then what the store keeps is inside docs/BOUNDS.md, or refused as bad
input with one line; never INTERNAL (an exception the checks did not expect). And each numeric
row of the wire tables is what the check enforces: its top accepted, one step past refused."""

from __future__ import annotations

import asyncio
import itertools
import json
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest
from hypothesis import HealthCheck, event, given, settings

from hulk.bounds import STEP_PROGRESS, THROUGHPUT_RESULT, Table
from hulk.v1 import hulk_pb2
from hulk.validate import Bound
from hulk.wire.records import ProbeKind, ProbeSample, PeerSummary
from planner.bounds import HEARTBEAT, REGISTER, REPORT
from planner.service.admission import WIRE_BOUNDS
from planner.service.ingest import IngestService
from planner.service.servicer import PlannerServicer
from planner.service.store import Store
from tests.helpers.clock import ManualClock
from tests.helpers.hostile import INT_RANGES, above, below, messages, mutated, within

T0 = 1_790_000_000_000
BASE_BATCH = "0" * 32
FUZZ = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                        HealthCheck.data_too_large])
REFUSED = {"INVALID_ARGUMENT", "NOT_FOUND", "PERMISSION_DENIED", "FAILED_PRECONDITION",
           "RESOURCE_EXHAUSTED", "OUT_OF_RANGE"}


class Aborted(Exception):
    def __init__(self, code: grpc.StatusCode, details: str):
        super().__init__(details)
        self.code, self.details = code, details


class AbortContext:
    """The one part of a gRPC context the servicer uses: abort raises, as grpc.aio's does."""

    async def abort(self, code: grpc.StatusCode, details: str):
        raise Aborted(code, details)


class Planner:
    """The servicer on one event loop, its store, and a fresh batch id per call."""

    def __init__(self, path):
        self.store = Store(path, clock=ManualClock(T0))
        self.service = IngestService(self.store, clock=ManualClock(T0))
        self.executor = ThreadPoolExecutor(1)
        self.servicer = PlannerServicer(self.service, self.executor)
        self.loop = asyncio.new_event_loop()
        self.batches = itertools.count(1)
        for node, address in (("n1", "127.0.0.2"), ("n2", "127.0.0.3")):
            assert self.call("Register", register_base(node, address))[0] == "OK"

    def call(self, method: str, request) -> tuple[str, str]:
        """("OK", "") or (the status name, its details); INTERNAL/UNKNOWN fail the test."""
        if method == "Report" and request.batch_id == BASE_BATCH:
            request.batch_id = f"{next(self.batches):032x}"
        try:
            self.loop.run_until_complete(getattr(self.servicer, method)(request, AbortContext()))
        except Aborted as err:
            code = err.code.name
            assert code in REFUSED, f"{method}: {code}: {err.details}"
            assert err.details.strip() and "\n" not in err.details, repr(err.details)
            return code, err.details
        return "OK", ""

    def close(self) -> None:
        self.loop.close()
        self.executor.shutdown()
        self.store.close()


@pytest.fixture(scope="module")
def planner(tmp_path_factory):
    p = Planner(tmp_path_factory.mktemp("hostile") / "planner.sqlite")
    yield p
    p.close()


# ------------------------------------------------------------------------- valid requests

def register_base(node: str = "n1", address: str = "127.0.0.2") -> hulk_pb2.RegisterRequest:
    gpu = hulk_pb2.Gpu(name="NVIDIA A100-SXM4-40GB", uuid="GPU-1", compute_capability=8.0,
                       memory_bytes=40 << 30)
    return hulk_pb2.RegisterRequest(
        node_id=node, hostname=f"host-{node}", agent_version="1.0", address=address,
        probe_port=7, throughput_port=5201, allowed_commands_known=True,
        allowed_commands=[hulk_pb2.CommandPrefix(argv=["python", "train.py"])],
        location=hulk_pb2.Location(city="", site="dc1"),
        inventory=hulk_pb2.GpuInventory(gpus=[gpu, gpu], driver_version="550.54"))


def heartbeat_base() -> hulk_pb2.HeartbeatRequest:
    progress = hulk_pb2.StepProgress(steps=10, total_steps=100, iteration_s=1.5,
                                     iteration_p90_s=2.0, compute_s=1.0, communication_s=0.5,
                                     samples=9, updated_ms=T0)
    return hulk_pb2.HeartbeatRequest(
        node_id="n1", time_ms=T0, spool_depth=3, spool_dropped=0,
        launch=hulk_pb2.LaunchStatus(plan_id="p1", job="j1", state=3, exit_code=0,
                                     detail="running", changed_at_ms=T0, progress=progress))


def report_base() -> hulk_pb2.ReportRequest:
    sample = ProbeSample("n2", T0 - 1000, int(ProbeKind.ICMP), 56, False, 0.5, 60_000.0)
    rtts = (4.0, 5.0, None, 6.5)
    summary = PeerSummary.of_samples([sample._replace(sent_at_ms=T0 - 2000 + k, rtt_ms=r or 0.0,
                                                      lost=r is None, timeout_ms=2000.0)
                                      for k, r in enumerate(rtts)])
    result = hulk_pb2.ThroughputResult(test_id="ab" * 16, sender_id="n2", start_ms=T0 - 5000,
                                       duration_s=10.0, bytes=10 ** 9, streams=4, gbps=0.8,
                                       ok=True)
    return hulk_pb2.ReportRequest(node_id="n1", batch_id=BASE_BATCH, samples=[sample.to_proto()],
                                  summaries=[summary.to_proto()], throughput=[result])


# -------------------------------------------------------------- what the store keeps

NODE_COLUMNS = {
    "hostname": REGISTER.limit("hostname"), "city": REGISTER.limit("location.city"),
    "agent_version": REGISTER.limit("agent_version"), "address": REGISTER.limit("address"),
    "driver_version": REGISTER.limit("inventory.driver_version"),
    "gpu_unavailable_reason": REGISTER.limit("inventory.unavailable_reason"),
    "probe_port": REGISTER.limit("probe_port"), "throughput_port": REGISTER.limit("throughput_port"),
    "gpu_count": REGISTER.limit("inventory.gpus"),
    "compute_capability": REGISTER.limit("inventory.gpus[].compute_capability"),
    "latitude": REGISTER.limit("location.latitude"),
    "longitude": REGISTER.limit("location.longitude"),
    "launch_plan_id": HEARTBEAT.limit("launch.plan_id"), "launch_job": HEARTBEAT.limit("launch.job"),
    "launch_detail": HEARTBEAT.limit("launch.detail"),
    "spool_depth": HEARTBEAT.limit("spool_depth"), "spool_dropped": HEARTBEAT.limit("spool_dropped"),
}
MS_TO_US = Bound(0, WIRE_BOUNDS["rtt_max_ms"].high * 1000, "microseconds", integer=True)
STORED = {   # table -> column -> its row
    "nodes": NODE_COLUMNS,
    "sites": {"name": REGISTER.limit("location.site")},
    "batches": {"batch_id": REPORT.limit("batch_id")},
    "samples": {"rtt_ms": WIRE_BOUNDS["rtt_ms"], "payload": WIRE_BOUNDS["payload_bytes"]},
    "summaries": {"count": WIRE_BOUNDS["count"], "lost": WIRE_BOUNDS["lost"],
                  "sum": WIRE_BOUNDS["rtt_sum_ms"], "sumsq": WIRE_BOUNDS["rtt_sum_sq_ms2"],
                  "min_us": MS_TO_US, "max_us": MS_TO_US},
}


def assert_store_within_bounds(store: Store) -> None:
    for table, columns in STORED.items():
        names = ", ".join(columns)
        for row in store.conn.execute(f"SELECT {names} FROM {table}"):
            for (column, limit), value in zip(columns.items(), row):
                assert within(limit, value), f"{table}.{column} = {value!r} is outside {limit}"
    for (gpus_json,) in store.conn.execute("SELECT gpus_json FROM nodes"):
        for gpu in json.loads(gpus_json or "[]"):
            assert within(REGISTER.limit("inventory.gpus[].name"), gpu.get("name"))
            assert within(REGISTER.limit("inventory.gpus[].uuid"), gpu.get("uuid"))


def test_the_valid_requests_are_accepted_and_kept(planner):
    """The bases the fuzzing mutates are valid: a refusal below is the mutation's doing."""
    assert planner.call("Register", register_base()) == ("OK", "")
    assert planner.call("Heartbeat", heartbeat_base()) == ("OK", "")
    assert planner.call("Report", report_base()) == ("OK", "")
    assert planner.store.conn.execute("SELECT count(*) FROM samples").fetchone()[0] >= 1
    assert planner.store.conn.execute("SELECT count(*) FROM summaries").fetchone()[0] >= 1
    assert_store_within_bounds(planner.store)


# ---------------------------------------------------------------------------- fuzzing

@pytest.mark.slow   # a fuzzer: 200 examples
@FUZZ
@given(mutated(register_base()) | messages(hulk_pb2.RegisterRequest))
def test_register_hostile_fields(planner, request_):
    code, _ = planner.call("Register", request_)
    event(code)   # --hypothesis-show-statistics: how many got through
    if code == "OK":
        assert_store_within_bounds(planner.store)


@pytest.mark.slow   # a fuzzer: 200 examples
@FUZZ
@given(mutated(heartbeat_base()) | messages(hulk_pb2.HeartbeatRequest))
def test_heartbeat_hostile_fields(planner, request_):
    code, _ = planner.call("Heartbeat", request_)
    event(code)   # --hypothesis-show-statistics: how many got through
    if code == "OK":
        assert_store_within_bounds(planner.store)


@pytest.mark.slow   # a fuzzer: 200 examples
@FUZZ
@given(mutated(report_base()) | messages(hulk_pb2.ReportRequest))
def test_report_hostile_fields(planner, request_):
    code, _ = planner.call("Report", request_)
    event(code)   # --hypothesis-show-statistics: how many got through
    if code == "OK":
        assert_store_within_bounds(planner.store)


# --------------------------------------------------------- each row is what is checked

def _edge_cases(table: Table, prefix: tuple, base) -> list:
    """(base, proto path, bound) for each numeric row naming one field of ``base``. A summary's
    numbers depend on each other (sums within count x min and max): its rows are not edges
    one at a time."""
    cases = []
    for field, limit in table.rows:
        if (not isinstance(limit, Bound) or any(c in field for c in " ,+(")
                or field.startswith("summaries[]")):
            continue
        path = prefix + tuple(0 if part == "" else part
                              for step in field.split(".") for part in step.split("[]")
                              if part or step.endswith("[]"))
        cases.append(pytest.param(base, path, limit, id=f"{table.name}.{field}"))
    return cases


def _with_coordinates() -> hulk_pb2.RegisterRequest:
    msg = register_base()
    msg.location.has_coordinates = True
    return msg


EDGES = (_edge_cases(REGISTER, (), _with_coordinates())
         + _edge_cases(HEARTBEAT, (), heartbeat_base())
         + _edge_cases(STEP_PROGRESS, ("launch", "progress"), heartbeat_base())
         + _edge_cases(REPORT, (), report_base())
         + _edge_cases(THROUGHPUT_RESULT, ("throughput", 0), report_base()))
METHODS = {hulk_pb2.RegisterRequest: "Register", hulk_pb2.HeartbeatRequest: "Heartbeat",
           hulk_pb2.ReportRequest: "Report"}


def _set(base, path: tuple, value):
    """A copy of ``base`` with ``path`` set to ``value`` (a repeated field: that many copies of
    its first item); None when the field's type cannot hold ``value``."""
    msg = type(base)()
    msg.CopyFrom(base)
    parent = msg
    for step in path[:-1]:
        parent = parent[step] if isinstance(step, int) else getattr(parent, step)
    field = parent.DESCRIPTOR.fields_by_name[path[-1]]
    target = getattr(parent, path[-1])
    if field.is_repeated:
        if value < 0:
            return None
        item = type(target[0])()
        item.CopyFrom(target[0])
        del target[:]
        for _ in range(int(value)):
            target.add().CopyFrom(item)
        return msg
    low, high = INT_RANGES.get(field.cpp_type, (-float("inf"), float("inf")))
    if not low <= value <= high:
        return None
    setattr(parent, path[-1], value)
    return msg


def test_the_edge_cases_cover_the_wire_tables():
    assert len(EDGES) >= 25, len(EDGES)


@pytest.mark.parametrize("base, path, bound", EDGES)
def test_each_wire_bound_is_what_the_planner_checks(planner, base, path, bound):
    method = METHODS[type(base)]
    for value in (bound.low, bound.high):
        value = int(value) if bound.integer else value
        msg = _set(base, path, value)
        assert msg is not None
        assert planner.call(method, msg) == ("OK", ""), f"{path} = {value!r} refused"
    for value in (below(bound), above(bound)):
        msg = _set(base, path, value)
        if msg is None:
            continue   # the wire type cannot carry it
        code, details = planner.call(method, msg)
        assert code == "INVALID_ARGUMENT", f"{path} = {value!r}: {code}"
        assert str(path[0]) in details, details
