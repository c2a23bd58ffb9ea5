"""`hulk-planner fleet show|export|import|plot|complete`: look at, save, load, draw and complete
the fleet."""

from __future__ import annotations

import argparse
import atexit
import gc
import time
from collections import Counter
from pathlib import Path

from hulk import geo
from hulk.errors import InputError
from hulk.plural import count
from planner.commands import seed_number
from planner.core.fleet import Fleet, complete
from planner.settings import PlannerSettings

WINDOW_HELP = "rolling window in days (HULK_WINDOW_DAYS; default 90)"
SITE_LINKS_FROM_NODES = 1000   # `fleet export --site-links auto` rolls node links up above this
NODE_TIMEOUT_S = 30.0          # serve's default --node-timeout
PREDICTED_MARK, FORMULA_MARK = "~", "*"   # `fleet show`: links completion wrote


def register(subparsers: argparse._SubParsersAction, settings: PlannerSettings) -> None:
    p = subparsers.add_parser("fleet", help="show, export, import, plot or complete the fleet",
                              description=__doc__)
    sub = p.add_subparsers(dest="fleet_command", metavar="ACTION", required=True)

    def source(q: argparse.ArgumentParser, required: bool = True) -> None:
        group = q.add_mutually_exclusive_group(required=required)
        group.add_argument("--db", default=settings.db, help="the planner's SQLite store")
        q.set_defaults(fleet_name=settings.fleet)
        group.add_argument("--fleet", type=Path, help="a fleet file (fleet JSON, or the paper's "
                           "folder/zip)")
        q.add_argument("--window-days", type=int, default=settings.window_days, help=WINDOW_HELP)

    show = sub.add_parser("show", help="a table of nodes, GPUs, last seen and link coverage")
    source(show, required=False)
    show.add_argument("--node-timeout", type=float, default=NODE_TIMEOUT_S, metavar="SECONDS",
                      help="a node not heard from for this long shows as silent instead of its "
                           "last launch state (serve's --node-timeout; default "
                           f"{NODE_TIMEOUT_S:g})")
    show.set_defaults(func=cmd_show)

    export = sub.add_parser("export", help="write the store's fleet as fleet JSON")
    export.add_argument("--db", required=True, help="the planner's SQLite store")
    export.add_argument("--out", type=Path, required=True, help="fleet JSON to write")
    export.add_argument("--window-days", type=int, default=settings.window_days, help=WINDOW_HELP)
    export.add_argument("--site-links", choices=["auto", "yes", "no"], default="auto",
                        help="write links between sites (median per site pair) instead of one "
                             f"link per server pair; auto: above {SITE_LINKS_FROM_NODES} servers")
    export.set_defaults(func=cmd_export, fleet_name=settings.fleet)

    imp = sub.add_parser("import", help="load a fleet file (paper folder/zip or fleet JSON) "
                         "into the store")
    imp.add_argument("path", type=Path, help="fleet JSON, or a folder/.zip with "
                     "node_feature.csv and edge.txt")
    imp.add_argument("--db", required=True, help="the planner's SQLite store")
    imp.set_defaults(func=cmd_import)

    plot = sub.add_parser("plot", help="draw the fleet on a map-like layout, links by RTT")
    source(plot)
    plot.add_argument("--out", type=Path, required=True,
                      help="image to write; its suffix names the format (.png, .pdf, .svg...)")
    plot.add_argument("--imputed", action="store_true", help="also draw completed pairs (dotted)")
    plot.set_defaults(func=cmd_plot)

    done = sub.add_parser("complete", help="write the fleet with a site link for every pair of "
                          "sites: measured, predicted by the link model, or by the formula "
                          "(docs/COSTMODEL.md section 2)")
    done.add_argument("fleet_file", type=Path, metavar="FLEET",
                      help="fleet JSON, or a folder/.zip with node_feature.csv and edge.txt")
    done.add_argument("--out", type=Path, required=True, help="fleet JSON to write")
    done.add_argument("--model", metavar="NAME", help="the link model (default: the one the "
                      "link prediction benchmark chose; see docs/COSTMODEL.md section 2)")
    done.add_argument("--seed", type=seed_number, default=0,
                      help="seed of the model's fit (default 0)")
    done.set_defaults(func=cmd_complete)


