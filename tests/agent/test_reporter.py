"""The reporter and runtime against a real grpc.aio server on 127.0.0.1 (a planner test double)."""

from __future__ import annotations

import asyncio
import random
import socket
import subprocess
from pathlib import Path

import grpc
import pytest

from agent.config import load_config
from agent.icmp import IcmpPinger, detect_icmp_mode
from agent.reporter import Backoff, GrpcPlannerClient, Reporter
from agent.runtime import AgentRuntime
from agent.spool import Spool
from hulk import errors
from hulk.v1 import hulk_pb2, hulk_pb2_grpc
from hulk.wire.records import (Inventory, LaunchState, LaunchStatus, ProbeKind, ProbeSample,
                               RegisterRequest)
from tests.helpers.planner_double import PlannerDouble, start_server
from tests.helpers.ports import free_port
from tests.helpers.waits import wait_until_async


def samples(n: int, start: int = 0) -> list[ProbeSample]:
    return [ProbeSample(peer_id=f"peer-{i % 3}", sent_at_ms=1_700_000_000_000 + i,
                        kind=ProbeKind.ICMP, payload_bytes=56, lost=i % 10 == 0,
                        rtt_ms=0.0 if i % 10 == 0 else 0.25 + i / 1000, timeout_ms=2000.0)
            for i in range(start, start + n)]


def fast_backoff() -> Backoff:
    return Backoff(initial_s=0.05, factor=2.0, cap_s=0.2, jitter=0.5, rng=random.Random(5))


async def test_acknowledged_batches_leave_the_spool(tmp_path: Path):
    planner = PlannerDouble()
    server, port = await start_server(planner)
    client = GrpcPlannerClient.connect(f"127.0.0.1:{port}", insecure=True)
    spool = Spool(tmp_path / "spool.sqlite", max_samples=10_000)
    try:
        written = samples(250)
        spool.append(written)
        reporter = Reporter("node-1", spool, client, max_batch=100)
        assert [await reporter.send_one() for _ in range(4)] == [100, 100, 50, None]
        assert spool.depth == 0
        assert [len(r.samples) for r in planner.seen.reports] == [100, 100, 50]
        assert all(r.node_id == "node-1" and r.spool_dropped == 0 for r in planner.seen.reports)
        stored = planner.stored_samples()
        assert [(s.peer_id, s.sent_at_ms, s.kind, s.payload_bytes, s.lost, s.timeout_ms)
                for s in stored] == [(s.peer_id, s.sent_at_ms, int(s.kind), 56, s.lost, 2000.0)
                                     for s in written]
        assert [round(s.rtt_ms, 6) for s in stored] == [round(s.rtt_ms, 6) for s in written]
    finally:
        await client.close()
        await server.stop(None)
        spool.close()


@pytest.mark.slow
async def test_planner_down_then_back_gets_every_sample_exactly_once(tmp_path: Path):
    port = free_port()
    client = GrpcPlannerClient.connect(f"127.0.0.1:{port}", insecure=True, call_timeout_s=2.0)
    spool = Spool(tmp_path / "spool.sqlite", max_samples=10_000)
    reporter = Reporter("node-1", spool, client, max_batch=40, backoff=fast_backoff(),
                        linger_s=0.1)
    task = asyncio.create_task(reporter.run())
    server = None
    try:
        spool.append(samples(100))
        reporter.wake()
        await asyncio.sleep(0.6)                      # planner down: nothing may leave
        assert spool.depth == 100 and reporter.backoff.attempt >= 2
        planner = PlannerDouble()
        planner.fail_after_store = 1                  # first answer lost after storing
        server, _ = await start_server(planner, port)
        spool.append(samples(30, start=100))          # arrives while the backlog drains
        reporter.wake()
        await wait_until_async(lambda: spool.depth == 0, timeout=15)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await client.close()
        if server is not None:
            await server.stop(None)
        spool.close()
    sent_ids = [r.batch_id for r in planner.seen.reports]
    assert sent_ids[0] == sent_ids[1]                 # the retry reused the batch id
    assert len(set(sent_ids)) == len(planner.seen.stored)
    stored = sorted(s.sent_at_ms for s in planner.stored_samples())
    assert stored == [1_700_000_000_000 + i for i in range(130)]   # every sample, exactly once


