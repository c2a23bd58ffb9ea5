"""Agent cost: one real hulk-agent probing 500 peers at one round a minute.

The peers are loopback addresses 127.0.1.1 ... 127.0.2.244 (Linux answers on all of 127/8); a
small in-process gRPC planner hands them out and counts what arrives. The agent's CPU share
(psutil cpu_times delta / wall time) and RSS are measured from outside, after registration.

    python -m bench.agent_cost --duration 150 --out bench/results

Targets: under 1% of one core, under 60 MB RSS. ``bench.agent_cost_fleet`` runs the
same measurement with the bounded peer list of a 10,000-server fleet (64 peers,
< 0.5% of a core). The agent sends per-round summaries; the counting planner counts the
packets they stand for (and raw samples, should any come).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import grpc
import psutil

from hulk.v1 import hulk_pb2, hulk_pb2_grpc

REPO = Path(__file__).resolve().parents[1]
PEERS = 500
INTERVAL_S = 60.0
PACKETS_PER_ROUND = 5
TARGET_CPU_SHARE = 0.01
TARGET_RSS_MB = 60.0


def peer_addresses(count: int = PEERS) -> list[str]:
    """127.0.1.1, 127.0.1.2, ... (500 of them end at 127.0.2.244)."""
    return [f"127.0.{1 + (i + 1) // 256}.{(i + 1) % 256}" for i in range(count)]


class CountingPlanner(hulk_pb2_grpc.PlannerServicer):
    def __init__(self, peers: list[str], packets_per_round: int = PACKETS_PER_ROUND,
                 report_interval_s: float = 0.0):
        self.peers = peers
        self.packets_per_round = packets_per_round
        self.report_interval_s = report_interval_s
        self.summaries = 0
        self.reports = 0
        self.registered = asyncio.Event()
        self.batches: set[str] = set()
        self.samples = 0
        self.lost = 0
        self.rtt_sum_ms = 0.0
        self.peers_seen: set[str] = set()
        self.heartbeats = 0

    async def Register(self, request, context):
        self.registered.set()
        return hulk_pb2.RegisterResponse(
            peers=[hulk_pb2.Peer(node_id=f"peer-{i}", address=a) for i, a in enumerate(self.peers)],
            settings=hulk_pb2.ProbeSettings(interval_s=INTERVAL_S,
                                            packets_per_round=self.packets_per_round,
                                            timeout_s=2.0, payload_bytes=56, max_concurrency=64,
                                            max_batch=2000,
                                            report_interval_s=self.report_interval_s),
            fleet="bench", server_time_ms=int(time.time() * 1000))

    async def Report(self, request, context):
        duplicate = request.batch_id in self.batches
        self.reports += 1
        if not duplicate:
            self.batches.add(request.batch_id)
            for summary in request.summaries:
                self.summaries += 1
                self.samples += summary.count
                self.lost += summary.lost
                self.rtt_sum_ms += summary.rtt_sum_ms
                self.peers_seen.add(summary.peer_id)
            for sample in request.samples:
                self.samples += 1
                self.peers_seen.add(sample.peer_id)
                if sample.lost:
                    self.lost += 1
                else:
                    self.rtt_sum_ms += sample.rtt_ms
        return hulk_pb2.ReportResponse(accepted=len(request.samples) + len(request.summaries),
                                       duplicate=duplicate)

    async def Heartbeat(self, request, context):
        self.heartbeats += 1
        return hulk_pb2.HeartbeatResponse(server_time_ms=int(time.time() * 1000))


def agent_command() -> list[str]:
    script = Path(sys.executable).parent / "hulk-agent"
    return [str(script)] if script.exists() else [sys.executable, "-m", "agent"]


async def measure(duration_s: float, state_dir: Path, *, peers: int = PEERS,
                  packets_per_round: int = PACKETS_PER_ROUND, report_interval_s: float = 0.0,
                  target_cpu_share: float = TARGET_CPU_SHARE) -> dict:
    planner = CountingPlanner(peer_addresses(peers), packets_per_round, report_interval_s)
    server = grpc.aio.server()
    hulk_pb2_grpc.add_PlannerServicer_to_server(planner, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    env = {k: v for k, v in os.environ.items() if not k.startswith("HULK_")}
    process = await asyncio.create_subprocess_exec(
        *agent_command(), "--planner", f"127.0.0.1:{port}", "--node-id", "bench-agent",
        "--address", "127.0.0.1", "--state-dir", str(state_dir), "--insecure",
        "--log-level", "WARNING", cwd=REPO, env=env, stderr=asyncio.subprocess.PIPE)
    try:
        await asyncio.wait_for(planner.registered.wait(), timeout=30)
        agent = psutil.Process(process.pid)
        await asyncio.sleep(1.0)  # let the first rounds start; imports are done by Register
        cpu0 = agent.cpu_times()
        wall0 = time.monotonic()
        samples0 = planner.samples
        rss: list[int] = []
        while time.monotonic() - wall0 < duration_s:
            rss.append(agent.memory_info().rss)
            await asyncio.sleep(1.0)
        cpu1 = agent.cpu_times()
        wall = time.monotonic() - wall0
        rss.append(agent.memory_info().rss)
        samples_in_window = planner.samples - samples0
    finally:
        if process.returncode is None:
            process.terminate()
            try:
                await asyncio.wait_for(process.wait(), timeout=10)
            except asyncio.TimeoutError:
                process.kill()
                await process.wait()
        stderr = (await process.stderr.read()).decode(errors="replace")
        await server.stop(None)
    cpu_s = (cpu1.user - cpu0.user) + (cpu1.system - cpu0.system)
    share = cpu_s / wall
    answered = planner.samples - planner.lost
    return {
        "benchmark": "agent_cost",
        "peers": peers,
        "interval_s": INTERVAL_S,
        "packets_per_round": packets_per_round,
        "report_interval_s": report_interval_s or "agent default (5 s)",
        "reports_received": planner.reports,
        "summaries_received": planner.summaries,
        "payload_bytes": 56,
        "measured_s": round(wall, 1),
        "cpu_seconds": round(cpu_s, 3),
        "cpu_share_of_one_core": round(share, 5),
        "cpu_percent_of_one_core": round(100 * share, 3),
        "rss_mb_max": round(max(rss) / 2**20, 1),
        "rss_mb_end": round(rss[-1] / 2**20, 1),
        "samples_in_window": samples_in_window,
        "samples_received_total": planner.samples,
        "samples_per_s": round(samples_in_window / wall, 1),
        "peers_measured": len(planner.peers_seen),
        "lost": planner.lost,
        "mean_rtt_ms": round(planner.rtt_sum_ms / answered, 3) if answered else None,
        "heartbeats": planner.heartbeats,
        "agent_exit_code": process.returncode,
        "agent_stderr_tail": stderr.strip().splitlines()[-5:],
        "targets": {"cpu_share_of_one_core": target_cpu_share, "rss_mb": TARGET_RSS_MB},
        "meets_targets": share < target_cpu_share and max(rss) / 2**20 < TARGET_RSS_MB,
        "host": {"cpus": os.cpu_count(), "python": platform.python_version(),
                 "kernel": platform.release()},
    }


def run(out_dir: Path, duration_s: float = 150.0, quick: bool = False) -> dict:
    """Measure for ``duration_s`` seconds (30 when ``quick``); write ``out_dir/agent_cost.json``;
    return the figures."""
    if quick:
        duration_s = min(duration_s, 30.0)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="hulk-agent-bench-") as state:
        result = asyncio.run(measure(duration_s, Path(state)))
    (out_dir / "agent_cost.json").write_text(json.dumps(result, indent=2) + "\n")
    return result


def summarize(result: dict) -> str:
    verdict = "meets" if result["meets_targets"] else "misses"
    return (f"- one agent, {result['peers']} peers, a round a minute, {result['measured_s']} s: "
            f"{result['cpu_percent_of_one_core']:.2f}% of one core, "
            f"{result['rss_mb_max']:.1f} MB RSS ({verdict} the targets: < 1%, < 60 MB)\n"
            f"- {result['samples_per_s']} samples/s from {result['peers_measured']} peers, "
            f"{result['lost']} lost, mean RTT {result['mean_rtt_ms']} ms\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.agent_cost", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=150.0, help="seconds to measure")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    args = parser.parse_args(argv)
    result = run(args.out, args.duration)
    print(json.dumps({k: v for k, v in result.items() if k != "agent_stderr_tail"}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
