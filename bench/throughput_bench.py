"""Throughput tests through a link shaped to a known rate; what the tests cost at default settings.

    python -m bench.throughput_bench [--quick]      (root: it builds network namespaces)

Setup. Two network namespaces joined by a veth pair (MTU 1500); a ``tbf`` qdisc on the sender's
end shapes its egress to R. Each test runs both sides as an agent does (``python -m
agent.throughput SLOT``, one process per side, each in its namespace) with the default streams
and duration of ``ScheduleOptions``. Reported per test: the measured rate over R (target: within
10%; TCP/IP and Ethernet headers take about 4.4% of a 1500-byte frame, which tbf counts) and the
CPU seconds each side used.

Cost. At the default ``ScheduleOptions`` a directed site pair is tested at most every
``period_s - slip_s``: the bytes a day per pair at a few capacities, the fraction of the pair's
capacity the tests take averaged over a day (duration over that interval), and an agent's share
of one core for a server that is the only test server of its site in a fleet of ``SITES`` sites
(it is in every test of its site's pairs, both directions, and the intra-site ones are absent),
from the CPU seconds measured at the highest R.

``--quick``: R in {100, 500} Mbit/s. Writes bench/results/throughput.json.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from agent.throughput import slot_to_json  # noqa: E402
from hulk.wire.throughput import ThroughputSlot  # noqa: E402
from lab.netns import LabError, list_namespaces, require_root, run_command  # noqa: E402
from planner.core.throughput_schedule import ScheduleOptions  # noqa: E402

RATES_MBIT = (50, 100, 200, 500, 1000)
QUICK_RATES_MBIT = (100, 500)
TESTS_PER_RATE = 3
TOLERANCE = 0.10
LEAD_MS = 1500                 # the two processes start (imports) before the slot does
SITES = 10                     # the fleet of the per-agent CPU figure
CAPACITIES_GBPS = (1.0, 10.0)
SUBNET = "198.18.251."         # RFC 2544 benchmarking range: never a real host
SEND_ADDR, RECV_ADDR = SUBNET + "1", SUBNET + "2"


def remove_stale() -> None:
    """Namespaces a killed run of this benchmark left behind (their builder is gone)."""
    for name in list_namespaces():
        pid = name.split("-")[2] if name.startswith("hulk-tput-") else ""
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            subprocess.run(["ip", "netns", "del", name], capture_output=True)


class ShapedLink:
    """Namespaces ``a`` (sender) and ``b`` (receiver) joined by a veth pair, ``a``'s end shaped."""

    def __init__(self) -> None:
        pid = os.getpid()
        self.a, self.b = f"hulk-tput-{pid}-a", f"hulk-tput-{pid}-b"
        self.dev_a, self.dev_b = f"ht{pid % 100000}a", f"ht{pid % 100000}b"

    def __enter__(self) -> ShapedLink:
        require_root()
        self.close()
        remove_stale()
        run_command(["ip", "netns", "add", self.a])
        run_command(["ip", "netns", "add", self.b])
        try:
            run_command(["ip", "link", "add", self.dev_a, "netns", self.a, "type", "veth", "peer",
                         "name", self.dev_b, "netns", self.b])
            for ns, dev, addr in ((self.a, self.dev_a, SEND_ADDR), (self.b, self.dev_b, RECV_ADDR)):
                run_command(["ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", dev])
                run_command(["ip", "-n", ns, "link", "set", dev, "mtu", "1500", "up"])
                run_command(["ip", "-n", ns, "link", "set", "lo", "up"])
        except BaseException:
            self.close()
            raise
        return self

    def shape(self, rate_mbit: float) -> None:
        # A bucket of at least 2 ms at R (and a whole 64 KiB GSO packet): below that tbf's own
        # timer granularity, not R, limits the rate.
        burst = max(128 * 1024, int(rate_mbit * 1e6 / 8 * 0.002))
        run_command(["tc", "-n", self.a, "qdisc", "replace", "dev", self.dev_a, "root", "tbf",
                     "rate", f"{rate_mbit}mbit", "burst", str(burst), "latency", "50ms"])

    def close(self) -> None:
        for ns in (self.a, self.b):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)

    def __exit__(self, *exc) -> None:
        self.close()


def one_test(link: ShapedLink, options: ScheduleOptions) -> dict:
    """Both sides of one test in their namespaces; the receiver's result and each side's CPU."""
    start = int(time.time() * 1000) + LEAD_MS
    common = dict(test_id=os.urandom(16).hex(), port=7600, start_ms=start,
                  duration_s=options.duration_s, streams=options.streams, secret=os.urandom(32))
    send = ThroughputSlot(role="send", peer_id="b", peer_address=RECV_ADDR, **common)
    receive = ThroughputSlot(role="receive", peer_id="a", peer_address=SEND_ADDR, **common)
    procs = [subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, "-m", "agent.throughput",
                               json.dumps(slot_to_json(slot)), *extra],
                              cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for ns, slot, extra in ((link.b, receive, ["--bind", RECV_ADDR]),
                                     (link.a, send, []))]
    outs = []
    for proc in procs:
        out, err = proc.communicate(timeout=(send.end_ms - start + LEAD_MS) / 1000 + 60)
        if proc.returncode != 0:
            raise LabError(f"agent.throughput exited {proc.returncode}: {err.strip()[-300:]}")
        outs.append(json.loads(out.strip().splitlines()[-1]))
    result = outs[0]["result"]
    return {"ok": result["ok"], "detail": result["detail"], "gbps": result["gbps"],
            "bytes": result["bytes"], "window_s": result["duration_s"],
            "streams": result["streams"], "receiver_cpu_s": outs[0]["cpu_s"],
            "sender_cpu_s": outs[1]["cpu_s"]}


