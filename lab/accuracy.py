"""How well the switch reproduces its matrix: real ``ping`` between every pair of lab hosts.

    python -m lab.accuracy [--hosts 12] [--scale 1] [--count 10] [--interval 0.2]

Pings all pairs at the same time (so the switch is busy with every pair at once), and reports,
over pairs, the error of the median RTT against the configured one and, over all echoes, the
mean and the largest error.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess

from hulk.plural import count as plural
from lab import matrix as lab_matrix
from lab.wan import WanLab

_TIME = re.compile(r"time=([0-9.]+) ms")


def measure(lab: WanLab, count: int = 10, interval_s: float = 0.2) -> dict:
    hosts = lab.hosts
    pairs = [(a, b) for i, a in enumerate(hosts) for b in hosts[i + 1:]]
    procs = {pair: lab.popen(pair[0], ["ping", "-n", "-c", str(count),
                                       "-i", str(interval_s), "-W", "3", lab.address(pair[1])],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for pair in pairs}
    rows = []
    for (a, b), proc in procs.items():
        out, _ = proc.communicate(timeout=count * interval_s + 30)
        rtts = [float(t) for t in _TIME.findall(out)]
        configured = lab.configured_rtt_ms(a, b)
        rows.append({"a": a, "b": b, "configured_ms": configured, "samples": len(rtts),
                     "median_ms": statistics.median(rtts) if rtts else None,
                     "errors_ms": [r - configured for r in rtts]})
    medians = [r["median_ms"] - r["configured_ms"] for r in rows if r["median_ms"] is not None]
    every = [e for r in rows for e in r["errors_ms"]]
    within = sum(1 for r in rows if r["median_ms"] is not None
                 and abs(r["median_ms"] - r["configured_ms"]) <= max(1.0, 0.05 * r["configured_ms"]))
    return {
        "pairs": len(rows),
        "echoes": len(every),
        "lost": len(rows) * count - len(every),
        "median_error_mean_ms": statistics.mean(medians) if medians else None,
        "median_error_max_abs_ms": max(map(abs, medians)) if medians else None,
        "echo_error_mean_ms": statistics.mean(every) if every else None,
        "echo_error_max_abs_ms": max(map(abs, every)) if every else None,
        "echo_error_p99_abs_ms": (sorted(map(abs, every))[int(0.99 * (len(every) - 1))]
                                  if every else None),
        "pairs_within_max_1ms_5pct": within,
        "rows": [{k: v for k, v in r.items() if k != "errors_ms"} for r in rows],
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m lab.accuracy")
    p.add_argument("--hosts", type=int, default=12)
    p.add_argument("--scale", type=float, default=1.0)
    p.add_argument("--count", type=int, default=10)
    p.add_argument("--interval", type=float, default=0.2)
    p.add_argument("--json", action="store_true", help="print the whole result as JSON")
    a = p.parse_args(argv)
    with WanLab(lab_matrix.table1(a.hosts).scaled(a.scale)) as lab:
        result = measure(lab, a.count, a.interval)
        result["switch"] = {k: v for k, v in lab.switch_stats().items() if k != "pairs"}
    if a.json:
        print(json.dumps(result, indent=1))
    else:
        print(f"{plural(result['pairs'], 'pair')}, {plural(result['echoes'], 'echo', 'echoes')} "
              f"({result['lost']} lost); "
              f"per-pair median error: mean {result['median_error_mean_ms']:+.3f} ms, "
              f"max |{result['median_error_max_abs_ms']:.3f}| ms; per-echo error: mean "
              f"{result['echo_error_mean_ms']:+.3f} ms, p99 |{result['echo_error_p99_abs_ms']:.3f}| ms, "
              f"max |{result['echo_error_max_abs_ms']:.3f}| ms; "
              f"{result['pairs_within_max_1ms_5pct']} of {plural(result['pairs'], 'pair')} within "
              "max(1 ms, 5%)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