def _load(args: argparse.Namespace, *, keep_revoked: bool = False
          ) -> tuple[Fleet, list[dict] | None]:
    """The fleet named by --db or --fleet, and the store's node rows when it came from a store
    (each with ``revoked``). Revoked nodes are left out of the fleet unless ``keep_revoked``."""
    if getattr(args, "fleet", None):
        from planner.files.fleet import load_fleet
        return load_fleet(args.fleet), None
    db = args.db
    if not db:
        raise InputError("expected --db PATH or --fleet PATH", field="--db")
    if not Path(db).is_file():
        raise InputError("no such store (expected the SQLite file `serve --db` writes)",
                         path=str(db))
    from planner.service.graph import fleet_from_store
    from planner.service.node_state import revoked_nodes
    from planner.service.store import Store
    with Store(db, read_only=True) as store:   # reads only: works on a read-only copy
        # The fleet's name is the one serve and the MQTT topics use (HULK_FLEET), not the file's.
        fleet = fleet_from_store(store, args.window_days, name=args.fleet_name,
                                 keep_revoked=keep_revoked)
        rows = store.nodes()
        rejected = store.rejected_counts()
        revoked = revoked_nodes(store)
    for r in rows:
        r["rejected"] = sum(rejected.get(r["id"], {}).values())
        r["revoked"] = r["id"] in revoked
    return fleet, rows


def _ago(ms: int | None) -> str:
    if not ms:
        return "-"
    s = max(0.0, time.time() - ms / 1000)
    if s < 120:
        return f"{s:.0f} s ago"
    if s < 7200:
        return f"{s / 60:.0f} min ago"
    if s < 172800:
        return f"{s / 3600:.0f} h ago"
    return f"{s / 86400:.0f} d ago"


def _skew(ms: int | None) -> str:
    """The agent's clock minus the planner's; within a second reads as in step."""
    if ms is None:
        return "-"
    if abs(ms) < 1000:
        return "ok"
    s = abs(ms) / 1000
    text = f"{s:.0f} s" if s < 120 else f"{s / 60:.0f} min" if s < 7200 else f"{s / 3600:.1f} h"
    return ("+" if ms > 0 else "-") + text


def _short(seconds: float) -> str:
    """A duration in its largest whole unit: 45s, 2m, 3h, 2d."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size:.0f}{unit}"
    return f"{max(0.0, seconds):.0f}s"


def node_marks(rows: list[dict], *, now_ms: int, node_timeout_s: float) -> dict[str, str]:
    """node id -> "revoked" or "silent 2m" for the nodes whose last launch report no longer
    tells what runs there (``planner.service.node_state``, as the metrics count them)."""
    from planner.service.node_state import REVOKED, SILENT, node_state

    revoked = {r["id"] for r in rows if r.get("revoked")}
    marks = {}
    for r in rows:
        state = node_state(r, now_ms=now_ms, node_timeout_s=node_timeout_s, revoked=revoked)
        if state == REVOKED:
            marks[r["id"]] = REVOKED
        elif state == SILENT:
            seen = r.get("last_seen_ms")
            marks[r["id"]] = (SILENT if seen is None
                              else f"{SILENT} {_short((now_ms - seen) / 1000)}")
    return marks


def cmd_show(args: argparse.Namespace) -> int:
    from rich.console import Console

    if not args.node_timeout > 0:
        raise InputError(f"expected a number of seconds above 0, got {args.node_timeout:g}",
                         field="--node-timeout")
    fleet, rows = _load(args, keep_revoked=True)
    network = complete(fleet)
    peers, pairs = _measured_peers(fleet)
    marks = node_marks(rows, now_ms=int(time.time() * 1000),
                       node_timeout_s=args.node_timeout) if rows is not None else {}
    table = _node_table(fleet, network, rows, peers, marks)
    probe = Console()
    console = probe if probe.is_terminal else Console(width=200)
    console.print(table)
    for line in _coverage_lines(fleet, network, pairs):
        print(line)
    if rows is not None:
        measured = _site_throughput(args)
        if measured:
            console.print(_throughput_table(fleet, measured))
    return 0


def _site_throughput(args: argparse.Namespace) -> list:
    """The store's throughput tests per directed site pair over the window."""
    from planner.service.store import Store
    with Store(args.db, read_only=True) as store:
        return store.throughput.site_pairs(args.window_days)