async def test_token_is_sent_and_a_wrong_one_is_unauthenticated(tmp_path: Path):
    planner = PlannerDouble(require_token="s3cret")
    server, port = await start_server(planner)
    good = GrpcPlannerClient.connect(f"127.0.0.1:{port}", insecure=True, token="s3cret")
    bad = GrpcPlannerClient.connect(f"127.0.0.1:{port}", insecure=True, token="guess")
    try:
        result = await good.heartbeat("n", 1, 0, 0, LaunchStatus())
        assert result.server_time_ms == 2
        assert planner.seen.metadata[-1]["authorization"] == "Bearer s3cret"
        with pytest.raises(errors.UnauthenticatedError, match="planner Heartbeat: bad token"):
            await bad.heartbeat("n", 1, 0, 0, LaunchStatus())
    finally:
        await good.close()
        await bad.close()
        await server.stop(None)


async def test_planner_down_is_unavailable_error():
    client = GrpcPlannerClient.connect(f"127.0.0.1:{free_port()}", insecure=True,
                                       call_timeout_s=2.0)
    try:
        with pytest.raises(errors.UnavailableError, match="^planner Register: "):
            await client.register(RegisterRequest("n", "h", address="127.0.0.1"))
    finally:
        await client.close()


class RecordingComponent:
    """What the placement subscriber will look like: waits for registration, reports status."""

    name = "recorder"

    def __init__(self):
        self.fleet = None

    async def run(self, runtime: AgentRuntime) -> None:
        registration = await runtime.wait_registered()
        self.fleet = registration.fleet
        runtime.set_launch_status(LaunchStatus(state=LaunchState.RUNNING, plan_id="plan-1",
                                               job="gpt2-xl"))
        await asyncio.Event().wait()                  # runs until the runtime stops


@pytest.mark.slow
async def test_runtime_registers_probes_reports_heartbeats_and_stops(tmp_path: Path):
    mode = detect_icmp_mode()
    if mode is None:
        pytest.skip("no ICMP socket allowed here")
    planner = PlannerDouble(peers=[("lo2", "127.0.0.2", 0), ("lo3", "127.0.0.3", 0)],
                            settings=hulk_pb2.ProbeSettings(interval_s=0.5, packets_per_round=2,
                                                            timeout_s=0.5, max_batch=5),
                            fleet="lab", require_token="tok")
    server, port = await start_server(planner)
    config = load_config({"planner": f"127.0.0.1:{port}", "node_id": "node-a",
                          "address": "127.0.0.1", "city": "tokyo",
                          "state_dir": str(tmp_path), "insecure": "1"},
                         env_reader=lambda name: "tok" if name == "HULK_TOKEN" else None)
    component = RecordingComponent()
    runtime = AgentRuntime(
        config, client=GrpcPlannerClient.connect(config.planner, insecure=True,
                                                 token=config.token),
        spool=Spool(config.spool_path, config.spool_max), pinger=IcmpPinger(mode),
        heartbeat_interval_s=0.2, rng=random.Random(2))
    runtime.add_component(component)
    task = asyncio.create_task(runtime.run())
    try:
        await wait_until_async(lambda: len(planner.seen.registers) >= 1 and
                               sum(r.packets for r in planner.stored_rounds()) >= 8 and
                               len(planner.seen.heartbeats) >= 1, timeout=10)
        planner.reregister_next = True
        await wait_until_async(lambda: len(planner.seen.registers) >= 2, timeout=5)
        await wait_until_async(lambda: planner.seen.heartbeats[-1].launch.state
                               == hulk_pb2.LAUNCH_STATE_RUNNING, timeout=5)
    finally:
        runtime.request_stop()
        exit_code = await asyncio.wait_for(task, timeout=10)
        await server.stop(None)
    assert exit_code == 0
    register = planner.seen.registers[0]
    assert (register.node_id, register.address, register.agent_version) == \
        ("node-a", "127.0.0.1", "0.1.0")
    assert register.hostname == socket.gethostname()
    assert register.location.city == "Tokyo" and register.location.has_coordinates
    assert abs(register.location.latitude - 35.68) < 0.01
    assert register.inventory.unavailable_reason          # no GPUs on this machine, with a reason
    assert all(m.get("authorization") == "Bearer tok" for m in planner.seen.metadata)
    assert component.fleet == "lab"
    beat = planner.seen.heartbeats[-1]
    assert beat.node_id == "node-a" and beat.launch.plan_id == "plan-1"
    assert beat.launch.job == "gpt2-xl" and beat.launch.changed_at_ms > 0
    stored = planner.stored_summaries()             # one summary per peer and round
    assert {s.peer_id for s in stored} == {"lo2", "lo3"} and not planner.stored_samples()
    odd = [s for s in stored if not (s.kind == hulk_pb2.PROBE_KIND_ICMP and s.payload_bytes == 56
                                     and s.count == 2 and not s.lost
                                     and 0 < s.rtt_min_ms <= s.rtt_max_ms < 5.0)]
    assert odd == []
    assert all(len(r.summaries) <= 5 for r in planner.seen.reports)  # the planner's max_batch
    reopened = Spool(config.spool_path, config.spool_max)          # flushed on stop
    assert reopened.depth == 0
    reopened.close()


