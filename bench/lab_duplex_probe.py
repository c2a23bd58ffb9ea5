"""Throughput of the lab's slow link one way against both ways at once (DiLoCo's outer exchange).

    python -m bench.lab_duplex_probe [--seconds S] [--reps N] [--idle-s S]   (root: namespaces)

Builds bench/diloco_lab_bench.py's two continents (150 ms RTT, 4 Mbit/s each way, the switch's
tail-drop queue) and, between east-1 and west-1, measures:

1. the agent's throughput test (agent/throughput.py, 4 streams) one direction alone, each way;
2. the same test both directions at once (two tests on two ports, started together);
3. a timed transfer of one outer message (811816 bytes) one way only, and both ways at once on one
   TCP connection (gloo's all_gather between two ranks writes and reads one full-duplex socket), N
   times after ``idle_s`` of silence (as between outer steps) and N times back to back. The
   namespaces share the kernel's clock, so a transfer's time is the receiver's last byte less the
   sender's first write. After each transfer the sender's TCP_INFO gives its smoothed RTT, cwnd
   and retransmissions: the RTT the flow saw, queueing included.

Writes bench/results/lab_duplex.json (date, command, load average, figures) and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import struct
import subprocess
import sys
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

from bench.diloco_lab_bench import TOPOLOGY, WAN_MTU
from lab import bandwidth as lab_bandwidth
from lab.netns import require_root
from lab.switch import DEFAULT_QUEUE_S, MIN_QUEUE_BYTES
from lab.wan import QUEUE_PACKETS, WanLab

REPO = Path(__file__).resolve().parents[1]
EAST, WEST = "east-1", "west-1"
MESSAGE_BYTES = 811816     # the int8 pseudo-gradient (values and scales) of the lab's job
PORT = 5301


# -- peer: runs inside a host's namespace ---------------------------------------------------------
def _tcp_info(sock: socket.socket) -> dict:
    # struct tcp_info: 8 one-byte fields, then u32s; rtt (us) is the 16th u32, snd_cwnd the 19th.
    raw = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 104)
    u = struct.unpack("8B24I", raw)[8:]
    return {"rtt_ms": u[15] / 1000, "cwnd": u[18], "mss": u[2], "total_retrans": u[23]}


def _recv_exactly(sock: socket.socket, n: int) -> float:
    while n:
        chunk = sock.recv(min(n, 1 << 20))
        if not chunk:
            raise ConnectionError("peer closed")
        n -= len(chunk)
    return time.time()


def _connect(address: str) -> socket.socket:
    for _ in range(100):
        try:
            return socket.create_connection((address, PORT))
        except OSError:
            time.sleep(0.1)
    raise ConnectionError(f"cannot connect to {address}:{PORT}")


def peer(role: str, address: str, plan: list[dict], split: bool) -> None:
    """Run ``plan`` (items {start | idle_s, send, recv}) on one connection, or with ``split`` on
    two (one per direction); print one JSON line."""
    if role == "listen":
        srv = socket.create_server(("0.0.0.0", PORT))
        socks = [srv.accept()[0] for _ in range(1 + split)]
    else:
        socks = [_connect(address) for _ in range(1 + split)]
    out_sock = socks[0] if role == "connect" or not split else socks[1]
    in_sock = socks[1] if role == "connect" and split else socks[0]
    payload, out = b"\1" * MESSAGE_BYTES, []
    for item in plan:
        if item.get("start"):
            time.sleep(max(0.0, item["start"] - time.time()))
        else:
            time.sleep(item["idle_s"])
        row, writer = {"send_start": time.time()}, None
        if item["send"]:
            writer = threading.Thread(target=out_sock.sendall, args=(payload,))
            writer.start()
        if item["recv"]:
            row["recv_end"] = _recv_exactly(in_sock, MESSAGE_BYTES)
            if not item["send"]:
                in_sock.sendall(b"k")          # one-way: tell the sender it has all of it
        if writer:
            writer.join()
            if not item["recv"]:
                _recv_exactly(out_sock, 1)
        row["end"], row["tcp"] = time.time(), _tcp_info(out_sock)
        out.append(row)
    print(json.dumps(out), flush=True)


# -- orchestrator ---------------------------------------------------------------------------------
def throughput(lab: WanLab, pairs: list[tuple[str, str]], seconds: float) -> dict:
    """Mbit/s of agent throughput tests over ``pairs``, all started together (ports differ)."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    start_ms = int((time.time() + lab_bandwidth.LEAD_S) * 1000)
    procs = []
    for k, (s, r) in enumerate(pairs):
        send, receive = lab_bandwidth.slots(s, r, lab, start_ms=start_ms, duration_s=seconds,
                                            streams=4, port=lab_bandwidth.PORT + k)
        for host, slot in ((r, receive), (s, send)):
            procs.append((f"{s}>{r}", host == r, lab.popen(
                host, [lab.python, "-m", "agent.throughput", lab_bandwidth.slot_json(slot)],
                env=env, cwd=str(REPO), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)))
    out = {}
    for name, is_receiver, proc in procs:
        stdout, _ = proc.communicate(timeout=seconds + 60)
        if is_receiver:
            result = json.loads(stdout.strip().splitlines()[-1])["result"]
            out[name] = {"mbps": result["gbps"] * 1000, "ok": result["ok"],
                         "window_s": result["duration_s"]}
    return out


