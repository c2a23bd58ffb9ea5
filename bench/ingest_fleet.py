"""Planner ingest of a 10,000-server fleet's per-round summaries through real gRPC.

The fleet (bench.fleet_sim: 200 sites of 50 servers, 64 peers an agent, a round of 3 packets a
minute per peer) is registered in the store first (through ``Store.register``: the registration
path is not what is measured, and the full peer list the planner hands out today is another
helper's change). Then `hulk-planner serve` runs as its own process, and simulated agents send
their Reports at the fleet's steady-state rate: each agent one Report every ``report_seconds``
(serve --report-seconds; default 600) holding its 64 peers x report_seconds/60 rounds of
summaries, so 10,000 / report_seconds Reports and 10,667 summaries a second. Reports are
serialised before the clock starts and sent on schedule; the planner folds them into rollups
every 30 s as serve does. Figure: the planner process's CPU seconds over wall seconds.

    python -m bench.ingest_fleet [--seconds 60] [--report-seconds 600] [--quick]

Target: under 1 core on average.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

import grpc
import psutil

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.fleet_sim import Fleet, round_figures  # noqa: E402
from bench.planner_process import start_planner, stop_planner  # noqa: E402
from hulk.v1 import hulk_pb2  # noqa: E402
from hulk.wire.records import NodeLocation, RegisterRequest  # noqa: E402
from planner.service.store import Store  # noqa: E402

TARGET_CORES = 1.0


def register_fleet(db: Path, fleet: Fleet) -> None:
    with Store(db) as store:
        for i in range(fleet.servers):
            store.register(RegisterRequest(fleet.node_id(i), address=f"10.{i // 250}.{i % 250}.1",
                                           location=NodeLocation(fleet.city(i))))


def make_reports(fleet: Fleet, count: int, rounds: int, now_ms: int, seed: int = 7
                 ) -> tuple[list[bytes], int]:
    """``count`` serialised Reports from distinct agents (round robin), each with ``rounds``
    rounds of summaries for each of the agent's peers; returns them and the summaries held."""
    rng = random.Random(seed)
    out, total = [], 0
    for k in range(count):
        i = (k * 7919) % fleet.servers          # spread over the fleet, not site by site
        summaries = []
        for j in fleet.peers(i):
            base = fleet.base_rtt_ms(i, j)
            for r in range(rounds):
                n, lost, s, sq, lo, hi, hist = round_figures(rng, base, 3)
                ks = sorted(hist)
                summaries.append(hulk_pb2.PeerSummary(
                    peer_id=fleet.node_id(j), round_start_ms=now_ms - 60_000 * (rounds - r),
                    kind=hulk_pb2.PROBE_KIND_ICMP, payload_bytes=56, timeout_ms=2000.0,
                    count=n, lost=lost, rtt_sum_ms=s, rtt_sum_sq_ms2=sq, rtt_min_ms=lo or 0.0,
                    rtt_max_ms=hi or 0.0, histogram_buckets=ks,
                    histogram_counts=[hist[b] for b in ks]))
        total += len(summaries)
        out.append(hulk_pb2.ReportRequest(node_id=fleet.node_id(i), batch_id=os.urandom(16).hex(),
                                          summaries=summaries).SerializeToString())
    return out, total


