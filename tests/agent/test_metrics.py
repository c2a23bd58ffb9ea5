"""The agent's metrics (agent/metrics.py): what the runtime's parts report moves the counters;
placement refusals are counted by reason through the real subscriber's checks."""

from __future__ import annotations

import pytest
from prometheus_client import generate_latest

from agent.config import load_config
from agent.metrics import MAX_PEER_LABELS, OTHER_PEERS, AgentMetrics, report_failure_reason
from agent.placement import PlacementSubscriber
from agent.spool import Spool
from hulk import errors
from hulk.errors import ConfigError
from hulk.wire.broker import parse_broker_url, placement_topic
from hulk.wire.placement import NodePlacement, Role
from hulk.wire.records import LaunchState, LaunchStatus, ProbeKind, ProbeSample, RegisterAnswer
from hulk.wire.signing import Signer
from tests.helpers.signing import SIGNER, T0, VERIFIER

HOUR = 3_600_000


def value(metrics: AgentMetrics, name: str, **labels: str) -> float:
    got = metrics.registry.get_sample_value(name, labels)
    return 0.0 if got is None else got


def probe(peer: str, rtt_ms: float, lost: bool = False) -> ProbeSample:
    return ProbeSample(peer, T0, int(ProbeKind.ICMP), 56, lost, rtt_ms, 2000.0)


def test_probes_losses_and_rtt_per_peer():
    m = AgentMetrics("n1")
    m.probed([probe("n2", 12.0), probe("n2", 30.0), probe("n2", 0.0, lost=True),
              probe("n3", 0.4)])
    assert value(m, "hulk_agent_probes_total", peer="n2") == 3
    assert value(m, "hulk_agent_probe_losses_total", peer="n2") == 1
    assert value(m, "hulk_agent_rtt_seconds_count") == 3
    assert value(m, "hulk_agent_rtt_seconds_sum") == pytest.approx(0.0424)
    assert value(m, "hulk_agent_rtt_seconds_bucket", le="0.0005") == 1
    assert value(m, "hulk_agent_peer_rtt_seconds", peer="n2") == pytest.approx(0.030)
    assert value(m, "hulk_agent_peer_rtt_seconds", peer="n3") == pytest.approx(0.0004)


def test_per_peer_series_are_capped_and_the_rest_share_one_label():
    m = AgentMetrics("n1")
    m.probed([probe(f"p{i:03d}", 10.0) for i in range(MAX_PEER_LABELS + 10)])
    m.probed([probe("p000", 10.0), probe("p999", 10.0, lost=True)])
    peers = {s.labels["peer"] for family in m.registry.collect() if family.name ==
             "hulk_agent_probes" for s in family.samples if s.name.endswith("_total")}
    assert len(peers) == MAX_PEER_LABELS + 1 and OTHER_PEERS in peers
    assert value(m, "hulk_agent_probes_total", peer="p000") == 2
    assert value(m, "hulk_agent_probes_total", peer=OTHER_PEERS) == 11
    assert value(m, "hulk_agent_probe_losses_total", peer=OTHER_PEERS) == 1


def test_reports_heartbeats_and_clock_skew():
    m = AgentMetrics("n1")
    m.reported(500, 3, duplicate=False)
    m.reported(500, 3, duplicate=True)   # the planner had it already: rejected counted once
    m.report_failed(errors.UnavailableError("planner down"))
    m.report_failed(errors.InputError("bad batch"))
    assert value(m, "hulk_agent_reports_total") == 2
    assert value(m, "hulk_agent_reported_samples_total") == 1000
    assert value(m, "hulk_agent_samples_rejected_by_planner_total") == 3
    assert value(m, "hulk_agent_report_failures_total", reason="unavailable") == 1
    assert value(m, "hulk_agent_report_failures_total", reason="refused") == 1
    # Sent at 1000, answered at 1100 by a planner whose clock read 2050 then: ours is 1 s behind.
    m.heartbeat(True, 1000, 1100, 2050)
    m.heartbeat(False)
    assert value(m, "hulk_agent_clock_skew_seconds") == pytest.approx(-1.0)
    assert value(m, "hulk_agent_heartbeats_total", result="ok") == 1
    assert value(m, "hulk_agent_heartbeats_total", result="failed") == 1


@pytest.mark.parametrize("err, reason", [
    (errors.NotFoundError("x"), "unregistered"), (errors.UnauthenticatedError("x"), "denied"),
    (errors.StoreError("x"), "spool"), (errors.HulkError("x"), "error")])
def test_report_failure_reasons(err, reason):
    assert report_failure_reason(err) == reason


