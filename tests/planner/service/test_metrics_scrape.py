"""`/metrics` over real HTTP from real processes: `hulk-planner serve --metrics` and two
`hulk-agent --metrics` probing each other with real ICMP on 127.0.0.2-3, scraped as Prometheus
would; the values move (samples stored, a rejected sample counted under its reason, a stopped
agent's node turns silent). A port in use or a bad HOST:PORT ends either program with one line
and exit code 2."""

from __future__ import annotations

import os
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from hulk import __version__
from hulk.v1 import hulk_pb2, hulk_pb2_grpc
from tests.helpers.paths import REPO
from tests.helpers.ports import free_port
from tests.helpers.processes import (agent_command, run_cli, start_planner, stop_process,
                                     worktree_env)
from tests.helpers.waits import wait_until

pytestmark = pytest.mark.process

NODES = {"m2": "127.0.0.2", "m3": "127.0.0.3"}


def scrape(url: str) -> dict[tuple[str, frozenset], float]:
    """(sample name, labels) -> value, parsed with prometheus-client's own text parser."""
    with urllib.request.urlopen(url, timeout=10) as answer:
        assert answer.status == 200
        assert answer.headers["Content-Type"].startswith("text/plain")
        text = answer.read().decode()
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def get(metrics: dict, name: str, **labels: str) -> float | None:
    return metrics.get((name, frozenset(labels.items())))


def start_agent(node_id: str, address: str, planner: str, state: Path, metrics: str
                ) -> subprocess.Popen:
    state.mkdir(parents=True, exist_ok=True)
    with (state / "agent.log").open("w") as log:
        return subprocess.Popen(
            [*agent_command(), "--planner", planner, "--node-id", node_id, "--address", address,
             "--interval", "1", "--state-dir", str(state), "--insecure", "--metrics", metrics],
            cwd=REPO, stdout=log, stderr=subprocess.STDOUT, env=worktree_env())


@pytest.mark.root
@pytest.mark.skipif(os.geteuid() != 0, reason="real ICMP between loopback addresses needs root")
def test_planner_and_agents_serve_metrics_that_move(tmp_path: Path):
    port = free_port()
    planner = start_planner(tmp_path / "planner.db",
                            extra=("--metrics", f"127.0.0.1:{port}", "--node-timeout", "12"))
    planner_url = f"http://127.0.0.1:{port}/metrics"
    assert f"metrics on {planner_url}" in planner.output()
    agent_urls = {n: f"http://{a}:{free_port(a)}/metrics" for n, a in NODES.items()}
    agents = {n: start_agent(n, a, planner.address, tmp_path / n,
                             agent_urls[n].removeprefix("http://").removesuffix("/metrics"))
              for n, a in NODES.items()}
    try:
        def link(m):   # link rollups are re-read once a minute: either direction, first
            return [v for (name, labels), v in m.items() if name == "hulk_link_rtt_seconds"
                    and dict(labels) in ({"src_site": "m2", "dst_site": "m3"},
                                         {"src_site": "m3", "dst_site": "m2"})]

        def measured():
            m = scrape(planner_url)
            ok = ((get(m, "hulk_samples_stored_total") or 0) > 0
                  and get(m, "hulk_nodes", state="alive") == 2 and link(m))
            return m if ok else None

        m = wait_until(measured, 45, "the planner's metrics to show both agents' samples",
                       interval=0.5, detail=lambda: planner.output()[-2000:])
        assert all(0 < rtt < 0.005 for rtt in link(m))
        assert get(m, "hulk_registrations_total", node="m2") >= 1
        assert get(m, "hulk_samples_received_total") >= get(m, "hulk_samples_stored_total")
        assert get(m, "hulk_store_read_ok") == 1

        def agent_reported():
            a = scrape(agent_urls["m2"])
            return a if (get(a, "hulk_agent_reports_total") or 0) > 0 else None

        a = wait_until(agent_reported, 20, "agent m2 to report", interval=0.5)
        assert get(a, "hulk_agent_registered") == 1 and get(a, "hulk_agent_peers") == 1
        assert get(a, "hulk_agent_probes_total", peer="m3") > 0
        assert get(a, "hulk_agent_rtt_seconds_count") > 0
        assert 0 < get(a, "hulk_agent_peer_rtt_seconds", peer="m3") < 0.005
        assert get(a, "hulk_agent_info", node="m2", version=__version__) == 1

        # A sample to a peer nobody registered: stored nothing, counted under its reason.
        before = get(scrape(planner_url), "hulk_samples_rejected_total", reason="unknown_peer")
        with grpc.insecure_channel(planner.address) as channel:
            answer = hulk_pb2_grpc.PlannerStub(channel).Report(hulk_pb2.ReportRequest(
                node_id="m2", batch_id="metrics-test", samples=[hulk_pb2.Sample(
                    peer_id="nobody", sent_at_ms=int(time.time() * 1000),
                    kind=hulk_pb2.PROBE_KIND_ICMP, payload_bytes=56, rtt_ms=1.0,
                    timeout_ms=2000.0)]), timeout=10)
        assert answer.rejected == 1
        after = get(scrape(planner_url), "hulk_samples_rejected_total", reason="unknown_peer")
        assert after == before + 1

        # An agent stops: its node turns silent after --node-timeout (longer than the 10 s
        # between an agent's heartbeats, so m2 stays alive).
        assert stop_process(agents.pop("m3")) == 0
        wait_until(lambda: get(scrape(planner_url), "hulk_node_up", node="m3") == 0, 30,
                   "node m3 to turn silent", interval=0.5)
        assert get(scrape(planner_url), "hulk_nodes", state="silent") == 1
    finally:
        for proc in agents.values():
            stop_process(proc)
        planner.stop()


def test_metrics_are_off_by_default(tmp_path: Path):
    planner = start_planner(tmp_path / "planner.db")
    try:
        assert "metrics on" not in planner.output()
    finally:
        planner.stop()


def test_a_port_in_use_or_a_bad_address_ends_either_program_with_exit_2(tmp_path: Path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = f"127.0.0.1:{taken.getsockname()[1]}"
        for metrics, expected in ((busy, "cannot serve /metrics on"), ("nope", "expected HOST:PORT")):
            done = run_cli("serve", "--db", tmp_path / "p.db", "--listen", "127.0.0.1:0",
                           "--insecure", "--metrics", metrics, timeout=60)
            assert done.returncode == 2, done.stderr
            lines = done.stderr.strip().splitlines()
            assert len(lines) == 1 and "--metrics" in lines[0] and expected in lines[0], lines
            agent = subprocess.run(
                [*agent_command(), "--planner", "127.0.0.1:1", "--node-id", "n1", "--insecure",
                 "--address", "127.0.0.1", "--state-dir", str(tmp_path / "agent"),
                 "--metrics", metrics], capture_output=True, text=True, timeout=60,
                env=worktree_env(), cwd=REPO)
            assert agent.returncode == 2, agent.stderr
            lines = agent.stderr.strip().splitlines()
            assert len(lines) == 1 and lines[0].startswith("hulk-agent: ") and expected in lines[0]
