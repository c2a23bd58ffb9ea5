"""Slots benchmark: can calls that never authenticate, or never send their body, refuse an
enrolled agent, from one source address or from many? `hulk-planner serve` runs as its own
process (TLS, enrolment tokens, listening on 0.0.0.0). A client process of its own opens COUNT
calls at once from SOURCES source addresses (127.0.0.1 ... 127.0.0.SOURCES, COUNT / SOURCES calls
each), over one connection per source or over as many as hold PER_CONNECTION calls each, and
keeps them open: in turn a Health/Watch stream, a Register call with no token whose body never
comes, and a Health/Check call (public, no token) whose body never comes.
Two enrolled nodes are timed meanwhile, each with a Register, Heartbeat and Report a round
(every 0.25 s, inside their rate limit): n1 from 127.0.0.1, a source the held calls share, and
n2 from 127.0.0.(SOURCES+1), a source of its own; rounds run while the held calls are being
opened and 5 more once they are all open. Figures per COUNT and SOURCES: how the held calls ended
(refused at once, or still open), the enrolled calls' failures and worst latency, and serve's
resident memory before, while they are held, and its peak.

A call to 127.0.0.K comes from source 127.0.0.K when 127.0.0.K/32 is on lo (its local route then
names it as the source); as root the benchmark makes a network namespace with those addresses,
runs itself and serve inside it, and removes it (the host's own lo is left alone).

    sudo .venv/bin/python -m bench.grpc_slots_bench [--counts 1100 5000] [--sources 1 10 20]
        [--per-connection 0 50]
"""

from __future__ import annotations

import argparse
import datetime
import json
import multiprocessing as mp
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
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
KINDS = ("watch", "register", "check")
ROUND_EVERY_S = 0.25        # 12 calls/s per node: inside the default 20/s, burst 40
HELD_ROUNDS = 5


def address(k: int) -> str:
    return f"127.0.0.{k}"


def source_ok(host: str) -> bool:
    """Whether a connection to ``host`` comes from ``host`` (so it stands for that source)."""
    with socket.socket() as server, socket.socket() as client:
        server.bind(("0.0.0.0", 0))
        server.listen()
        client.settimeout(5)
        client.connect((host, server.getsockname()[1]))
        peer, _ = server.accept()
        with peer:
            return peer.getpeername()[0] == host


def run_in_netns(argv: list[str], hosts: list[str]) -> int:
    """This benchmark again, inside a fresh network namespace whose lo has ``hosts``."""
    name = f"hulk-slots-{os.getpid()}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        subprocess.run(["ip", "-n", name, "link", "set", "lo", "up"], check=True)
        for host in hosts:
            if host != "127.0.0.1":
                subprocess.run(["ip", "-n", name, "addr", "add", f"{host}/32", "dev", "lo"],
                               check=True)
        setup = f"network namespace {name}: lo up with {hosts[1]}-{hosts[-1]}/32 added"
        return subprocess.run(["ip", "netns", "exec", name, sys.executable, "-m",
                               "bench.grpc_slots_bench", *argv, "--in-netns", setup],
                              cwd=REPO).returncode
    finally:
        subprocess.run(["ip", "netns", "del", name], check=False)


def memory_mib(pid: int) -> tuple[float, float]:
    """(resident now, resident peak) of ``pid`` in MiB."""
    got = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            got[key] = int(value.split()[0]) / 1024
    return got.get("VmRSS", float("nan")), got.get("VmHWM", float("nan"))


class Enrolled:
    """An enrolled node's channel from one source; its rounds, with their failures and the
    worst latency."""

    def __init__(self, node: str, token: str, target: str, ca: bytes):
        self.node, self.token = node, token
        self.channel = grpc.secure_channel(target, grpc.ssl_channel_credentials(ca))
        self.stub = hulk_pb2_grpc.PlannerStub(self.channel)

    def round(self) -> tuple[float, list[str]]:
        worst, failed = 0.0, []
        stub, node = self.stub, self.node
        for name, call, request in (
                ("Register", stub.Register, hulk_pb2.RegisterRequest(
                    node_id=node, hostname=node, agent_version="bench", address="192.0.2.1",
                    location=hulk_pb2.Location(city=""),
                    inventory=hulk_pb2.GpuInventory(unavailable_reason="bench"))),
                ("Heartbeat", stub.Heartbeat, hulk_pb2.HeartbeatRequest(node_id=node)),
                ("Report", stub.Report, hulk_pb2.ReportRequest(node_id=node,
                                                               batch_id=f"b{time.time_ns()}"))):
            start = time.monotonic()
            try:
                call(request, metadata=bearer(self.token), timeout=1.0)
            except grpc.RpcError as exc:
                failed.append(f"{name}: {exc.code().name}")
            worst = max(worst, time.monotonic() - start)
        return worst, failed

    def rounds(self, until: threading.Event | None = None, count: int = 0) -> dict:
        """Rounds every ROUND_EVERY_S: ``count`` of them, or until ``until`` is set (at least
        one)."""
        worst, failed, calls, done = 0.0, [], 0, 0
        while True:
            start = time.monotonic()
            w, f = self.round()
            worst, calls, done = max(worst, w), calls + 3, done + 1
            failed += f
            if (until.is_set() if until is not None else done >= count):
                break
            time.sleep(max(0.0, start + ROUND_EVERY_S - time.monotonic()))
        return {"calls": calls, "failed": len(failed), "failures": sorted(set(failed)),
                "worst_s": round(worst, 4)}