def test_launches_exits_and_refused_commands():
    m = AgentMetrics("n1")
    idle = LaunchStatus(LaunchState.IDLE)
    starting = LaunchStatus(LaunchState.STARTING, plan_id="p", job="j")
    running = LaunchStatus(LaunchState.RUNNING, plan_id="p", job="j", detail="pid 7")
    m.launch_changed(idle, starting)
    m.launch_changed(starting, running)
    m.launch_changed(running, LaunchStatus(LaunchState.RUNNING, plan_id="p", job="j",
                                           detail="step 10"))   # a detail update: no new launch
    assert value(m, "hulk_agent_launches_total") == 1
    assert value(m, "hulk_agent_launch_state", state="running") == 1
    assert value(m, "hulk_agent_launch_state", state="idle") == 0
    m.launch_changed(running, LaunchStatus(LaunchState.EXITED, plan_id="p", job="j", exit_code=1))
    assert value(m, "hulk_agent_job_exits_total", outcome="error") == 1
    refused = LaunchStatus(LaunchState.FAILED, plan_id="p2", job="k",
                           detail="refused: command 'rm' refused")
    m.launch_changed(idle, refused)
    m.launch_changed(refused, LaunchStatus(LaunchState.FAILED, plan_id="p3", job="k",
                                           detail="cannot start: no such file"))
    assert value(m, "hulk_agent_placement_refusals_total", reason="command_not_allowed") == 1
    assert value(m, "hulk_agent_launch_failures_total") == 1


def role(job: str) -> Role:
    return Role(plan_id="p", job=job, phase=0, stage=0, num_stages=1, layer_lo=0, layer_hi=4,
                replica=0, num_replicas=1, rank=0, world_size=1, rendezvous_address="127.0.0.1",
                rendezvous_port=29500, micro_batch=1, command=("python", "-c", "pass"))


def placement(*, plan_id: str, issued: int, signer: Signer = SIGNER, node: str = "n1",
              expires: int | None = None) -> bytes:
    bare = NodePlacement(fleet="lab", node=node, plan_id=plan_id, roles=(role("j"),))
    return bare.signed(signer, issued_at_ms=issued, seq=issued,
                       expires_at_ms=issued + HOUR if expires is None else expires).to_bytes()


async def test_placement_refusals_are_counted_by_reason(tmp_path):
    m = AgentMetrics("n1")
    sub = PlacementSubscriber(parse_broker_url("mqtt://127.0.0.1:1"), fleet="lab", node_id="n1",
                              state_dir=tmp_path, verifier=VERIFIER, events=m)
    topic = placement_topic("lab", "n1")
    await sub.handle(topic, placement(plan_id="p2", issued=T0 + 10_000))   # accepted
    await sub.handle(topic, placement(plan_id="p3", issued=T0 + 20_000, signer=Signer.generate()))
    await sub.handle(topic, placement(plan_id="p4", issued=T0 + 20_000, node="n9"))
    await sub.handle(topic, placement(plan_id="p5", issued=T0 - 2 * HOUR, expires=T0 - HOUR))
    await sub.handle(topic, placement(plan_id="p1", issued=T0 + 5_000))
    await sub.handle(topic, b"{not json")
    keyless = PlacementSubscriber(parse_broker_url("mqtt://127.0.0.1:1"), fleet="lab",
                                  node_id="n1", state_dir=tmp_path / "k", events=m)
    await keyless.handle(topic, placement(plan_id="p6", issued=T0 + 30_000))
    for reason in ("bad_signature", "misaddressed", "expired", "replayed", "malformed", "no_key"):
        assert value(m, "hulk_agent_placement_refusals_total", reason=reason) == 1, reason
    assert sub.current is not None and sub.current.plan_id == "p2"


def test_the_scrape_reads_the_spool_and_registration(tmp_path):
    class Runtime:
        spool = Spool(tmp_path / "spool.sqlite", 100)
        registration = None

    runtime = Runtime()
    m = AgentMetrics("n1")
    m.watch(runtime)
    runtime.spool.hold([probe("n2", 5.0)] * 3)
    assert value(m, "hulk_agent_spool_depth_samples") == 3
    assert value(m, "hulk_agent_spool_max_samples") == 100
    assert value(m, "hulk_agent_registered") == 0
    runtime.registration = RegisterAnswer(peers=(), settings=None, fleet="lab", server_time_ms=0)
    text = generate_latest(m.registry).decode()
    assert "hulk_agent_registered 1.0" in text and "hulk_agent_spool_dropped_samples_total 0.0" in text
    runtime.spool.close()


def test_the_metrics_setting_comes_from_file_variable_or_flag(tmp_path):
    base = {"planner": "p:1", "node_id": "n1"}
    assert load_config(base, env_reader=lambda _: None).metrics == ""
    assert load_config(base, env_reader={"HULK_METRICS": "0.0.0.0:9109"}.get).metrics == "0.0.0.0:9109"
    config = tmp_path / "agent.yaml"
    config.write_text("metrics: 127.0.0.1:9109\n")
    assert load_config({**base, "config": str(config)}, env_reader=lambda _: None).metrics == \
        "127.0.0.1:9109"
    with pytest.raises(ConfigError) as caught:
        load_config({**base, "metrics": "9109"}, env_reader=lambda _: None)
    assert str(caught.value).startswith("--metrics: metrics: expected HOST:PORT")
