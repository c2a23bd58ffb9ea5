"""Store size for 90 days of a 10,000-server fleet that sends per-round summaries (issue 13).

Writes through the store's own API (``Store.register``, ``Store.store_batch`` with summary rows,
``Store.rollup_pending``, ``Store.prune``) into a real SQLite file, on a simulated clock, and
measures what each table costs per row with SQLite's ``dbstat`` (pages, so page slack counts):

* rollups: ``days`` simulated days (default 2) of every probed pair (10,000 agents x 64 peers;
  ``--quick``: 2,000 agents, one day). Each day comes as ``waves`` reports per agent (default 4:
  each standing for 6 hours of rounds, folded after each wave), so rows are updated in place
  and their histograms grow as they do under real traffic. Bytes per rollup row are measured on the last
  day and multiplied by pairs x 91 days (the 90-day window plus today).
* batches (the ids that make retries idempotent): kept ``raw_days`` + 1 = 8 days; the fleet sends
  one Report per agent per ``report_seconds`` (default 600, serve --report-seconds).
* raw summaries: kept ``summary_minutes`` (10) after they are folded; a fleet sends 10,000 x 64 /
  60 = 10,667 a second, so about 6.7 million rows are held at any time.

    python -m bench.store_size [--days 3] [--waves 6] [--quick]

Target (issue 13): under 5 GB.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sqlite3
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.fleet_sim import Fleet, aggregate_figures  # noqa: E402
from hulk.wire.records import NodeLocation, RegisterRequest  # noqa: E402
from planner.service.store import DAY_MS, Store  # noqa: E402

TARGET_GB = 5.0
FLEET_SERVERS = 10_000
WINDOW_DAYS = 91          # rollup_days (90) plus today
ROUND_PACKETS = 3
ROUNDS_PER_DAY = 1440


def table_bytes(db: Path) -> dict[str, int]:
    with sqlite3.connect(db) as conn:
        return dict(conn.execute("SELECT name, sum(pgsize) FROM dbstat GROUP BY name"))


def run(out_dir: Path, *, quick: bool = False, days: int | None = None, waves: int | None = None,
        servers: int = 10_000, sites: int = 200, peers: int = 64, report_seconds: float = 600.0,
        summary_minutes: float = 10.0, raw_days: int = 7) -> dict:
    days = days or (1 if quick else 2)
    waves = waves or (2 if quick else 4)
    if quick:
        servers = min(servers, 2_000)
    fleet = Fleet(servers, sites, peers)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    clock_ms = [20_000 * DAY_MS]
    t0 = time.perf_counter()
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="hulk-store-size-") as tmp:
        db = Path(tmp) / "planner.db"
        store = Store(db, raw_days=raw_days, clock=lambda: clock_ms[0],
                      summary_minutes=summary_minutes)
        refs = {}
        for i in range(servers):
            node, _ = store.register(RegisterRequest(
                fleet.node_id(i), address=f"10.{i // 250}.{i % 250}.1",
                location=NodeLocation(fleet.city(i))))
            refs[i] = node
        rng = random.Random(7)
        per_day: list[dict] = []
        summary_row_bytes = None
        pairs = 0
        for day in range(days):
            day_start = clock_ms[0] - clock_ms[0] % DAY_MS
            stored = 0
            for wave in range(waves):
                clock_ms[0] = day_start + wave * (DAY_MS // waves) + 60_000
                packets = ROUND_PACKETS * ROUNDS_PER_DAY // waves
                for i in range(servers):
                    rows = []
                    for j in fleet.peers(i, day):
                        rows.append((refs[i].idx, refs[j].idx, clock_ms[0], 1,
                                     *aggregate_figures(rng, fleet.base_rtt_ms(i, j), packets)))
                    store.store_batch(refs[i], uuid.uuid4().hex, [], None, 0, rows)
                    stored += len(rows)
                if summary_row_bytes is None:
                    sizes = table_bytes(db)
                    summary_row_bytes = sizes.get("summaries", 0) / max(1, store.summary_count())
                clock_ms[0] += int(summary_minutes * 60_000) + 1
                store.rollup_pending()
                print(f"[store_size] day {day + 1}/{days} wave {wave + 1}/{waves}: "
                      f"{time.perf_counter() - t0:.0f} s", flush=True)
            pairs = stored // waves
            store.prune()
            sizes = table_bytes(db)
            with store._lock:
                rollup_rows = store.conn.execute("SELECT count(*) FROM rollups").fetchone()[0]
                batch_rows = store.conn.execute("SELECT count(*) FROM batches").fetchone()[0]
            per_day.append({"day": day + 1, "rollup_rows": rollup_rows, "batch_rows": batch_rows,
                            "rollups_bytes": sizes.get("rollups", 0),
                            "batches_bytes": sizes.get("batches", 0) +
                            sizes.get("batches_received", 0),
                            "file_bytes": sum(p.stat().st_size for p in
                                              Path(tmp).glob("planner.db*"))})
            clock_ms[0] = day_start + DAY_MS
        store.close()
        seconds = time.perf_counter() - t0
    last, first = per_day[-1], per_day[0]
    rollup_row = (last["rollups_bytes"] - (first["rollups_bytes"] if days > 1 else 0)) / \
        max(1, last["rollup_rows"] - (first["rollup_rows"] if days > 1 else 0))
    batch_row = last["batches_bytes"] / max(1, last["batch_rows"])
    # Extrapolated to the 10,000-server fleet when fewer were simulated (--quick): rows scale
    # with servers, bytes per row do not (node numbers stay 2-byte integers).
    pairs_fleet = round(pairs * FLEET_SERVERS / servers)
    reports_per_day = FLEET_SERVERS * 86_400 / report_seconds
    summaries_held = FLEET_SERVERS * peers / 60.0 * (summary_minutes * 60 + 30)
    parts = {
        "rollups": rollup_row * pairs_fleet * WINDOW_DAYS,
        "batches": batch_row * reports_per_day * (raw_days + 1),
        "raw_summaries": summary_row_bytes * summaries_held,
    }
    total = sum(parts.values())
    result = {
        "benchmark": "store_size",
        "servers": FLEET_SERVERS, "servers_simulated": servers, "sites": sites,
        "peers_per_agent": peers, "pairs": pairs_fleet, "pairs_simulated": pairs,
        "simulated_days": days, "waves_per_day": waves, "report_seconds": report_seconds,
        "summary_minutes": summary_minutes, "raw_days": raw_days,
        "bytes_per_rollup_row": round(rollup_row, 1),
        "bytes_per_batch_row": round(batch_row, 1),
        "bytes_per_raw_summary_row": round(summary_row_bytes, 1),
        "rollup_rows_90_days": pairs_fleet * WINDOW_DAYS,
        "batch_rows_held": round(reports_per_day * (raw_days + 1)),
        "raw_summaries_held": round(summaries_held),
        "gb_by_part_90_days": {k: round(v / 1e9, 3) for k, v in parts.items()},
        "store_gb_90_days": round(total / 1e9, 3),
        "target_gb": TARGET_GB,
        "meets_target": total / 1e9 < TARGET_GB,
        "measured_per_day": per_day,
        "seconds": round(seconds, 1),
        "load_average_1min_before_after": [round(load_before, 2), round(os.getloadavg()[0], 2)],
        "method": "rows written through the Store API on a simulated clock; bytes per row from "
                  "dbstat pages on the last simulated day, times the rows 90 days hold",
    }
    (out_dir / "store_size.json").write_text(json.dumps(result, indent=2) + "\n")
    return result


def summarize(result: dict) -> str:
    verdict = "meets" if result["meets_target"] else "misses"
    parts = ", ".join(f"{k} {v} GB" for k, v in result["gb_by_part_90_days"].items())
    return (f"- 90 days of {result['servers']:,} servers x {result['peers_per_agent']} peers "
            f"({result['pairs']:,} pairs): {result['store_gb_90_days']} GB ({parts}); "
            f"{verdict} the target < {result['target_gb']:g} GB\n"
            f"- {result['bytes_per_rollup_row']} bytes a rollup row (pair-day), "
            f"{result['bytes_per_batch_row']} a batch id, {result['bytes_per_raw_summary_row']} "
            f"a raw summary; extrapolated from {result['simulated_days']} simulated day(s) of "
            f"{result['servers_simulated']:,} servers\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.store_size",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    parser.add_argument("--days", type=int, default=None)
    parser.add_argument("--waves", type=int, default=None)
    parser.add_argument("--servers", type=int, default=10_000)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    result = run(args.out, quick=args.quick, days=args.days, waves=args.waves,
                 servers=args.servers)
    print(json.dumps({k: v for k, v in result.items() if k != "measured_per_day"}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