def transfers(lab: WanLab, both: bool, reps: int, idle_s: float, split: bool = False) -> list[dict]:
    """``reps`` transfers after ``idle_s`` of silence, then ``reps`` back to back."""
    first = time.time() + 6.0      # both peers started and connected at 0.3 of a core
    # The first transfer, on a fresh connection, is reported apart. After idle both peers start
    # at the same instant (the exchange alone, not the leaders' skew), ``idle_s`` + 3 s after the
    # previous start (rows record the idle each got); back to back each starts when its
    # previous ended.
    plan = [{"start": first + k * (idle_s + 3.0), "send": True, "recv": both}
            for k in range(reps + 1)]
    plan += [{"idle_s": 0.0, "send": True, "recv": both} for _ in range(reps)]
    other = [{**p, "send": both, "recv": True} for p in plan]
    argv = [lab.python, "-m", "bench.lab_duplex_probe", "--peer", str(int(split))]
    env = dict(os.environ, PYTHONPATH=str(REPO))
    west = lab.popen(WEST, argv + ["listen", "", json.dumps(other)], env=env, cwd=str(REPO),
                     stdout=subprocess.PIPE, text=True)
    time.sleep(1.0)
    east = lab.popen(EAST, argv + ["connect", lab.address(WEST), json.dumps(plan)], env=env,
                     cwd=str(REPO), stdout=subprocess.PIPE, text=True)
    limit = 10 + (reps + 1) * (idle_s + 3.0) + reps * 30 + 60
    e, w = (json.loads(p.communicate(timeout=limit)[0].strip().splitlines()[-1]) for p in (east, west))
    rows, before = [], {"east": 0, "west": 0}
    for k, (a, b) in enumerate(zip(e, w)):
        row = {"case": "first" if k == 0 else "idle" if k <= reps else "back-to-back",
               "east_idle_s": a["send_start"] - e[k - 1]["end"] if k else None,
               "east_to_west_s": b["recv_end"] - a["send_start"], "east_tcp": a["tcp"]}
        if both:
            row["west_to_east_s"] = a["recv_end"] - b["send_start"]
            row["exchange_s"] = max(a["recv_end"], b["recv_end"]) - min(a["send_start"],
                                                                       b["send_start"])
            row["west_tcp"] = b["tcp"]
        for side, x in (("east", a), ("west", b)):
            x["tcp"]["retrans_this"] = x["tcp"]["total_retrans"] - before[side]
            before[side] = x["tcp"]["total_retrans"]
        rows.append(row)
    return rows


