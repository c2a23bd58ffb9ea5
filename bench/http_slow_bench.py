"""Slow connections against the bounded HTTP server (`/metrics`, the dashboard): how many of the
operator's GETs are answered within 2 s (`python -m bench.http_slow_bench`).

Slow sources 127.0.0.2-11 hold N connections between them, each dripping one header line every
0.5 s and reconnecting as soon as the server closes it; the operator at 127.0.0.1 sends GETs one
after another, each given 2 s. The server runs with its shipped limits (ConnectionLimits()).
Loopback only. Results: bench/results/http_slow.json.
"""

from __future__ import annotations

import argparse
import datetime as dt
import http.client
import json
import os
import select
import socket
import sys
import threading
import time
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter

from hulk.http_server import ConnectionLimits
from hulk.metrics import start_metrics_server

ROOT = Path(__file__).resolve().parents[1]
SOURCES = [f"127.0.0.{n}" for n in range(2, 12)]
ANSWER_S = 2.0
DRIP_S = 0.5


def slow_sources(port: int, count: int, stop: threading.Event) -> threading.Thread:
    """One thread holding ``count`` dripping connections, spread over SOURCES, reconnecting."""

    def run() -> None:
        socks: dict[socket.socket, str] = {}

        def open_one(source: str) -> None:
            try:
                sock = socket.create_connection(("127.0.0.1", port), timeout=1.0,
                                                source_address=(source, 0))
                sock.setblocking(False)
                socks[sock] = source
            except OSError:
                pass

        for i in range(count):
            open_one(SOURCES[i % len(SOURCES)])
        line = 0
        while not stop.is_set():
            deadline = time.monotonic() + DRIP_S
            while time.monotonic() < deadline and not stop.is_set():
                ready, _, _ = select.select(list(socks), [], [], 0.05) if socks else ([], [], [])
                for sock in ready:   # readable: the server closed it (or answered): reconnect
                    source = socks.pop(sock)
                    sock.close()
                    open_one(source)
            for sock in list(socks):
                try:
                    sock.send(b"GET / HTTP/1.1\r\n" if line == 0 else b"X-Drip: %d\r\n" % line)
                except OSError:
                    source = socks.pop(sock)
                    sock.close()
                    open_one(source)
            line += 1
            while len(socks) < count and not stop.is_set():
                before = len(socks)
                open_one(SOURCES[len(socks) % len(SOURCES)])
                if len(socks) == before:
                    break
        for sock in socks:
            sock.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def operator_gets(port: int, count: int) -> list[float | None]:
    """Seconds each GET took, None for one refused or slower than ANSWER_S."""
    out: list[float | None] = []
    for _ in range(count):
        start = time.monotonic()
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=ANSWER_S,
                                          source_address=("127.0.0.1", 0))
        try:
            conn.request("GET", "/metrics")
            answer = conn.getresponse()
            answer.read()
            took = time.monotonic() - start
            out.append(took if answer.status == 200 and took <= ANSWER_S else None)
        except OSError:
            out.append(None)
        finally:
            conn.close()
        time.sleep(0.2)
    return out


def run(slow: int, gets: int) -> dict:
    registry = CollectorRegistry()
    Counter("hulk_bench_things", "things", registry=registry).inc()
    server = start_metrics_server("127.0.0.1:0", registry, limits=ConnectionLimits())
    stop = threading.Event()
    try:
        thread = slow_sources(server.port, slow, stop)
        time.sleep(2.0)      # the slow connections are in place
        times = operator_gets(server.port, gets)
        stop.set()
        thread.join(10)
        answered = [t for t in times if t is not None]
        return {"slow_connections": slow, "sources": len(SOURCES), "gets": gets,
                "answered_within_2s": len(answered), "fraction": len(answered) / gets,
                "median_s": sorted(answered)[len(answered) // 2] if answered else None,
                "evicted": getattr(server.httpd, "evicted", 0), "refused": server.httpd.refused}
    finally:
        server.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gets", type=int, default=40)
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "http_slow.json"))
    args = parser.parse_args(argv)
    rows = []
    for slow in (72, 500):
        row = run(slow, args.gets)
        rows.append(row)
        print(f"{slow} slow connections from {row['sources']} sources: "
              f"{row['answered_within_2s']}/{row['gets']} GETs answered within 2 s "
              f"({row['fraction']:.0%}; median {row['median_s'] or 0:.3f} s; "
              f"{row['evicted']} evicted, {row['refused']} refused)", flush=True)
    result = {"date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
              "command": "python -m bench.http_slow_bench " + " ".join(argv or sys.argv[1:]),
              "load": os.getloadavg()[0], "target": "at least 95% within 2 s", "rows": rows}
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
