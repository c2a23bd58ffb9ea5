"""Flood benchmark: one agent reports at 100x its normal rate while the others report normally.

The planner runs as its own process (`hulk-planner serve` with TLS and enrolment tokens, i.e. the
production guard: authentication + per-node token buckets). Normal agents send a Report of
``BATCH`` samples every ``1/NORMAL_HZ`` seconds; the flooder (its own process, so its client CPU
does not distort the measuring client) sends at ``100 * NORMAL_HZ``. Phases: a baseline without
the flooder, then the flood. Figures per phase: the normal agents' Report latency p50/p99 as seen
by the client, their calls that failed, and whether every sample they sent landed in the store
(counted in the SQLite file afterwards); for the flooder: calls answered OK and RESOURCE_EXHAUSTED.
Without ``quick`` the same flood is repeated against a planner whose per-node limit is lifted, to
show what the limit buys.

    .venv/bin/python -m bench.flood_bench [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import platform
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import grpc

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.planner_process import start_planner  # noqa: E402
from hulk.v1 import hulk_pb2, hulk_pb2_grpc  # noqa: E402
from planner.security.credentials import CredentialStore  # noqa: E402
from planner.security.tls import init_pki  # noqa: E402

NORMAL_HZ = 2.0          # an agent catching up on its spool: two batches a second
FLOOD_FACTOR = 100
BATCH = 50               # samples per Report


def _start_planner(db: Path, pki: dict[str, Path], log: Path,
                   extra: list[str]) -> tuple[subprocess.Popen, str]:
    return start_planner(db, log, ["--tls-cert", str(pki["server_cert"]),
                                   "--tls-key", str(pki["server_key"]), *extra], start_timeout_s=60)


def _channel(target: str, ca: Path) -> grpc.aio.Channel:
    return grpc.aio.secure_channel(target, grpc.ssl_channel_credentials(ca.read_bytes()))


def _report(node: str, peers: list[str], seq: int) -> hulk_pb2.ReportRequest:
    now = int(time.time() * 1000)
    samples = [hulk_pb2.Sample(peer_id=peers[i % len(peers)], sent_at_ms=now - i,
                               kind=hulk_pb2.PROBE_KIND_ICMP, payload_bytes=56,
                               rtt_ms=5.0 + (i % 7), timeout_ms=2000.0)
               for i in range(BATCH)]
    return hulk_pb2.ReportRequest(node_id=node, batch_id=f"{node}-{seq}", samples=samples)


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


async def _normal_agent(stub, node: str, peers: list[str], token: str, seconds: float,
                        seq0: int, stats: dict) -> int:
    """Report every 1/NORMAL_HZ s for ``seconds``; returns the next sequence number."""
    metadata = (("authorization", f"Bearer {token}"),)
    seq = seq0
    start = time.perf_counter()
    tick = 0
    while time.perf_counter() - start < seconds:
        t0 = time.perf_counter()
        try:
            reply = await stub.Report(_report(node, peers, seq), metadata=metadata, timeout=30)
            stats["latencies_ms"].append((time.perf_counter() - t0) * 1000)
            stats["accepted"] += reply.accepted
        except grpc.aio.AioRpcError as err:
            stats["failed"][err.code().name] = stats["failed"].get(err.code().name, 0) + 1
        stats["sent_samples"] += BATCH
        seq += 1
        tick += 1
        await asyncio.sleep(max(0.0, start + tick / NORMAL_HZ - time.perf_counter()))
    return seq


def _flooder_main(target: str, ca: str, node: str, peers: list[str], token: str, seconds: float,
                  rate_hz: float, result_path: str) -> None:
    """The misbehaving agent (own process): ``rate_hz`` Reports a second, concurrently."""

    async def flood() -> dict:
        counts: dict[str, int] = {}
        channel = _channel(target, Path(ca))
        stub = hulk_pb2_grpc.PlannerStub(channel)
        metadata = (("authorization", f"Bearer {token}"),)
        pending: set[asyncio.Task] = set()

        async def one(seq: int) -> None:
            try:
                await stub.Report(_report(node, peers, seq), metadata=metadata, timeout=30)
                key = "OK"
            except grpc.aio.AioRpcError as err:
                key = err.code().name
            counts[key] = counts.get(key, 0) + 1

        start = time.perf_counter()
        seq = 0
        while time.perf_counter() - start < seconds:
            task = asyncio.create_task(one(seq))
            pending.add(task)
            task.add_done_callback(pending.discard)
            seq += 1
            await asyncio.sleep(max(0.0, start + seq / rate_hz - time.perf_counter()))
        sent_s = time.perf_counter() - start
        await asyncio.gather(*pending, return_exceptions=True)
        await channel.close()
        return {"calls": seq, "achieved_hz": seq / sent_s, "answers": counts}

    Path(result_path).write_text(json.dumps(asyncio.run(flood())))


def _stored_samples(db: Path) -> dict[str, int]:
    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT n.id, count(*) FROM samples s JOIN nodes n ON n.idx = s.src "
                            "GROUP BY n.id").fetchall()
    return dict(rows)


def _scenario(tmp: Path, pki: dict[str, Path], *, agents: int, phase_s: float,
              extra: list[str], label: str) -> dict:
    db = tmp / f"{label}.sqlite"
    nodes = [f"n{i}" for i in range(agents)] + ["flooder"]
    store = CredentialStore(db)
    tokens = {n: store.issue(n).token for n in nodes}
    store.close()
    proc, target = _start_planner(db, pki, tmp / f"{label}.log", extra)
    try:
        async def drive() -> dict:
            channel = _channel(target, pki["ca"])
            stub = hulk_pb2_grpc.PlannerStub(channel)
            for i, node in enumerate(nodes):
                await stub.Register(hulk_pb2.RegisterRequest(
                    node_id=node, hostname=node, agent_version="bench",
                    address=f"127.0.1.{i + 1}",
                    inventory=hulk_pb2.GpuInventory(unavailable_reason="bench")),
                    metadata=(("authorization", f"Bearer {tokens[node]}"),), timeout=30)
            await asyncio.sleep(2.5)  # registration spent some of each bucket; let it refill
            phases = {}
            seqs = {n: 0 for n in nodes}
            flood_result = None
            for phase in ("before", "during"):
                stats = {n: {"latencies_ms": [], "accepted": 0, "sent_samples": 0, "failed": {}}
                         for n in nodes[:-1]}
                flooder = None
                if phase == "during":
                    result_path = tmp / f"{label}-flood.json"
                    flooder = mp.get_context("spawn").Process(
                        target=_flooder_main,
                        args=(target, str(pki["ca"]), "flooder", nodes[:-1], tokens["flooder"],
                              phase_s, NORMAL_HZ * FLOOD_FACTOR, str(result_path)))
                    flooder.start()
                    await asyncio.sleep(1.0)  # the flooder's interpreter starts and gets going
                runs = [_normal_agent(stub, n, [p for p in nodes[:-1] if p != n] or ["flooder"],
                                      tokens[n], phase_s - (1.0 if flooder else 0.0), seqs[n],
                                      stats[n]) for n in nodes[:-1]]
                for n, seq in zip(nodes[:-1], await asyncio.gather(*runs)):
                    seqs[n] = seq
                if flooder is not None:
                    await asyncio.get_running_loop().run_in_executor(None, flooder.join, 120)
                    flood_result = json.loads(result_path.read_text())
                latencies = [v for s in stats.values() for v in s["latencies_ms"]]
                failed: dict[str, int] = {}
                for s in stats.values():
                    for k, v in s["failed"].items():
                        failed[k] = failed.get(k, 0) + v
                phases[phase] = {
                    "normal_reports": len(latencies),
                    "normal_failed": failed,
                    "normal_samples_sent": sum(s["sent_samples"] for s in stats.values()),
                    "normal_samples_accepted": sum(s["accepted"] for s in stats.values()),
                    "latency_p50_ms": _percentile(latencies, 0.50),
                    "latency_p99_ms": _percentile(latencies, 0.99),
                    "latency_max_ms": max(latencies) if latencies else None,
                }
            await channel.close()
            return {"phases": phases, "flooder": flood_result}

        result = asyncio.run(drive())
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    stored = _stored_samples(db)
    sent = sum(p["normal_samples_sent"] for p in result["phases"].values())
    accepted = sum(p["normal_samples_accepted"] for p in result["phases"].values())
    result["normal_samples_stored"] = sum(v for k, v in stored.items() if k != "flooder")
    result["normal_all_landed"] = result["normal_samples_stored"] == sent == accepted
    result["flooder_samples_stored"] = stored.get("flooder", 0)
    return result


def run(out_dir: Path, shared: Path | None = None, quick: bool = False) -> dict:
    """Run the benchmark; writes ``out_dir/flood.json`` and returns the figures.
    ``shared`` is unused (no paper data needed); it keeps the bench runner's signature."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    agents, phase_s = (4, 6.0) if quick else (8, 15.0)
    load_before = os.getloadavg()[0]  # other work on the machine skews latencies; say so
    with tempfile.TemporaryDirectory(prefix="hulk-flood-") as tmp_name:
        tmp = Path(tmp_name)
        pki = init_pki(tmp / "pki", ["127.0.0.1"])
        scenarios = {"rate_limited": _scenario(tmp, pki, agents=agents, phase_s=phase_s,
                                               extra=[], label="limited")}
        if not quick:
            scenarios["no_rate_limit"] = _scenario(
                tmp, pki, agents=agents, phase_s=phase_s,
                extra=["--rate-limit", "1000000", "--rate-burst", "1000000"], label="unlimited")
    figures = {
        "benchmark": "flood",
        "normal_agents": agents,
        "normal_reports_per_s": NORMAL_HZ,
        "flood_reports_per_s": NORMAL_HZ * FLOOD_FACTOR,
        "samples_per_report": BATCH,
        "phase_s": phase_s,
        "transport": "gRPC over TLS, bearer tokens, planner as its own process",
        "planner_rate_limit": "default: 20 calls/s per node, burst 40",
        "scenarios": scenarios,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                    "load_avg_1m_before": round(load_before, 2),
                    "load_avg_1m_after": round(os.getloadavg()[0], 2)},
        "quick": quick,
    }
    (out_dir / "flood.json").write_text(json.dumps(figures, indent=2))
    return figures


