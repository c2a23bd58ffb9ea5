"""Slots benchmark: can calls that never authenticate, or never send their body, refuse an
enrolled agent? `hulk-planner serve` runs as its own process (TLS, enrolment tokens); one client
opens COUNT calls at once and keeps them open, half Register calls whose body never comes (no
token), half Health/Watch streams; meanwhile an enrolled node's Register, Heartbeat and Report
are timed (5 rounds). Figures per COUNT: how the held calls ended (refused at once, or still
open), the enrolled calls' worst latency and failures, and serve's resident memory before and
while they are held. All calls come from one source address (127.0.0.1): the per-source caps
make many sources no worse than the totals (guard.CallLimits), which this run does not measure.

    .venv/bin/python -m bench.grpc_slots_bench [--counts 1100 5000]
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import tempfile
import time
from pathlib import Path

import grpc

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.call_holder import Holder, bearer  # noqa: E402
from bench.planner_process import start_planner, stop_planner  # noqa: E402
from hulk.v1 import hulk_pb2, hulk_pb2_grpc  # noqa: E402
from planner.security.credentials import CredentialStore  # noqa: E402
from planner.security.tls import init_pki  # noqa: E402

RESULTS = REPO / "bench" / "results" / "grpc_slots.json"


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def enrolled_round(stub, token: str) -> tuple[float, int]:
    worst, failed = 0.0, 0
    for call, request in (
            (stub.Register, hulk_pb2.RegisterRequest(
                node_id="n1", hostname="n1", agent_version="bench", address="127.0.0.2",
                location=hulk_pb2.Location(city=""),
                inventory=hulk_pb2.GpuInventory(unavailable_reason="bench"))),
            (stub.Heartbeat, hulk_pb2.HeartbeatRequest(node_id="n1")),
            (stub.Report, hulk_pb2.ReportRequest(node_id="n1", batch_id=f"b{time.time_ns()}"))):
        start = time.monotonic()
        try:
            call(request, metadata=bearer(token), timeout=1.0)
        except grpc.RpcError:
            failed += 1
        worst = max(worst, time.monotonic() - start)
    return worst, failed


def one(count: int, work: Path) -> dict:
    pki = init_pki(work / f"pki-{count}", ["127.0.0.1", "localhost"])
    db = work / f"planner-{count}.sqlite"
    store = CredentialStore(db)
    token = store.issue("n1").token
    store.close()
    proc, target = start_planner(db, work / f"serve-{count}.log", [
        "--tls-cert", str(pki["server_cert"]), "--tls-key", str(pki["server_key"])],
        start_timeout_s=60)
    try:
        channel = grpc.secure_channel(target, grpc.ssl_channel_credentials(pki["ca"].read_bytes()))
        stub = hulk_pb2_grpc.PlannerStub(channel)
        enrolled_round(stub, token)
        before = rss_mib(proc.pid)
        holder = Holder(target, pki["ca"].read_bytes(), count)
        rounds = [enrolled_round(stub, token) for _ in range(5)]
        held = rss_mib(proc.pid)
        out = {"count": count, "ended": dict(holder.ended), "still_open": holder.open_count(),
               "enrolled_worst_s": round(max(w for w, _ in rounds), 4),
               "enrolled_failed": sum(f for _, f in rounds), "enrolled_calls": 3 * len(rounds),
               "serve_rss_mib_before": round(before, 1), "serve_rss_mib_held": round(held, 1)}
        holder.close()
        channel.close()
        return out
    finally:
        stop_planner(proc)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--counts", type=int, nargs="+", default=[1100, 5000])
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        runs = [one(n, Path(tmp)) for n in args.counts]
    result = {"date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
              "command": "python -m bench.grpc_slots_bench " + " ".join(sys.argv[1:]),
              "runs": runs}
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