def _site_rtts(fleet: Fleet) -> dict[tuple[str, str], float]:
    """Mean measured RTT between two sites (either order; a site with itself too); an RTT
    completion gave a measured throughput is not one."""
    site_of = {n.id: n.site_key for n in fleet.nodes}
    sums: dict[tuple[str, str], list[float]] = {}
    for a, b, rtt in ([(site_of.get(k.src), site_of.get(k.dst), k.rtt_ms) for k in fleet.links]
                      + [(k.src, k.dst, k.rtt_ms) for k in fleet.site_links if k.rtt_measured]):
        if a is None or b is None:
            continue
        for key in {(a, b), (b, a)}:
            acc = sums.setdefault(key, [0.0, 0])
            acc[0] += rtt
            acc[1] += 1
    return {key: total / count for key, (total, count) in sums.items()}


def _throughput_table(fleet: Fleet, measured: list):
    """One row per directed site pair the throughput tests measured: RTT beside the median
    Gbit/s, the tests behind it and how old the newest is."""
    from rich.table import Table

    rtts = _site_rtts(fleet)
    table = Table(title="measured throughput (sender's site -> receiver's site; plans use it "
                  "instead of the RTT formula)", title_justify="left")
    for col, justify in [("from", "left"), ("to", "left"), ("RTT ms", "right"),
                         ("Gbit/s", "right"), ("tests", "right"), ("failed", "right"),
                         ("last test", "left")]:
        table.add_column(col, justify=justify)
    for p in measured:
        rtt = rtts.get((p.src_site, p.dst_site))
        table.add_row(p.src_site, p.dst_site, "-" if rtt is None else f"{rtt:.1f}",
                      f"{p.gbps:.2f}" if p.tests else "-", str(p.tests), str(p.failed),
                      _ago(p.last_ms))
    return table


def _measured_peers(fleet: Fleet) -> tuple[Counter[str], int]:
    """Each node's count of measured peers, and the count of measured pairs."""
    peers: Counter[str] = Counter()
    pairs = set()
    for link in fleet.links:
        key = frozenset((link.src, link.dst))
        if link.src != link.dst and key not in pairs:
            pairs.add(key)
            peers[link.src] += 1
            peers[link.dst] += 1
    return peers, len(pairs)


def _node_table(fleet: Fleet, network, rows: list[dict] | None, peers: Counter[str],
                marks: dict[str, str]):
    """One row per node: its GPUs, memory, throughput and links; with a store, what its agent
    reported, and its launch where any node has one or is marked (``node_marks``): a marked
    node shows its mark instead of the launch it last reported."""
    from rich.table import Table

    by_id = {r["id"]: r for r in rows or []}
    launch = bool(marks) or any(r.get("launch_state") for r in by_id.values())
    # A site column only when a node names a site of its own (else every site is its city).
    sited = any(node.site for node in fleet.nodes)
    table = Table(title=f"fleet {fleet.name}: {count(network.n, 'node')}", title_justify="left")
    for col, justify in [("node", "left"), ("city", "left"), ("site", "left"), ("GPUs", "left"),
                         ("memory GB", "right"), ("TFLOP/s", "right"),
                         ("links", "right"), ("mean RTT ms", "right")]:
        if col != "site" or sited:
            table.add_column(col, justify=justify)
    if rows is not None:
        for col, justify in [("last seen", "left"), ("source", "left"), ("rejected", "right"),
                             ("spool dropped", "right"), ("clock skew", "right")]:
            table.add_column(col, justify=justify)
    if launch:
        for col in ("launch", "job", "exit"):
            table.add_column(col)
    mean_rtt = _mean_measured_rtt(network)
    completed = completed_peers(fleet)
    if completed:
        table.add_column(f"peers {PREDICTED_MARK} / {FORMULA_MARK}", justify="right")
    for i, node in enumerate(network.nodes):
        r = by_id.get(node.id, {})
        # A cloud region's code alone does not say where it is: show its place too.
        cells = [node.id, geo.region_label(node.city) or node.city or "-",
                 *([node.site_key or "-"] if sited else []), _gpus(node, r),
                 f"{round(node.memory_gb, 1):g}", f"{network.thr[i] / 1e12:,.0f}",
                 f"{peers[node.id]}/{network.n - 1}", mean_rtt[i]]
        if completed:
            p, f = completed.get(node.site_key or "", (0, 0))
            cells.append(f"{p} / {f}")
        if rows is not None:
            cells += [_ago(r.get("last_seen_ms")), r.get("source") or "-",
                      str(r.get("rejected") or 0), str(r.get("spool_dropped") or 0),
                      _skew(r.get("clock_skew_ms"))]
        if launch and node.id in marks:
            cells += [marks[node.id], "-", ""]
        elif launch:
            # Only an ended process has an exit code (a running one's 0 would read as success).
            ended = r.get("launch_state") in ("exited", "failed")
            cells += [r.get("launch_state") or "-", r.get("launch_job") or "-",
                      str(r["launch_exit_code"]) if ended and r.get("launch_exit_code") is not None
                      else ""]
        table.add_row(*cells)
    return table