async def send_paced(address: str, payloads: list[bytes], rate: float) -> dict:
    """Send payload k at start + k / rate; returns counts and latencies."""
    options = [("grpc.max_send_message_length", 64 << 20)]
    async with grpc.aio.insecure_channel(address, options=options) as channel:
        report = channel.unary_unary("/hulk.v1.Planner/Report", request_serializer=None,
                                     response_deserializer=hulk_pb2.ReportResponse.FromString)
        loop = asyncio.get_running_loop()
        start = loop.time()
        latencies: list[float] = []
        accepted = rejected = failed = 0

        async def one(k: int, payload: bytes) -> None:
            nonlocal accepted, rejected, failed
            await asyncio.sleep(max(0.0, start + k / rate - loop.time()))
            t = loop.time()
            try:
                answer = await report(payload, timeout=60)
            except grpc.RpcError:
                failed += 1
                return
            latencies.append(loop.time() - t)
            accepted += answer.accepted
            rejected += answer.rejected

        await asyncio.gather(*(one(k, p) for k, p in enumerate(payloads)))
        latencies.sort()
        return {"accepted": accepted, "rejected": rejected, "failed": failed,
                "wall_s": loop.time() - start,
                "latency_ms_p50": round(1000 * latencies[len(latencies) // 2], 1)
                if latencies else None,
                "latency_ms_p99": round(1000 * latencies[int(len(latencies) * 0.99)], 1)
                if latencies else None}


def run(out_dir: Path, *, quick: bool = False, seconds: float | None = None,
        report_seconds: float = 600.0, servers: int = 10_000, sites: int = 200,
        peers: int = 64) -> dict:
    seconds = seconds or (20.0 if quick else 90.0)
    fleet = Fleet(servers, sites, peers)
    rate = servers / report_seconds                      # Reports a second, fleet-wide
    rounds = max(1, round(report_seconds / 60.0))
    count = max(1, int(rate * seconds))
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="hulk-ingest-fleet-") as tmp:
        db = Path(tmp) / "planner.db"
        t0 = time.perf_counter()
        register_fleet(db, fleet)
        register_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        payloads, summaries = make_reports(fleet, count, rounds, int(time.time() * 1000))
        build_s = time.perf_counter() - t0
        proc, address = start_planner(db, Path(tmp) / "planner.log",
                                      ["--insecure", "--rollup-seconds", "30"], 60)
        planner = psutil.Process(proc.pid)
        try:
            time.sleep(2.0)                              # past start-up work
            cpu0, rss0 = planner.cpu_times(), planner.memory_info().rss
            sent = asyncio.run(send_paced(address, payloads, rate))
            cpu1, rss1 = planner.cpu_times(), planner.memory_info().rss
        finally:
            stop_planner(proc)
        log_tail = (Path(tmp) / "planner.log").read_text()[-2000:]
        with Store(db) as store:
            store.rollup_pending()
            rollup_rows = store.conn.execute("SELECT count(*) FROM rollups").fetchone()[0]
    cpu = (cpu1.user + cpu1.system) - (cpu0.user + cpu0.system)
    cores = cpu / sent["wall_s"]
    result = {
        "benchmark": "ingest_fleet",
        "servers": servers, "sites": sites, "peers_per_agent": peers,
        "report_seconds": report_seconds, "reports_per_s": round(rate, 2),
        "summaries_per_report": summaries // count, "summaries_per_s": round(summaries /
                                                                             sent["wall_s"]),
        "reports_sent": count, "summaries_sent": summaries, **sent,
        "planner_cpu_s": round(cpu, 2), "planner_cores_used": round(cores, 3),
        "target_cores": TARGET_CORES, "meets_target": cores < TARGET_CORES and
        sent["failed"] == 0 and sent["accepted"] == summaries,
        "planner_rss_mb": [round(rss0 / 2**20, 1), round(rss1 / 2**20, 1)],
        "rollup_rows_after": rollup_rows,
        "register_s": round(register_s, 1), "client_build_s": round(build_s, 1),
        "load_average_1min_before_after": [round(load_before, 2), round(os.getloadavg()[0], 2)],
        "note": "the client shares the machine's cores; the planner is its own process and its "
                "CPU time is its own",
    }
    if sent["failed"] or sent["rejected"]:
        result["planner_log_tail"] = log_tail
    (out_dir / "ingest_fleet.json").write_text(json.dumps(result, indent=2) + "\n")
    return result


def summarize(result: dict) -> str:
    verdict = "meets" if result["meets_target"] else "misses"
    return (f"- {result['servers']:,} servers x {result['peers_per_agent']} peers, a Report per "
            f"agent every {result['report_seconds']:g} s ({result['reports_per_s']} Reports/s, "
            f"{result['summaries_per_s']:,} summaries/s): planner "
            f"{result['planner_cores_used']:.3f} cores ({verdict} the target < 1 core); "
            f"latency p50 {result['latency_ms_p50']} ms, p99 {result['latency_ms_p99']} ms; "
            f"{result['failed']} failed\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.ingest_fleet",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    parser.add_argument("--seconds", type=float, default=None)
    parser.add_argument("--report-seconds", type=float, default=600.0)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    result = run(args.out, quick=args.quick, seconds=args.seconds,
                 report_seconds=args.report_seconds)
    print(json.dumps({k: v for k, v in result.items() if k != "planner_log_tail"}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
