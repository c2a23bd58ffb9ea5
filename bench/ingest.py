"""Ingest benchmark: 1,000 simulated agents report through real gRPC into a real SQLite store.

The planner runs as its own process (`hulk-planner serve`), so the RSS measured is the planner's.
The simulated agents are registered first; their Report batches (unique batch ids, RTTs above
the speed-of-light bound of their cities so every sample is accepted) are serialised before the
clock starts, so the client spends its time sending, not building messages. Figures:
sustained samples/s accepted by the planner and the planner's peak RSS.

    .venv/bin/python -m bench.ingest [--seconds 20] [--agents 1000] [--batch 1000]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import grpc
import psutil

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.planner_process import start_planner, stop_planner  # noqa: E402
from hulk import geo  # noqa: E402
from hulk.v1 import hulk_pb2, hulk_pb2_grpc  # noqa: E402

CITIES = ["Beijing", "Shanghai", "Tokyo", "Singapore", "Frankfurt", "London", "New York",
          "California", "Sao Paulo", "Sydney", "New Delhi", "Paris"]


def _start_planner(db: Path, log: Path) -> tuple[subprocess.Popen, str]:
    # Fold samples into rollups during the run, so their cost counts.
    return start_planner(db, log, ["--insecure", "--rollup-seconds", "5"], start_timeout_s=30)


def _make_batches(agents: int, batch: int, total_batches: int, seed: int) -> list[bytes]:
    rng = random.Random(seed)
    city = [CITIES[i % len(CITIES)] for i in range(agents)]
    coords = {c: geo.coordinates(c) for c in CITIES}
    bound = {(a, b): geo.min_rtt_ms(coords[a], coords[b]) for a in CITIES for b in CITIES}
    now = int(time.time() * 1000)
    out = []
    for k in range(total_batches):
        node = k % agents
        samples = []
        for j in range(batch):
            peer = rng.randrange(agents - 1)
            peer += peer >= node
            lost = rng.random() < 0.01
            rtt = 0.0 if lost else max(bound[(city[node], city[peer])], 0.3) * \
                rng.uniform(1.5, 2.5) + rng.expovariate(0.5)
            samples.append(hulk_pb2.Sample(
                peer_id=f"sim-{peer}", sent_at_ms=now - rng.randrange(3_600_000),
                kind=hulk_pb2.PROBE_KIND_ICMP, payload_bytes=56, lost=lost, rtt_ms=rtt,
                timeout_ms=2000.0))
        out.append(hulk_pb2.ReportRequest(node_id=f"sim-{node}", batch_id=f"b-{k}",
                                          samples=samples).SerializeToString())
    return out


async def _register_all(address: str, agents: int) -> None:
    async with grpc.aio.insecure_channel(address) as channel:
        stub = hulk_pb2_grpc.PlannerStub(channel)
        sem = asyncio.Semaphore(32)

        async def one(i: int) -> None:
            async with sem:
                await stub.Register(hulk_pb2.RegisterRequest(
                    node_id=f"sim-{i}", hostname=f"sim-{i}", agent_version="bench",
                    address=f"10.{i // 250}.{i % 250}.1",
                    location=hulk_pb2.Location(city=CITIES[i % len(CITIES)]),
                    inventory=hulk_pb2.GpuInventory(unavailable_reason="simulated")),
                    timeout=60)
        await asyncio.gather(*(one(i) for i in range(agents)))


async def _send_all(address: str, payloads: list[bytes], concurrency: int,
                    seconds: float) -> tuple[int, int, float]:
    options = [("grpc.max_send_message_length", 64 << 20)]
    async with grpc.aio.insecure_channel(address, options=options) as channel:
        # Pre-serialised requests: the identity serialiser sends the bytes as they are.
        report = channel.unary_unary("/hulk.v1.Planner/Report",
                                     request_serializer=None,
                                     response_deserializer=hulk_pb2.ReportResponse.FromString)
        queue = list(reversed(payloads))
        accepted = rejected = 0
        start = time.perf_counter()
        deadline = start + seconds

        async def worker() -> None:
            nonlocal accepted, rejected
            while queue and time.perf_counter() < deadline:
                response = await report(queue.pop(), timeout=60)
                accepted += response.accepted
                rejected += response.rejected

        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return accepted, rejected, time.perf_counter() - start


def run(out_dir: Path, *, agents: int = 1000, batch: int = 1000, seconds: float = 20.0,
        concurrency: int = 16, rate_guess: int = 80_000, seed: int = 7) -> dict:
    """Run the benchmark; writes ``out_dir/ingest.json`` and returns the figures."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    total_batches = max(agents, int(rate_guess * seconds / batch) + 1)
    load_before = os.getloadavg()[0]
    t0 = time.perf_counter()
    payloads = _make_batches(agents, batch, total_batches, seed)
    build_s = time.perf_counter() - t0
    with tempfile.TemporaryDirectory(prefix="hulk-ingest-") as tmp:
        db = Path(tmp) / "planner.db"
        proc, address = _start_planner(db, Path(tmp) / "planner.log")
        planner = psutil.Process(proc.pid)
        peak_rss = 0
        stop = threading.Event()

        def watch() -> None:
            nonlocal peak_rss
            while not stop.is_set():
                try:
                    peak_rss = max(peak_rss, planner.memory_info().rss)
                except psutil.Error:
                    return
                stop.wait(0.2)

        watcher = threading.Thread(target=watch, daemon=True)
        try:
            asyncio.run(_register_all(address, agents))
            rss_idle = planner.memory_info().rss
            cpu0 = planner.cpu_times()
            watcher.start()
            accepted, rejected, elapsed = asyncio.run(
                _send_all(address, payloads, concurrency, seconds))
            cpu1 = planner.cpu_times()
            stop.set()
            watcher.join()
            rss_end = planner.memory_info().rss
        finally:
            stop.set()
            stop_planner(proc)
        log_tail = (Path(tmp) / "planner.log").read_text()[-2000:]
        db_bytes = sum(p.stat().st_size for p in Path(tmp).glob("planner.db*"))
    planner_cpu = (cpu1.user + cpu1.system) - (cpu0.user + cpu0.system)
    result = {
        "benchmark": "ingest",
        "agents": agents, "samples_per_batch": batch, "concurrency": concurrency,
        "batches_sent": accepted // max(batch, 1), "samples_accepted": accepted,
        "samples_rejected": rejected, "seconds": round(elapsed, 2),
        "samples_per_s": round(accepted / elapsed),
        "target_samples_per_s": 50_000,
        "meets_target": accepted / elapsed >= 50_000,
        "planner_rss_mb_idle": round(rss_idle / 2**20, 1),
        "planner_rss_mb_peak": round(max(peak_rss, rss_end) / 2**20, 1),
        "planner_cpu_s": round(planner_cpu, 2),
        "planner_cores_used": round(planner_cpu / elapsed, 2),
        # Independent of other load on the machine: what one planner CPU-second ingests.
        "samples_per_planner_cpu_s": round(accepted / planner_cpu) if planner_cpu else None,
        "load_average_1min_before_after": [round(load_before, 2), round(os.getloadavg()[0], 2)],
        "db_bytes_after": db_bytes,
        "client_build_s": round(build_s, 1),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                    "platform": platform.platform()},
        "note": "client and planner share the machine's cores; the planner is a separate process",
    }
    if rejected or accepted == 0:
        result["planner_log_tail"] = log_tail
    (out_dir / "ingest.json").write_text(json.dumps(result, indent=2) + "\n")
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    parser.add_argument("--agents", type=int, default=1000)
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--concurrency", type=int, default=16)
    args = parser.parse_args(argv)
    result = run(args.out, agents=args.agents, batch=args.batch, seconds=args.seconds,
                 concurrency=args.concurrency)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
