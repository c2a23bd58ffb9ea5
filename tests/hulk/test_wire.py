"""The gRPC records (hulk.wire.records): each survives protobuf bytes both ways, field by field."""

from __future__ import annotations

import pytest

from hulk.errors import InputError
from hulk.v1 import hulk_pb2
from hulk.wire.records import (GpuInfo, HeartbeatRequest, HeartbeatResult, Inventory, LaunchState,
                               LaunchStatus, NodeLocation, Peer, ProbeKind, ProbeSample,
                               ProbeSettings, RegisterAnswer, RegisterRequest, ReportRequest,
                               ReportResult)

A100 = GpuInfo("NVIDIA A100-SXM4-40GB", "GPU-1", 8.0, 40 * 10**9)
SAMPLES = (ProbeSample("b", 1_700_000_000_000, ProbeKind.ICMP, 56, False, 0.25, 2000.0),
           ProbeSample("c", 1_700_000_000_001, ProbeKind.TCP, 0, True, 0.0, 500.0))
LAUNCH = LaunchStatus(LaunchState.EXITED, plan_id="p1", job="gpt", exit_code=-9,
                      detail="killed", changed_at_ms=7)

RECORDS = [
    SAMPLES[0],
    ProbeSettings(),
    ProbeSettings(interval_s=0.5, packets_per_round=1, timeout_s=0.25, payload_bytes=0,
                  max_concurrency=1, max_batch=5),
    A100,
    Inventory(gpus=(A100, GpuInfo("NVIDIA T4")), driver_version="550.54"),
    Inventory(unavailable_reason="NVML library not found"),
    NodeLocation("Tokyo", (35.68, 139.69)),
    NodeLocation(),
    NodeLocation("Paris", (48.86, 2.35), site="par-dc2"),
    NodeLocation(site="aws:us-east-1"),
    RegisterRequest("a", hostname="host-a", location=NodeLocation("Paris", (48.86, 2.35)),
                    agent_version="0.1.0", inventory=Inventory(gpus=(A100,) * 2),
                    address="10.0.0.1", probe_port=7000),
    RegisterRequest("bare"),
    RegisterRequest("policy", allowed_commands=(("python", "train.py"), ("torchrun",))),
    RegisterRequest("refuses-all", allowed_commands=()),
    Peer("b", "10.0.0.2", 7001),
    RegisterAnswer((Peer("b", "10.0.0.2"), Peer("c", "10.0.0.3", 9)), ProbeSettings(), "lab",
                   1_700_000_000_000),
    RegisterAnswer((), ProbeSettings(0, 0, 0, 0, 0, 0), "", 0),
    ReportRequest("a", "batch-1", SAMPLES, spool_dropped=3),
    ReportRequest("a", "empty"),
    ReportResult(10, 2, False),
    ReportResult(0, 0, True),
    LAUNCH,
    LaunchStatus(),
    HeartbeatRequest("a", 1_700_000_000_000, spool_depth=12, spool_dropped=3, launch=LAUNCH),
    HeartbeatRequest("a"),
    HeartbeatResult(5, reregister=True),
    HeartbeatResult(6, peers_changed=True),
]


@pytest.mark.parametrize("record", RECORDS, ids=lambda r: type(r).__name__)
def test_record_round_trips_through_protobuf_bytes(record):
    message = record.to_proto()
    wire = message.SerializeToString()
    parsed = type(message).FromString(wire)
    assert type(record).from_proto(parsed) == record


def test_records_fill_the_messages_field_by_field():
    assert ProbeSettings().to_proto() == hulk_pb2.ProbeSettings(
        interval_s=60.0, packets_per_round=3, timeout_s=2.0, payload_bytes=56,
        max_concurrency=64, max_batch=2000)
    register = RegisterRequest("a", "host-a", NodeLocation("Paris", (48.86, 2.35)), "0.1.0",
                               Inventory((A100,), "550.54", ""), "10.0.0.1", 7000)
    assert register.to_proto() == hulk_pb2.RegisterRequest(
        node_id="a", hostname="host-a", agent_version="0.1.0", address="10.0.0.1",
        probe_port=7000,
        location=hulk_pb2.Location(city="Paris", has_coordinates=True, latitude=48.86,
                                   longitude=2.35),
        inventory=hulk_pb2.GpuInventory(driver_version="550.54", gpus=[hulk_pb2.Gpu(
            name=A100.name, uuid="GPU-1", compute_capability=8.0, memory_bytes=40 * 10**9)]))
    assert SAMPLES[1].to_proto() == hulk_pb2.Sample(
        peer_id="c", sent_at_ms=1_700_000_000_001, kind=hulk_pb2.PROBE_KIND_TCP,
        payload_bytes=0, lost=True, rtt_ms=0.0, timeout_ms=500.0)
    assert LAUNCH.to_proto() == hulk_pb2.LaunchStatus(
        plan_id="p1", job="gpt", state=hulk_pb2.LAUNCH_STATE_EXITED, exit_code=-9,
        detail="killed", changed_at_ms=7)
    answer = hulk_pb2.RegisterResponse(peers=[hulk_pb2.Peer(node_id="b", address="x")],
                                       fleet="lab", server_time_ms=9)
    assert RegisterAnswer.from_proto(answer) == RegisterAnswer(
        (Peer("b", "x"),), ProbeSettings(0, 0, 0, 0, 0, 0), "lab", 9)   # 0: "not set"


def test_enums_have_the_protos_numbers():
    assert {k.name: int(k) for k in ProbeKind} == {
        name.removeprefix("PROBE_KIND_"): number
        for name, number in hulk_pb2.ProbeKind.items() if number}
    assert {s.name: int(s) for s in LaunchState} == {
        name.removeprefix("LAUNCH_STATE_"): number for name, number in hulk_pb2.LaunchState.items()}


def test_a_heartbeat_without_launch_status_reads_as_none():
    assert HeartbeatRequest.from_proto(hulk_pb2.HeartbeatRequest(node_id="a")).launch is None
    assert not HeartbeatRequest("a").to_proto().HasField("launch")


def test_an_unknown_launch_state_is_an_input_error_naming_the_field():
    message = hulk_pb2.HeartbeatRequest(node_id="a", launch=hulk_pb2.LaunchStatus(state=42))
    with pytest.raises(InputError, match=r"^launch\.state: unknown LaunchState value 42$"):
        HeartbeatRequest.from_proto(message)


def test_a_sample_kind_from_a_newer_agent_is_kept_as_sent():
    message = hulk_pb2.ReportRequest(node_id="a", batch_id="b",
                                     samples=[hulk_pb2.Sample(peer_id="p", kind=7)])
    assert ReportRequest.from_proto(message).samples[0].kind == 7


def test_a_location_carries_its_site_as_field_5_and_an_old_agents_reads_as_no_site():
    # Field 5, length-delimited (tag 0x2a): the number the proto gives the site, forever.
    assert NodeLocation(site="par-dc2").to_proto().SerializeToString() == b"\x2a\x07par-dc2"
    # What an agent from before the site field sends: the city alone.
    old = hulk_pb2.RegisterRequest.FromString(b"\n\x01a\x1a\x07\n\x05Paris")
    assert RegisterRequest.from_proto(old).location == NodeLocation("Paris", None, "")