def summarize(result: dict) -> str:
    """Markdown for bench/results/SUMMARY.md."""
    lines = [f"One agent floods {result['flood_reports_per_s']:g} Reports/s (100x normal) while "
             f"{result['normal_agents']} agents send {result['normal_reports_per_s']:g}/s "
             f"({result['samples_per_report']} samples each), {result['transport']}; machine load "
             f"{result['machine']['load_avg_1m_before']} before.", "",
             "| planner | normal p50 / p99 before (ms) | during flood (ms) | normal calls failed "
             "| all normal samples stored | flooder OK / RESOURCE_EXHAUSTED |",
             "|---|---|---|---|---|---|"]
    for name, sc in result["scenarios"].items():
        b, d = sc["phases"]["before"], sc["phases"]["during"]
        answers = (sc["flooder"] or {}).get("answers", {})
        lines.append(f"| {name} | {b['latency_p50_ms']:.1f} / {b['latency_p99_ms']:.1f} | "
                     f"{d['latency_p50_ms']:.1f} / {d['latency_p99_ms']:.1f} | "
                     f"{sum(d['normal_failed'].values())} | {sc['normal_all_landed']} | "
                     f"{answers.get('OK', 0)} / {answers.get('RESOURCE_EXHAUSTED', 0)} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    figures = run(args.out, None, quick=args.quick)
    for name, sc in figures["scenarios"].items():
        b, d = sc["phases"]["before"], sc["phases"]["during"]
        print(f"{name}: normal p50/p99 before {b['latency_p50_ms']:.1f}/{b['latency_p99_ms']:.1f} ms,"
              f" during flood {d['latency_p50_ms']:.1f}/{d['latency_p99_ms']:.1f} ms;"
              f" failed during {d['normal_failed']}; all landed {sc['normal_all_landed']};"
              f" flooder {sc['flooder']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
