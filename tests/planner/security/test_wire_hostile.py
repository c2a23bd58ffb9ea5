"""The real planner (TLS, NodeGuard, SQLite) against hostile bytes on the wire.

- a caller without a token is refused before its message is read;
- bytes that are no protobuf, or over a method's size bound, answer INVALID_ARGUMENT (not UNKNOWN);
- failed logins cost no scrypt and, limited per token id and per address, never lock out an
  enrolled agent behind the same NAT;
- the health service says NOT_SERVING while the store cannot write, SERVING once it can.
"""

from __future__ import annotations

import subprocess
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from hulk.v1 import hulk_pb2, hulk_pb2_grpc
from hulk.wire.records import RegisterRequest
from tests.helpers.threaded_planner import ThreadedPlanner, bearer, channel, register_request, sample

REGISTER = "/hulk.v1.Planner/Register"
REPORT = "/hulk.v1.Planner/Report"
GARBAGE = b"\xff" * 64            # field 31, wire type 7: no protobuf parser accepts it


def raw_call(ch: grpc.Channel, method: str, data: bytes, metadata=()) -> tuple[grpc.StatusCode, str]:
    call = ch.unary_unary(method, request_serializer=None, response_deserializer=None)
    try:
        call(data, metadata=metadata, timeout=30)
    except grpc.RpcError as err:
        return err.code(), err.details() or ""
    return grpc.StatusCode.OK, ""


@pytest.fixture
def enrolled(planner):
    return planner.credentials.issue("n1").token


def test_no_token_is_refused_before_the_message_is_read(planner, pki):
    with channel(planner.target, pki) as ch:
        code, details = raw_call(ch, REGISTER, GARBAGE)
        assert code == grpc.StatusCode.UNAUTHENTICATED, details   # not a parse error: never parsed
        code, _ = raw_call(ch, REPORT, GARBAGE * 16_000, metadata=bearer("hulk1.0000.bad"))
        assert code == grpc.StatusCode.UNAUTHENTICATED
    assert planner.node_ids() == set()


def test_garbage_and_oversized_messages_are_invalid_argument(planner, pki, enrolled):
    with channel(planner.target, pki) as ch:
        code, details = raw_call(ch, REGISTER, GARBAGE, metadata=bearer(enrolled))
        assert code == grpc.StatusCode.INVALID_ARGUMENT
        assert "not a hulk.v1.RegisterRequest message" in details
        big = register_request("n1")
        big.hostname = "h" * (100 << 10)           # a 100 KiB Register: over its 64 KiB bound
        code, details = raw_call(ch, REGISTER, big.SerializeToString(), metadata=bearer(enrolled))
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "the limit is 65536" in details
        stub = hulk_pb2_grpc.PlannerStub(ch)
        stub.Register(register_request("n1"), metadata=bearer(enrolled), timeout=30)  # still fine
    assert planner.node_ids() == {"n1"}


@pytest.mark.slow
def test_failed_logins_from_one_address_do_not_lock_out_an_agent_behind_the_same_nat(planner, pki):
    token = planner.credentials.issue("n2").token        # valid, never presented yet
    with channel(planner.target, pki) as ch:
        stub = hulk_pb2_grpc.PlannerStub(ch)
        for i in range(25):       # more than the per-address allowance, misconfigured agents
            with pytest.raises(grpc.RpcError) as err:
                stub.Register(register_request("x"), timeout=30,
                              metadata=bearer(f"hulk1.{i:016x}.{'A' * 43}"))
            assert err.value.code() in (grpc.StatusCode.UNAUTHENTICATED,
                                        grpc.StatusCode.RESOURCE_EXHAUSTED)
        stub.Register(register_request("n2"), metadata=bearer(token), timeout=30)
        # An unknown token id is refused by the tag check each time: no scrypt to limit.
        bad = f"hulk1.{'f' * 16}.{'B' * 43}"
        codes = []
        for _ in range(8):
            with pytest.raises(grpc.RpcError) as err:
                stub.Register(register_request("x"), metadata=bearer(bad), timeout=30)
            codes.append(err.value.code())
        assert codes == [grpc.StatusCode.UNAUTHENTICATED] * 8
    assert "n2" in planner.node_ids()


@pytest.fixture
def tiny_disk(tmp_path):
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(mount)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


@pytest.mark.process
def test_health_is_not_serving_while_the_store_cannot_write(tiny_disk, pki):
    planner = ThreadedPlanner(tiny_disk / "planner.sqlite", pki)
    try:
        token = planner.credentials.issue("n1").token
        planner.credentials.issue("n2")
        with channel(planner.target, pki) as ch:
            stub = hulk_pb2_grpc.PlannerStub(ch)
            health = health_pb2_grpc.HealthStub(ch)
            stub.Register(register_request("n1"), metadata=bearer(token), timeout=30)
            planner.in_store(planner.runtime.store.register,
                             RegisterRequest("n2", address="127.0.0.1"))

            def status() -> int:
                return health.Check(health_pb2.HealthCheckRequest(service="hulk.v1.Planner"),
                                    timeout=30).status

            assert status() == health_pb2.HealthCheckResponse.SERVING
            filler = tiny_disk / "filler"
            with open(filler, "wb") as f:              # fill the disk to the last byte
                try:
                    while True:
                        f.write(b"\0" * 65536)
                        f.flush()
                except OSError:
                    pass
            now = int(time.time() * 1000)
            report = hulk_pb2.ReportRequest(node_id="n1", batch_id="b1",
                                            samples=[sample("n2", 1.0, now - k) for k in range(2000)])
            with pytest.raises(grpc.RpcError) as err:
                stub.Report(report, metadata=bearer(token), timeout=30)
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
            assert status() == health_pb2.HealthCheckResponse.NOT_SERVING
            filler.unlink()
            answer = stub.Report(report, metadata=bearer(token), timeout=30)
            assert answer.accepted == 2000
            assert status() == health_pb2.HealthCheckResponse.SERVING
    finally:
        planner.stop()
