"""One agent's cost with the bounded peer list of a 10,000-server fleet.

bench.agent_cost's measurement (a real hulk-agent, loopback peers, a counting gRPC planner)
with 64 peers, the default round (3 packets a minute per peer) and the planner asking for a
Report every 60 s (a 10,000-server fleet would use 600 s; 60 s shows the reporting cost inside
the window). The agent folds each round into a summary, spools it and reports it.

    python -m bench.agent_cost_fleet [--duration 150] [--quick]

Targets: under 0.5% of one core, under 60 MB RSS.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
from pathlib import Path

from bench.agent_cost import REPO, TARGET_RSS_MB, measure

PEERS = 64
PACKETS_PER_ROUND = 3
REPORT_INTERVAL_S = 60.0
TARGET_CPU_SHARE = 0.005


def run(out_dir: Path, duration_s: float = 150.0, quick: bool = False) -> dict:
    if quick:
        duration_s = min(duration_s, 30.0)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="hulk-agent-fleet-bench-") as state:
        result = asyncio.run(measure(duration_s, Path(state), peers=PEERS,
                                     packets_per_round=PACKETS_PER_ROUND,
                                     report_interval_s=REPORT_INTERVAL_S,
                                     target_cpu_share=TARGET_CPU_SHARE))
    result["benchmark"] = "agent_cost_fleet"
    (out_dir / "agent_cost_fleet.json").write_text(json.dumps(result, indent=2) + "\n")
    return result


def summarize(result: dict) -> str:
    verdict = "meets" if result["meets_targets"] else "misses"
    return (f"- one agent, {result['peers']} peers (a 10,000-server fleet's bound), a round of "
            f"{result['packets_per_round']} packets a minute, {result['measured_s']} s: "
            f"{result['cpu_percent_of_one_core']:.3f}% of one core, {result['rss_mb_max']:.1f} MB "
            f"RSS ({verdict} the targets: < 0.5%, < {TARGET_RSS_MB:g} MB)\n"
            f"- {result['summaries_received']} summaries in {result['reports_received']} Reports "
            f"from {result['peers_measured']} peers, mean RTT {result['mean_rtt_ms']} ms\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.agent_cost_fleet",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=150.0, help="seconds to measure")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    result = run(args.out, args.duration, quick=args.quick)
    print(json.dumps({k: v for k, v in result.items() if k != "agent_stderr_tail"}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