def _mean_measured_rtt(network) -> list[str]:
    """Each node's mean measured RTT, by rows (a Python loop over pairs is minutes at 10,000
    nodes); "-" for a node with no measured link."""
    import numpy as np
    measured = ~network.imputed & np.isfinite(network.rtt_ms)
    np.fill_diagonal(measured, False)
    rtt_sum = np.where(measured, network.rtt_ms, 0.0).sum(axis=1, dtype=float)
    rtt_count = measured.sum(axis=1)
    return [f"{total / count:.1f}" if count else "-" for total, count in zip(rtt_sum, rtt_count)]


def _gpus(node, row: dict) -> str:
    declared = " (declared)" if row.get("gpus_declared") else ""   # a lab's, not NVML's
    if node.gpus and (node.gpu_name or node.compute_capability):
        return f"{node.gpus} x {node.gpu_name or f'cc {node.compute_capability:g}'}{declared}"
    if node.gpus:
        return f"{node.gpus}{declared}"
    reason = row.get("gpu_unavailable_reason")
    return f"none ({reason})" if reason else "none"


def _coverage_lines(fleet: Fleet, network, pairs: int) -> list[str]:
    n = network.n
    total = n * (n - 1) // 2
    components = network.components()
    imputed = int(network.imputed.sum() // 2)
    lines = [f"link coverage: {pairs} of {count(total, 'pair')} measured "
             f"({100 * pairs / total if total else 100:.0f} %), {imputed} completed "
             f"(docs/COSTMODEL.md section 2), {len(components)} connected component"
             f"{'s' if len(components) != 1 else ''}"]
    if fleet.site_links:
        sites = {n.site_key for n in fleet.nodes if n.site_key} | {s.id for s in fleet.sites}
        lines.append(f"site links: {len(fleet.site_links)} between {count(len(sites), 'site')} (each "
                     "stands for every pair of their servers; node links override them)")
        unprobed = sum(1 for link in fleet.site_links
                       if link.source == "measured" and not link.rtt_measured)
        if unprobed:
            lines.append(f"{count(unprobed, 'site link')} with a measured throughput and no "
                         "measured RTT (ICMP blocked or samples refused): planned at that "
                         "throughput and completion's RTT")
        by_source = Counter(link.source for link in fleet.site_links)
        if by_source.keys() - {"measured"}:
            lines.append(f"completed site links (fleet complete): {by_source['predicted']} "
                         f"predicted ({PREDICTED_MARK}: the link model's figures, planned at "
                         f"their conservative bound), {by_source['formula']} formula "
                         f"({FORMULA_MARK}: relay over measured RTTs and the window formula), "
                         f"{by_source['measured']} measured; column 'peers {PREDICTED_MARK} / "
                         f"{FORMULA_MARK}': a node's peers on such links")
    return lines


def completed_peers(fleet: Fleet) -> dict[str, tuple[int, int]]:
    """Per site, how many servers of other sites it reaches over predicted and over formula
    site links (what `fleet complete` wrote); empty when the fleet has no such link."""
    if all(link.source == "measured" for link in fleet.site_links):
        return {}
    servers = Counter(node.site_key for node in fleet.nodes if node.site_key)
    out: dict[str, list[int]] = {}
    for link in fleet.site_links:
        if link.source == "measured" or link.src == link.dst:
            continue
        k = 0 if link.source == "predicted" else 1
        out.setdefault(link.src, [0, 0])[k] += servers[link.dst]
        out.setdefault(link.dst, [0, 0])[k] += servers[link.src]
    return {site: (p, f) for site, (p, f) in out.items()}


def cmd_export(args: argparse.Namespace) -> int:
    from planner.files.fleet import save_fleet_json
    fleet, _ = _load(args)
    by_site = args.site_links == "yes" or (args.site_links == "auto"
                                           and len(fleet.nodes) > SITE_LINKS_FROM_NODES)
    if by_site:
        from planner.core.sites import roll_up_by_site
        fleet = roll_up_by_site(fleet)
    save_fleet_json(fleet, args.out)
    extra = (f", {count(len(fleet.sites), 'site')}, {count(len(fleet.site_links), 'site link')}"
             if by_site else "")
    print(f"wrote {args.out}: {count(len(fleet.nodes), 'node')}, {count(len(fleet.links), 'link')}"
          f"{extra}")
    return 0


def cmd_import(args: argparse.Namespace) -> int:
    from planner.files.fleet import load_fleet_with_report
    from planner.service.store import Store
    # Read and check the whole file before the store is opened: a bad file changes nothing.
    fleet, issues = load_fleet_with_report(args.path)
    for issue in issues:
        print(f"warning: {issue}")
    if fleet.site_links:   # the store holds per-pair rollups of node links only
        print(f"warning: {count(len(fleet.site_links), 'site link')} not imported (the store keeps "
              "measured node links; plan with --fleet to use site links)")
    with Store(args.db) as store:
        result = store.import_fleet(fleet)
    print(f"imported {args.path}: {count(len(fleet.nodes), 'node')} ({result['nodes_added']} new, "
          f"{result['nodes_updated']} updated), {count(result['links'], 'link')}, "
          f"{count(len(issues), 'flaw')} repaired")
    return 0


def cmd_complete(args: argparse.Namespace) -> int:
    from planner.files.fleet import load_fleet, save_fleet_json
    from planner.linkpred.complete import (MIN_MEASURED_THROUGHPUTS, completed_fleet, link_counts,
                                           predict_fleet_links, unreachable_pairs)
    from planner.linkpred.models import MODELS

    if args.model is not None and args.model not in MODELS:
        raise InputError(f"expected one of {', '.join(sorted(MODELS))}, got {args.model!r}",
                         field="--model")
    # A fit leaves torch's many objects for the interpreter's last garbage collections to
    # sweep at exit (a third of a second or more); frozen at exit, the OS reclaims them.
    atexit.register(gc.freeze)
    start = time.perf_counter()
    fleet = load_fleet(args.fleet_file)
    prediction = predict_fleet_links(fleet, MODELS.get(args.model), seed=args.seed)
    save_fleet_json(completed_fleet(fleet, prediction), args.out)
    seconds = time.perf_counter() - start
    counts = link_counts(prediction)
    pairs = len(prediction.sites) * (len(prediction.sites) - 1) // 2
    print(f"wrote {args.out}: {count(len(prediction.sites), 'site')}, {count(pairs, 'site pair')}; "
          f"model {prediction.model}; {seconds:.2f} s")
    for quantity, label in (("rtt", "RTT"), ("gbps", "throughput")):
        c = counts[quantity]
        print(f"  {label}: {c['measured']} measured, {c['predicted']} predicted, "
              f"{c['formula']} formula")
    if prediction.model == "formula" and args.model != "formula":
        print(f"  fewer than {MIN_MEASURED_THROUGHPUTS} site pairs measured a throughput: "
              "completed by relay over measured RTTs and the window formula")
    unreachable = unreachable_pairs(prediction)
    if unreachable:
        print(f"  {count(unreachable, 'site pair')} unreachable (no measured path joins their sites): "
              "written without a site link; no plan can use them")
    return 0


def cmd_plot(args: argparse.Namespace) -> int:
    from planner.plots.fleet import plot_fleet
    from planner.plots.output import plot_path
    plot_path(args.out)   # refused before the fleet is read and drawn
    fleet, _ = _load(args)
    out = plot_fleet(fleet, args.out, show_imputed=args.imputed)
    print(f"wrote {out}")
    return 0