class FlakyComponent:
    name = "flaky"

    def __init__(self):
        self.starts = 0

    async def run(self, runtime: AgentRuntime) -> None:
        self.starts += 1
        if self.starts == 1:
            raise RuntimeError("first start fails")
        await asyncio.Event().wait()


@pytest.mark.slow
async def test_runtime_waits_for_a_late_planner_and_restarts_a_failed_component(tmp_path: Path):
    port = free_port()
    config = load_config({"planner": f"127.0.0.1:{port}", "node_id": "late",
                          "address": "127.0.0.1", "state_dir": str(tmp_path), "insecure": "1"},
                         env_reader=lambda name: None)
    flaky = FlakyComponent()
    runtime = AgentRuntime(
        config, client=GrpcPlannerClient.connect(config.planner, insecure=True,
                                                 call_timeout_s=1.0),
        spool=Spool(config.spool_path, config.spool_max), pinger=None,
        inventory_reader=lambda: Inventory(unavailable_reason="test host"),
        components=[flaky], register_backoff=fast_backoff(), restart_delay_s=0.1)
    task = asyncio.create_task(runtime.run())
    server = None
    try:
        await asyncio.sleep(0.5)                      # planner not there yet: retrying
        assert runtime.registration is None and not task.done()
        planner = PlannerDouble(peers=[("p", "127.0.0.2", 0)])
        server, _ = await start_server(planner, port)
        await wait_until_async(lambda: runtime.registration is not None, timeout=10)
        await wait_until_async(lambda: flaky.starts >= 2, timeout=5)
    finally:
        runtime.request_stop()
        assert await asyncio.wait_for(task, timeout=10) == 0
        if server is not None:
            await server.stop(None)
    assert planner.seen.registers[0].inventory.unavailable_reason == "test host"
    assert runtime.prober.peer_count == 1


def _self_signed_cert(directory: Path) -> tuple[Path, Path]:
    """A throwaway certificate for 127.0.0.1 made with the openssl command."""
    cert, key = directory / "planner.pem", directory / "planner.key"
    try:
        subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                        "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                        "-keyout", str(key), "-out", str(cert)],
                       check=True, capture_output=True, timeout=60)
    except (OSError, subprocess.CalledProcessError) as err:
        pytest.skip(f"openssl cannot make a test certificate: {err}")
    return cert, key


@pytest.mark.process
async def test_tls_with_a_ca_file_and_token(tmp_path: Path):
    cert, key = _self_signed_cert(tmp_path)
    planner = PlannerDouble(require_token="t0k")
    server = grpc.aio.server()
    hulk_pb2_grpc.add_PlannerServicer_to_server(planner, server)
    port = server.add_secure_port("127.0.0.1:0", grpc.ssl_server_credentials(
        [(key.read_bytes(), cert.read_bytes())]))
    await server.start()
    trusted = GrpcPlannerClient.connect(f"127.0.0.1:{port}", insecure=False, ca=cert,
                                        token="t0k", call_timeout_s=5.0)
    untrusted = GrpcPlannerClient.connect(f"127.0.0.1:{port}", insecure=False, token="t0k",
                                          call_timeout_s=2.0)    # system CAs: not ours
    try:
        result = await trusted.heartbeat("n", 1, 0, 0, LaunchStatus())
        assert result.server_time_ms == 2
        assert planner.seen.metadata[-1]["authorization"] == "Bearer t0k"
        with pytest.raises(errors.UnavailableError):
            await untrusted.heartbeat("n", 1, 0, 0, LaunchStatus())
    finally:
        await trusted.close()
        await untrusted.close()
        await server.stop(None)


def test_unreadable_ca_is_a_config_error(tmp_path: Path):
    with pytest.raises(errors.ConfigError, match="cannot read the CA certificate"):
        GrpcPlannerClient.connect("127.0.0.1:1", insecure=False, ca=tmp_path / "missing.pem")
