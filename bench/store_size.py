"""Store size for 90 days of a 10,000-server fleet probing by plan, and `plan --db` on that store.

The fleet: 10,000 servers in 200 sites of 50 (``bench.probe_plan_bench.fleet_layout``), each
agent probing the peers the rotating probe plan (``planner.core.probe_plan``, bound 64, 2
representatives per site pair, a new epoch every 600 s) gives it, and sending per-round
summaries. Everything goes into a real SQLite file:

1. ``days`` simulated days (default 2) through the store's own API (``Store.register``,
   ``Store.store_batch`` with summary rows, ``Store.rollup_pending``): each day comes as
   ``waves`` Reports per agent (default 4), each wave the plan of a different epoch of that
   day, its summaries standing for a quarter day of rounds (3 packets a minute per peer).
   Pairs between two sites fold into per-site-pair rollups as they are rolled up (the fleet
   has more than 1,000 nodes); pairs inside a site stay node pairs.
2. The rest of the 90-day window (91 days: the window plus today) is filled by copying the
   simulated days' rollup rows (node pairs and site pairs) to the earlier days in SQL, so the
   file holds every day's rows.
3. The tables that hold only recent rows are filled to their steady state in SQL: batch ids
   for ``raw_days`` + 1 = 8 days, one Report per agent per report interval (serve's automatic
   interval for 10,000 agents, 500 s, unless ``--report-seconds``), with random 16-byte ids
   as agents send; raw summaries for ``summary_minutes`` (10) + 30 s of the fleet's rounds.
4. The store's size is the file's size (checkpointed), with a per-table split from dbstat.
5. ``hulk-planner plan JOBS --db STORE --no-compare`` runs on that file end to end as a
   subprocess (target < 90 s), and ``fleet_from_store`` is timed in this process.

    python -m bench.store_size [--quick] [--days 2] [--waves 4] [--no-plan]

``--quick``: 2,000 servers in 40 sites, one simulated day of 2 waves, a 10-day window, and
the size is not compared with the target. Targets: store < 5 GB, plan --db < 90 s.
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

from bench.fleet_sim import aggregate_figures  # noqa: E402
from bench.probe_plan_bench import fleet_layout, site_rtt_ms, time_cli  # noqa: E402
from hulk.wire.records import GpuInfo, Inventory, NodeLocation, RegisterRequest  # noqa: E402
from planner.core.probe_plan import plan_shape, probe_plan  # noqa: E402
from planner.service.ingest import auto_report_interval_s  # noqa: E402
from planner.service.store import DAY_MS, Store  # noqa: E402

TARGET_GB = 5.0
TARGET_PLAN_DB_S = 90.0
ROUND_PACKETS = 3
ROUNDS_PER_DAY = 1440
EPOCH_S = 600
EPOCHS_PER_DAY = 86_400 // EPOCH_S


def _log(line: str) -> None:
    print(f"[store_size] {line}", flush=True)


def table_bytes(db: Path) -> dict[str, int]:
    with sqlite3.connect(db) as conn:
        rows = dict(conn.execute("SELECT name, sum(pgsize) FROM dbstat GROUP BY name"))
    conn.close()
    return rows


def count(conn: sqlite3.Connection, table: str) -> int:
    return conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0]


def simulate_days(store: Store, refs: dict, nodes: dict[str, str], where: dict, *,
                  days: int, waves: int, first_day: int, clock_ms: list[int],
                  summary_minutes: float, peer_bound: int, reps: int) -> dict:
    """Report ``days`` days of the probe plan's summaries through the Store API."""
    rng = random.Random(7)
    shape = plan_shape(nodes, peer_bound, reps)
    intra_base: dict[tuple[str, str], float] = {}
    distinct_pairs: set[tuple[int, int]] = set()
    summaries = 0
    packets = ROUND_PACKETS * ROUNDS_PER_DAY // waves
    t0 = time.perf_counter()
    for day in range(days):
        day_start = (first_day + day) * DAY_MS
        for wave in range(waves):
            epoch = (first_day + day) * EPOCHS_PER_DAY + wave * (EPOCHS_PER_DAY // waves)
            plan = probe_plan(nodes, epoch, shape=shape)
            clock_ms[0] = day_start + wave * (DAY_MS // waves) + 60_000
            for a, peers in plan.items():
                src = refs[a]
                rows = []
                for b in peers:
                    sa, sb = nodes[a], nodes[b]
                    if sa == sb:
                        base = intra_base.setdefault((a, b), rng.uniform(0.2, 0.6))
                    else:
                        base = site_rtt_ms(where[sa], where[sb])
                    rows.append((src.idx, refs[b].idx, clock_ms[0], 1,
                                 *aggregate_figures(rng, round(base, 2), packets)))
                    distinct_pairs.add((src.idx, refs[b].idx))
                store.store_batch(src, uuid.uuid4().hex, [], None, 0, rows)
                summaries += len(rows)
            clock_ms[0] += int(summary_minutes * 60_000) + 1
            store.rollup_pending()
            _log(f"day {day + 1}/{days} wave {wave + 1}/{waves} (epoch {epoch}): "
                 f"{time.perf_counter() - t0:.0f} s")
    return {"summaries_reported": summaries, "distinct_server_pairs_probed": len(distinct_pairs),
            "simulate_s": round(time.perf_counter() - t0, 1)}


def fill_window(conn: sqlite3.Connection, first_day: int, days: int, window: int) -> None:
    """Copy the simulated days' rollups to the earlier days of the window (SQL, in order)."""
    for day in range(first_day + days - window, first_day):
        source = first_day + (day - first_day) % days
        for table in ("rollups", "site_rollups"):
            conn.execute(f"INSERT INTO {table} SELECT ?, src, dst, count, lost, sum, sumsq, "
                         f"min_us, max_us, hist FROM {table} WHERE day = ?", (day, source))


def fill_steady_tables(conn: sqlite3.Connection, servers: int, now_ms: int, *,
                       report_s: float, raw_days: int, summaries_held: int) -> None:
    """Batch ids of raw_days + 1 days and the raw summaries held after folding."""
    per_node = int((raw_days + 1) * 86_400 / report_s)
    span_ms = (raw_days + 1) * DAY_MS
    conn.execute("DELETE FROM batches")
    for node in range(1, servers + 1):  # node by node: ids arrive at random within a node
        conn.execute("""WITH RECURSIVE k(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM k
                                                WHERE i + 1 < ?)
            INSERT INTO batches(node_idx, batch_id, received_ms, accepted, rejected,
                                last_summary_id)
            SELECT ?, randomblob(16), ? + i * ?, 57, 0, NULL FROM k""",
                     (per_node, node, now_ms - span_ms, span_ms // per_node))
    template = conn.execute("SELECT hist FROM site_rollups LIMIT 1").fetchone()[0]
    conn.execute("""WITH RECURSIVE k(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM k
                                            WHERE i + 1 < ?)
        INSERT INTO summaries(src, dst, round_ms, kind, count, lost, sum, sumsq, min_us,
                              max_us, hist)
        SELECT 1 + i % ?, 1 + (i * 7 + 1) % ?, ? + i, 1, 3, 0, 30.0, 300.1, 9900, 10100, ?
        FROM k""", (summaries_held, servers, servers, now_ms - 630_000, template))
    top = conn.execute("SELECT max(id) FROM summaries").fetchone()[0]
    # Held after folding: the watermark is past them (as summary_minutes after a fold).
    conn.execute("UPDATE meta SET value = ? WHERE key = 'summaries_rolled_through'", (top,))


def run(out_dir: Path, shared: Path = REPO / ".." / "shared", *, quick: bool = False,
        days: int | None = None, waves: int | None = None, servers: int = 10_000,
        sites: int = 200, peer_bound: int = 64, reps: int = 2,
        report_seconds: float | None = None, summary_minutes: float = 10.0, raw_days: int = 7,
        plan_db: bool = True) -> dict:
    days = days or (1 if quick else 2)
    waves = waves or (2 if quick else 4)
    window = 10 if quick else 91        # rollup_days (90) plus today
    if quick:
        servers, sites = min(servers, 2_000), min(sites, 40)
    report_s = report_seconds or auto_report_interval_s(servers)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    nodes, where = fleet_layout(servers, sites)
    today = int(time.time() * 1000) // DAY_MS
    first_day = today - days + 1
    clock_ms = [first_day * DAY_MS]
    load_before = os.getloadavg()
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="hulk-store-size-") as tmp:
        db = Path(tmp) / "planner.db"
        store = Store(db, raw_days=raw_days, clock=lambda: clock_ms[0],
                      summary_minutes=summary_minutes)
        refs = {}
        gpu = GpuInfo("NVIDIA A100-SXM4-40GB", "", 8.0, 40 * 10**9)
        for i, (node_id, site) in enumerate(sorted(nodes.items())):
            refs[node_id], _ = store.register(RegisterRequest(
                node_id, hostname=node_id, address=f"10.{i // 65536}.{i // 256 % 256}.{i % 256}",
                location=NodeLocation(site, where[site]), agent_version="bench",
                inventory=Inventory(gpus=(gpu,) * 8)))
        sim = simulate_days(store, refs, nodes, where, days=days, waves=waves,
                            first_day=first_day, clock_ms=clock_ms,
                            summary_minutes=summary_minutes, peer_bound=peer_bound, reps=reps)
        store.close()
        now_ms = int(time.time() * 1000)
        per_agent_peers = sim["summaries_reported"] / (days * waves * servers)
        summaries_held = round(servers * per_agent_peers / 60.0 * (summary_minutes * 60 + 30))
        with sqlite3.connect(db, isolation_level=None) as conn:
            simulated_rows = {t: count(conn, t) for t in ("rollups", "site_rollups")}
            t1 = time.perf_counter()
            # A bulk fill: no WAL copy of every new page (back to WAL once done).
            conn.execute("PRAGMA journal_mode=DELETE")
            conn.execute("PRAGMA synchronous=OFF")
            conn.execute("BEGIN")
            fill_window(conn, first_day, days, window)
            fill_steady_tables(conn, servers, now_ms, report_s=report_s,
                               raw_days=0 if quick else raw_days, summaries_held=summaries_held)
            conn.execute("COMMIT")
            conn.execute("PRAGMA journal_mode=WAL")
            rows = {t: count(conn, t) for t in ("rollups", "site_rollups", "batches",
                                                "summaries", "nodes", "sites")}
        conn.close()
        fill_s = time.perf_counter() - t1
        _log(f"window and steady tables filled in {fill_s:.0f} s: {rows}")
        sizes = table_bytes(db)
        file_bytes = sum(p.stat().st_size for p in Path(tmp).glob("planner.db*"))
        parts = {"rollups (node pairs inside sites)": sizes.get("rollups", 0),
                 "site_rollups": sizes.get("site_rollups", 0),
                 "batches": sizes.get("batches", 0) + sizes.get("batches_received", 0),
                 "raw_summaries": sizes.get("summaries", 0)}
        result = {
            "benchmark": "store_size",
            "servers": servers, "sites": sites, "peer_bound": peer_bound, "site_reps": reps,
            "probe_epoch_s": EPOCH_S, "simulated_days": days, "waves_per_day": waves,
            "window_days_held": window, "report_seconds": report_s,
            "report_seconds_rule": "serve's automatic interval (agents / 20 s, 5-600 s)"
                                   if report_seconds is None else "given",
            "summary_minutes": summary_minutes, "raw_days": raw_days,
            **sim, "peers_per_agent_mean": round(per_agent_peers, 2),
            "rows_per_simulated_day": {t: n // days for t, n in simulated_rows.items()},
            "rows": rows,
            "bytes_per_row": {"rollups": round(parts["rollups (node pairs inside sites)"]
                                               / max(1, rows["rollups"]), 1),
                              "site_rollups": round(parts["site_rollups"]
                                                    / max(1, rows["site_rollups"]), 1),
                              "batches": round(parts["batches"] / max(1, rows["batches"]), 1),
                              "summaries": round(parts["raw_summaries"]
                                                 / max(1, rows["summaries"]), 1)},
            "gb_by_part": {k: round(v / 1e9, 3) for k, v in parts.items()},
            "store_gb": round(file_bytes / 1e9, 3),
            "target_gb": TARGET_GB,
            "meets_target": None if quick else file_bytes / 1e9 < TARGET_GB,
            "fill_s": round(fill_s, 1),
            "method": "days 1-2 through the Store API with the rotating probe plan; the other "
                      "days of the window copied from them in SQL; batch ids and raw summaries "
                      "at their steady-state counts in SQL; size = the checkpointed file",
        }
        if plan_db:
            result["plan_db"] = plan_db_figures(db, Path(shared), window)
        result["seconds"] = round(time.perf_counter() - t0, 1)
    result["load_average_before_after"] = [round(load_before[0], 2),
                                           round(os.getloadavg()[0], 2)]
    (out_dir / ("store_size_quick.json" if quick else "store_size.json")).write_text(
        json.dumps(result, indent=2) + "\n")
    return result


def plan_db_figures(db: Path, shared: Path, window: int) -> dict:
    """fleet_from_store in this process, then `hulk-planner plan --db` end to end."""
    from planner.service.graph import fleet_from_store

    _log(f"fleet_from_store (load {os.getloadavg()[0]:.2f})")
    with Store(db) as store:
        t0 = time.perf_counter()
        fleet = fleet_from_store(store, min(90, window), name=db.stem)
        read_s = time.perf_counter() - t0
    figures = {"fleet_from_store_s": round(read_s, 1), "fleet_nodes": len(fleet.nodes),
               "fleet_node_links": len(fleet.links), "fleet_sites": len(fleet.sites),
               "fleet_site_links": len(fleet.site_links),
               "site_link_samples_min": min((k.samples for k in fleet.site_links), default=0)}
    del fleet
    _log(f"fleet {json.dumps(figures)}; hulk-planner plan --db (load {os.getloadavg()[0]:.2f})")
    cli = time_cli(db, shared / "bench" / "paper-6-jobs.yaml")
    cli["meets_target"] = cli["exit_code"] == 0 and cli["seconds"] < TARGET_PLAN_DB_S
    cli["load_average_1min_after"] = round(os.getloadavg()[0], 2)
    _log(f"cli {json.dumps(cli)}")
    return {**figures, "cli": cli, "target_s": TARGET_PLAN_DB_S}


def summarize(result: dict) -> str:
    verdict = {True: "meets", False: "MISSES", None: "quick run, not compared with"}[
        result["meets_target"]]
    parts = ", ".join(f"{k} {v} GB" for k, v in result["gb_by_part"].items())
    lines = [
        f"- {result['window_days_held']} days of {result['servers']:,} servers in "
        f"{result['sites']} sites probing by plan ({result['distinct_server_pairs_probed']:,} "
        f"distinct server pairs in {result['simulated_days']} simulated day(s)): "
        f"{result['store_gb']} GB ({parts}); {verdict} the target < {result['target_gb']:g} GB",
    ]
    d = result.get("plan_db")
    if d:
        cli = d["cli"]
        lines.append(
            f"- `plan --db` on it: exit {cli['exit_code']} in {cli['seconds']} s (target < "
            f"{d['target_s']:.0f} s: {'met' if cli['meets_target'] else 'NOT met'}), peak RSS "
            f"{cli['peak_rss_mb']} MB; fleet_from_store {d['fleet_from_store_s']} s "
            f"({d['fleet_node_links']:,} node links, {d['fleet_site_links']:,} site links)")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.store_size",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    parser.add_argument("--shared", type=Path, default=REPO / ".." / "shared")
    parser.add_argument("--days", type=int, default=None)
    parser.add_argument("--waves", type=int, default=None)
    parser.add_argument("--report-seconds", type=float, default=None)
    parser.add_argument("--no-plan", action="store_true", help="measure the size only")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    result = run(args.out, args.shared, quick=args.quick, days=args.days, waves=args.waves,
                 report_seconds=args.report_seconds, plan_db=not args.no_plan)
    print(summarize(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