def summary(rows: list[dict], key: str) -> dict:
    out = {}
    for case in ("first", "idle", "back-to-back"):
        v = [r[key] for r in rows if r["case"] == case]
        these = [r for r in rows if r["case"] == case]
        out[case] = {"mean_s": statistics.mean(v), "min_s": min(v), "max_s": max(v), "each_s": v,
                     "mean_rtt_ms": statistics.mean(r["east_tcp"]["rtt_ms"] for r in these),
                     **{f"mean_{d}_s": statistics.mean(r[f"{d}_s"] for r in these)
                        for d in ("east_to_west", "west_to_east") if d + "_s" in these[0]}}
    return out


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--peer"]:
        peer(argv[2], argv[3], json.loads(argv[4]), bool(int(argv[1])))
        return 0
    ap = argparse.ArgumentParser(prog="python -m bench.lab_duplex_probe")
    ap.add_argument("--seconds", type=float, default=10.0, help="each throughput test")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--idle-s", type=float, default=8.0)
    ap.add_argument("--wan-mtu", type=int, default=WAN_MTU,
                    help="path MTU between the continents (0: the lab's own)")
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "lab_duplex.json")
    args = ap.parse_args(argv)
    require_root()
    started, load = datetime.now(timezone.utc), list(os.getloadavg())
    rate = TOPOLOGY.links[("east", "west")][1]
    smallest = QUEUE_PACKETS * args.wan_mtu if args.wan_mtu else MIN_QUEUE_BYTES
    queue_bytes = max(smallest, rate * 1e6 / 8 * DEFAULT_QUEUE_S)
    res = {"date": started.strftime("%Y-%m-%d %H:%M UTC"),
           "command": "python -m bench.lab_duplex_probe " + " ".join(argv),
           "load_average_at_start": load, "hosts": [EAST, WEST], "message_bytes": MESSAGE_BYTES,
           "link": {"rtt_ms": TOPOLOGY.links[("east", "west")][0], "mbps_each_way": rate,
                    "path_mtu": args.wan_mtu or None,
                    "queue_bytes": queue_bytes, "queue_delay_s": queue_bytes * 8 / (rate * 1e6)}}
    hosts = TOPOLOGY.hosts()
    with WanLab(TOPOLOGY.matrix(), hub=False, rate_mbps=TOPOLOGY.rates(),
                cpu_cores={h: s.cores for h, s in hosts},
                path_mtu=TOPOLOGY.path_mtu(args.wan_mtu or None)) as lab:
        s0 = lab.switch_stats()["dropped_queue_full"]
        res["one_way"] = {**throughput(lab, [(EAST, WEST)], args.seconds),
                          **throughput(lab, [(WEST, EAST)], args.seconds)}
        s1 = lab.switch_stats()["dropped_queue_full"]
        res["both_ways"] = throughput(lab, [(EAST, WEST), (WEST, EAST)], args.seconds)
        s2 = lab.switch_stats()["dropped_queue_full"]
        one = transfers(lab, False, args.reps, args.idle_s)
        s3 = lab.switch_stats()["dropped_queue_full"]
        two = transfers(lab, True, args.reps, args.idle_s)
        s4 = lab.switch_stats()["dropped_queue_full"]
        split = transfers(lab, True, args.reps, args.idle_s, split=True)
        s5 = lab.switch_stats()["dropped_queue_full"]
    res["drops"] = {"one_way_tests": s1 - s0, "both_ways_tests": s2 - s1,
                    "one_way_transfers": s3 - s2, "both_ways_transfers": s4 - s3,
                    "both_ways_two_connections": s5 - s4}
    res["transfer_one_way"] = {"rows": one, **summary(one, "east_to_west_s")}
    res["transfer_both_ways"] = {"rows": two, **summary(two, "exchange_s")}
    res["transfer_both_ways_two_connections"] = {"rows": split, **summary(split, "exchange_s")}
    res["model_s"] = MESSAGE_BYTES * 8 / (res["one_way"][f"{EAST}>{WEST}"]["mbps"] * 1e6)
    res["wall_s"] = (datetime.now(timezone.utc) - started).total_seconds()
    args.out.write_text(json.dumps(res, indent=1) + "\n")
    print(f"queue {queue_bytes:.0f} B = {res['link']['queue_delay_s']:.3f} s at {rate} Mbit/s; "
          f"load {load}")
    for name, d in (("alone", res["one_way"]), ("both at once", res["both_ways"])):
        for pair, m in d.items():
            print(f"throughput {name:13s} {pair:16s} {m['mbps']:6.2f} Mbit/s ok={m['ok']}")
    for name, d in (("one way", res["transfer_one_way"]), ("both ways", res["transfer_both_ways"]),
                    ("both, 2 conns", res["transfer_both_ways_two_connections"])):
        for case in ("first", "idle", "back-to-back"):
            c = d[case]
            dirs = "".join(f", {d[:1]}>{d[-4:-3]} {c[f'mean_{d}_s']:.2f} s" for d in
                           ("east_to_west", "west_to_east") if f"mean_{d}_s" in c)
            print(f"0.81 MB {name:13s} {case:12s} mean {c['mean_s']:.2f} s (min {c['min_s']:.2f}, "
                  f"max {c['max_s']:.2f}{dirs}), east srtt {c['mean_rtt_ms']:.0f} ms")
    print(f"model (bytes / one-way throughput): {res['model_s']:.2f} s; drops {res['drops']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
