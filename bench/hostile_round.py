"""A hostile round against the programs as they run: real processes on loopback
(`python -m bench.hostile_round`), six classes, each probe counted tried, held or failed.

1. gRPC before authentication (bench/hostile_grpc.py): a real `hulk-planner serve` over TLS with
   enrolled nodes; no token, wrong tokens, malformed and huge metadata, oversized messages,
   bytes that are not HTTP/2, half-open calls and streams from 1 and 10 source addresses,
   unknown methods. Held: a specific status on the wire, no traceback in serve's log, and the
   enrolled agent's Register and Heartbeat answered within 1 s each (while calls are held).
2. The throughput port (bench/hostile_throughput.py): the agent's sender aimed at servers that
   are no receiver (0 payload bytes), the receiver facing clients that are no sender (nothing
   useful back, 0 bytes counted), both ending within their bounds.
3. The HTTP servers (bench/hostile_http.py): serve's --dashboard (HTTPS, token) and --metrics;
   slow and huge heads, bad methods, path traversal, bad tokens, slow connections from
   127.0.0.2-41: the operator's GET from 127.0.0.1 still answered within 2 s.
4. Every file reader (bench/hostile_files.py): calibration, fleet JSON, paper zip, jobs.yaml
   (`plan`, `jobs submit`, `fleet import`), agent.yaml, serve's token, TLS and signing-key files:
   exit 2 and one line naming the file.
5. The store (bench/hostile_store.py): not a store, corrupted, read-only, locked by another
   writer, on a full disk (a 4 MiB tmpfs; root), served twice: one line (exit 2, or 1 where
   documented), nothing stored lost.
6. Signals during writes (bench/hostile_signals.py): `plan --out`, `jobs submit`, `fleet import`
   and serve (while agents report and `jobs submit` writes) stopped by SIGTERM/SIGKILL/SIGINT:
   nothing acknowledged lost, the store opens again.

A rich progress line per class while it runs, then a table of counts per class and every failure
(probe, expected, observed, the code suspected). Figures go to bench/results/hostile_round.json
with the date (`date -u`), the command and the wall time. Needs root for the tmpfs of the store
class (skipped with a failure line otherwise) and 127.0.0.0/8 on loopback.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.hostile_common import Outcome  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "hostile_round.json"
CLASSES = {   # key: (title, module, function)
    "grpc": ("gRPC before authentication", "bench.hostile_grpc", "grpc_round"),
    "throughput": ("the throughput port", "bench.hostile_throughput", "throughput_round"),
    "http": ("the HTTP servers", "bench.hostile_http", "http_round"),
    "files": ("every file reader", "bench.hostile_files", "file_round"),
    "store": ("the store", "bench.hostile_store", "store_round"),
    "signals": ("signals during writes", "bench.hostile_signals", "signal_round"),
}


def run_class(key: str, tmp: Path, args) -> object:
    import importlib

    _, module, name = CLASSES[key]
    fn = getattr(importlib.import_module(module), name)
    if key == "signals":
        return fn(tmp / key, args.signal_rounds)
    return fn(tmp / key)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="classes: " + ", ".join(CLASSES))
    parser.add_argument("--only", nargs="+", choices=list(CLASSES), metavar="CLASS",
                        help="run these classes only (default: all six)")
    parser.add_argument("--signal-rounds", type=int, default=3,
                        help="rounds of each signal per writer (default 3)")
    parser.add_argument("--out", default=str(RESULTS), help="where the JSON goes")
    args = parser.parse_args(argv)

    from rich.console import Console
    from rich.markup import escape
    from rich.progress import (BarColumn, Progress, SpinnerColumn, TextColumn,
                               TimeElapsedColumn)
    from rich.table import Table

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)   # thousands of sockets at once
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 65536)), hard))
    console = Console()
    keys = args.only or list(CLASSES)
    started = time.monotonic()
    date = subprocess.run(["date", "-u"], capture_output=True, text=True).stdout.strip()
    outcomes: dict[str, list[Outcome]] = {k: [] for k in keys}
    columns = (SpinnerColumn(), TextColumn("[bold]{task.fields[title]:<28}"),
               BarColumn(bar_width=20), TextColumn("{task.fields[counts]}"),
               TimeElapsedColumn(), TextColumn("{task.description}"))
    with tempfile.TemporaryDirectory(prefix="hostile-") as name, \
            Progress(*columns, console=console, transient=False) as progress:
        tmp = Path(name)
        tasks = {k: progress.add_task("waiting", total=None, title=escape(CLASSES[k][0]),
                                      counts="", start=False) for k in keys}
        for key in keys:
            task = tasks[key]
            progress.start_task(task)
            progress.update(task, description="starting")
            try:
                for outcome in run_class(key, tmp, args):
                    outcomes[key].append(outcome)
                    done = outcomes[key]
                    held = sum(o.held for o in done)
                    progress.update(task, advance=1, description=escape(outcome.probe[:60]),
                                    counts=f"{len(done)} tried, {held} held, "
                                           f"{len(done) - held} failed")
                    if not outcome.held:
                        progress.console.print("[red]FAILED[/] " + escape(
                            f"{CLASSES[key][0]}: {outcome.probe}: {outcome.detail[:300]}"))
            except Exception as err:   # noqa: BLE001 - a class that breaks is a failure, shown
                outcomes[key].append(Outcome(f"{key}: the class broke", False, None, 0.0,
                                             f"{type(err).__name__}: {err}"))
                progress.console.print("[red]BROKE[/] " + escape(f"{key}: {type(err).__name__}: "
                                                                  f"{err}"))
            progress.update(task, total=len(outcomes[key]), completed=len(outcomes[key]),
                            description="done")
    wall = time.monotonic() - started

    table = Table(title=f"hostile round ({wall / 60:.1f} min)")
    for col in ("class", "tried", "held", "failed"):
        table.add_column(col, justify="left" if col == "class" else "right")
    summary = {}
    for key in keys:
        done = outcomes[key]
        held = sum(o.held for o in done)
        summary[key] = {"title": CLASSES[key][0], "tried": len(done), "held": held,
                        "failed": len(done) - held}
        table.add_row(CLASSES[key][0], str(len(done)), str(held), str(len(done) - held))
    tried = sum(s["tried"] for s in summary.values())
    held = sum(s["held"] for s in summary.values())
    table.add_row("[bold]all", f"[bold]{tried}", f"[bold]{held}", f"[bold]{tried - held}")
    console.print(table)
    failures = [{"class": CLASSES[k][0], **asdict(o)} for k in keys for o in outcomes[k]
                if not o.held]
    for f in failures:
        console.print(escape(f"- {f['class']}: {f['probe']}\n  expected: {f['expected']}\n"
                             f"  observed: {f['code']}: {f['detail']}\n  suspected: {f['where']}"),
                      highlight=False)
    result = {"date": date, "date_iso": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "command": "python -m bench.hostile_round " + " ".join(
                  sys.argv[1:] if argv is None else argv),
              "wall_s": round(wall, 1), "machine": {"cpus": os.cpu_count(),
                                                    "load_1min_at_end": os.getloadavg()[0]},
              "classes": summary, "tried": tried, "held": held, "failed": tried - held,
              "failures": failures,
              "probes": [{"class": CLASSES[k][0], **asdict(o)} for k in keys for o in outcomes[k]]}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1, default=str) + "\n")
    console.print(f"hostile round: {tried} tried, {held} held, {tried - held} failed in "
                  f"{wall:.0f} s (written to {args.out})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