def cost(options: ScheduleOptions, cpu_s_per_test: float) -> dict:
    """What the tests cost at ``options``: per site pair, and for one agent."""
    interval_s = options.period_s - options.slip_s
    tests_per_day = 86_400 / interval_s
    per_pair = {f"{c:g}_gbps": tests_per_day * c * 1e9 * options.duration_s / 8
                for c in CAPACITIES_GBPS}
    agent_tests = tests_per_day * 2 * (SITES - 1)
    return {
        "period_s": options.period_s, "slip_s": options.slip_s,
        "duration_s": options.duration_s, "streams": options.streams,
        "tests_per_pair_per_day_max": round(tests_per_day, 3),
        "bytes_per_pair_per_day": {k: round(v) for k, v in per_pair.items()},
        "capacity_fraction": options.duration_s / interval_s,
        "capacity_fraction_target": 0.01,
        "daily_budget_bytes": options.daily_budget_bytes,
        "pairs_the_budget_covers_at_10_gbps": int(options.daily_budget_bytes
                                                  // per_pair["10_gbps"]),
        "agent": {"sites": SITES, "tests_per_day": round(agent_tests, 1),
                  "cpu_s_per_test": round(cpu_s_per_test, 4),
                  "core_fraction": agent_tests * cpu_s_per_test / 86_400,
                  "core_fraction_target": 0.005},
    }


def run(out_dir: Path, quick: bool = False) -> dict:
    t0 = time.monotonic()
    options = ScheduleOptions()
    rates = QUICK_RATES_MBIT if quick else RATES_MBIT
    by_rate: dict[str, list[dict]] = {}
    with ShapedLink() as link:
        for rate in rates:
            link.shape(rate)
            tests = []
            for _ in range(TESTS_PER_RATE):
                test = one_test(link, options)
                test["measured_over_rate"] = round(test["gbps"] * 1000 / rate, 4)
                test["within_10pct"] = test["ok"] and abs(test["measured_over_rate"] - 1) \
                    <= TOLERANCE
                tests.append(test)
                print(f"[throughput_bench] R {rate} Mbit/s: {json.dumps(test)}", flush=True)
            by_rate[str(rate)] = tests
    top = by_rate[str(max(rates))]
    cpu_top = statistics.mean(max(t["sender_cpu_s"], t["receiver_cpu_s"]) for t in top)
    result = {
        "benchmark": "throughput",
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "command": "python -m bench.throughput_bench" + (" --quick" if quick else ""),
        "method": "two namespaces joined by veth (MTU 1500), tbf on the sender's egress at R; "
                  "both sides as `python -m agent.throughput` processes",
        "tests_per_rate": TESTS_PER_RATE, "tolerance": TOLERANCE,
        "options": dataclasses.asdict(options),
        "rates_mbit": list(rates),
        "tests": by_rate,
        "measured_over_rate_median": {r: statistics.median(t["measured_over_rate"] for t in ts)
                                      for r, ts in by_rate.items()},
        "all_within_10pct": all(t["within_10pct"] for ts in by_rate.values() for t in ts),
        "cpu_s_per_test": {r: {"sender": round(statistics.mean(t["sender_cpu_s"] for t in ts), 4),
                               "receiver": round(statistics.mean(t["receiver_cpu_s"]
                                                                 for t in ts), 4)}
                           for r, ts in by_rate.items()},
        "cost": cost(options, cpu_top),
        "load_average_1min": round(os.getloadavg()[0], 2),
        "wall_s": round(time.monotonic() - t0, 1),
    }
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    name = "throughput_quick.json" if quick else "throughput.json"
    (out_dir / name).write_text(json.dumps(result, indent=2) + "\n")
    return result


def summarize(result: dict) -> str:
    lines = ["| R (Mbit/s) | measured / R, each test | sender CPU s | receiver CPU s |",
             "|---|---|---|---|"]
    for rate, tests in result["tests"].items():
        ratios = ", ".join(f"{t['measured_over_rate']:.3f}" for t in tests)
        cpu = result["cpu_s_per_test"][rate]
        lines.append(f"| {rate} | {ratios} | {cpu['sender']:.3f} | {cpu['receiver']:.3f} |")
    c = result["cost"]
    verdict = "all" if result["all_within_10pct"] else "NOT all"
    lines += ["", f"- {verdict} tests within {result['tolerance']:.0%} of R",
              f"- at default settings a site pair is tested at most "
              f"{c['tests_per_pair_per_day_max']:.2f} times a day: "
              + ", ".join(f"{v / 1e9:.1f} GB a day at {k.replace('_gbps', '')} Gbit/s"
                          for k, v in c["bytes_per_pair_per_day"].items())
              + f"; {c['capacity_fraction']:.4%} of the pair's capacity (target <= 1%)",
              f"- an agent alone in its site among {c['agent']['sites']} sites: "
              f"{c['agent']['tests_per_day']:.0f} tests a day at {c['agent']['cpu_s_per_test']:.3f}"
              f" CPU s each = {c['agent']['core_fraction']:.4%} of a core (target < 0.5%)", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.throughput_bench",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="R in {100, 500} Mbit/s only")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    args = parser.parse_args(argv)
    try:
        result = run(args.out, quick=args.quick)
    except LabError as err:
        print(f"throughput_bench: {err}", file=sys.stderr)
        return 2
    print(summarize(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