def _holder_main(conn, targets: list[str], ca: bytes, count: int, connections: int) -> None:
    """The held calls, in their own process (so the timed enrolled client has its own CPU and
    interpreter): opened, reported, then closed when told."""
    start = time.monotonic()
    holder = Holder(targets, ca, count, kinds=KINDS, connections=connections)
    opened_s = time.monotonic() - start
    # Settled: no call ended for 0.5 s (well before the half-open ones' 10 s body deadline).
    last, still = -1, 0
    while still < 2 and time.monotonic() - start < 8:
        now = holder.open_count()
        still = still + 1 if now == last else 0
        last = now
        time.sleep(0.25)
    conn.send({"opened_in_s": round(opened_s, 2),
               "settled_in_s": round(time.monotonic() - start, 2),
               "ended": dict(sorted(holder.ended.items())), "details": holder.details,
               "still_open": holder.open_count()})
    conn.recv()
    holder.close()


def one(count: int, sources: int, per_connection: int, work: Path) -> dict:
    tag = f"{count}x{sources}x{per_connection}"
    connections = -(-count // (sources * per_connection)) if per_connection else 1
    hosts = [address(k) for k in range(1, sources + 2)]
    pki = init_pki(work / f"pki-{tag}", [*hosts, "localhost"])
    ca = pki["ca"].read_bytes()
    db = work / f"planner-{tag}.sqlite"
    store = CredentialStore(db)
    tokens = {n: store.issue(n).token for n in ("n1", "n2")}
    store.close()
    proc, target = start_planner(db, work / f"serve-{tag}.log", [
        "--tls-cert", str(pki["server_cert"]), "--tls-key", str(pki["server_key"])],
        start_timeout_s=60, host="0.0.0.0")
    port = target.rsplit(":", 1)[1]
    enrolled = {"shared_source": Enrolled("n1", tokens["n1"], f"{hosts[0]}:{port}", ca),
                "own_source": Enrolled("n2", tokens["n2"], f"{hosts[-1]}:{port}", ca)}
    holder = None
    try:
        for e in enrolled.values():
            e.round()                               # connected and registered
        before, _ = memory_mib(proc.pid)
        opened = threading.Event()
        during: dict[str, dict] = {}
        threads = [threading.Thread(target=lambda k=k, e=e: during.__setitem__(
            k, e.rounds(until=opened))) for k, e in enrolled.items()]
        for t in threads:
            t.start()
        ours, theirs = mp.Pipe()
        holder = mp.get_context("spawn").Process(target=_holder_main, args=(
            theirs, [f"{h}:{port}" for h in hosts[:-1]], ca, count, connections))
        holder.start()
        if not ours.poll(120):
            raise RuntimeError("the held calls were not opened within 120 s")
        ended = ours.recv()
        opened.set()
        for t in threads:
            t.join()
        held_rounds = {k: e.rounds(count=HELD_ROUNDS) for k, e in enrolled.items()}
        held, peak = memory_mib(proc.pid)
        out = {"count": count, "sources": sources, "connections_per_source": connections,
               "kinds": list(KINDS),
               "holder_sources": f"{hosts[0]}-{hosts[-2]}" if sources > 1 else hosts[0],
               **ended,
               "enrolled": {k: {"node": enrolled[k].node,
                                "source": hosts[0] if k == "shared_source" else hosts[-1],
                                "while_opening": during[k], "while_held": held_rounds[k]}
                            for k in enrolled},
               "serve_rss_mib_before": round(before, 1), "serve_rss_mib_held": round(held, 1),
               "serve_rss_mib_peak": round(peak, 1)}
        ours.send("close")
        holder.join(30)
        return out
    finally:
        if holder is not None and holder.is_alive():
            holder.terminate()
        for e in enrolled.values():
            e.channel.close()
        stop_planner(proc)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--counts", type=int, nargs="+", default=[1100, 5000])
    p.add_argument("--sources", type=int, nargs="+", default=[1, 10, 20])
    p.add_argument("--per-connection", type=int, nargs="+", default=[0, 50],
                   help="held calls per connection (0: one connection per source)")
    p.add_argument("--in-netns", metavar="SETUP", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if not 1 <= min(args.sources) <= max(args.sources) <= 250:
        p.error("--sources: 1 to 250")
    hosts = [address(k) for k in range(1, max(args.sources) + 2)]
    own = argv[:argv.index("--in-netns")] if "--in-netns" in argv else argv
    setup = args.in_netns or "this host's lo"
    if not all(source_ok(h) for h in hosts):
        if args.in_netns:
            print(f"in {setup}: a connection to {hosts[1]} does not come from it",
                  file=sys.stderr)
            return 2
        if os.geteuid() == 0 and shutil.which("ip"):
            return run_in_netns(own, hosts)
        print(f"sources {hosts[1]}-{hosts[-1]} are not on lo with their own route: run as root "
              "(a network namespace is made), or add them: ip addr add 127.0.0.K/32 dev lo",
              file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        runs = [one(n, s, c, Path(tmp)) for c in args.per_connection for s in args.sources
                for n in args.counts]
    result = {"date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
              "command": "python -m bench.grpc_slots_bench " + " ".join(own),
              "sources_setup": setup, "cpus": os.cpu_count(), "runs": runs}
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
