"""`hulk-planner calibrate --db STORE`: fit the calibrated cost model to what the fleet measured.

Throughput tests give a bandwidth per link class (Gbit/s, for the pairs not measured) and how
it falls with RTT (one exponent for the fleet), the step times jobs reported give a
compute factor per GPU model, a per-hop overhead and a communication factor
(docs/COSTMODEL.md section 8). Each factor is printed with its 16th-84th percentile interval
and the runs behind it; one with too little evidence keeps its prior. `--out FILE` writes the
calibration `plan --cost-model calibrated --calibration FILE` reads.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from hulk.errors import InputError
from hulk.plural import count
from planner.settings import PlannerSettings


def register(subparsers: argparse._SubParsersAction, settings: PlannerSettings) -> None:
    p = subparsers.add_parser(
        "calibrate", help="fit the calibrated cost model to measured step times and throughput",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--db", default=settings.db, help="the planner's SQLite store (HULK_DB)")
    p.add_argument("--out", metavar="FILE", help="write the calibration as JSON")
    p.add_argument("--json", action="store_true", help="print the calibration as JSON instead")
    p.add_argument("--min-runs", type=int, default=3, metavar="N",
                   help="observations a factor needs to move off its prior (default 3)")
    p.add_argument("--seed", type=int, default=0, help="seed of the bootstrap (default 0)")
    p.set_defaults(func=run)


def load_store_calibration(db: str, *, min_runs: int = 3, seed: int = 0, net=None):
    """(Calibration, CalibrationData) of the store at ``db``, on ``net`` (default: the store's
    own completed network)."""
    from planner.service.calibration_data import calibrate, calibration_data
    from planner.service.store import Store

    if not db:
        raise InputError("expected a store path", field="--db")
    if not Path(db).is_file():
        raise InputError("no such store (expected the SQLite file `serve --db` writes)", path=db,
                         field="--db")
    with Store(db, read_only=True) as store:
        data = calibration_data(store, net=net)
    return calibrate(data, min_runs=min_runs, seed=seed), data


def load_calibration_file(path: str):
    """The Calibration a `calibrate --out` file holds; one-line InputError otherwise."""
    from planner.core.calibration import Calibration

    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise InputError(f"cannot read it ({exc.strerror or exc})", path=path) from None
    try:
        data = json.loads(text)
    except RecursionError:
        raise InputError("not a calibration: JSON nested too deeply", path=path) from None
    except ValueError as exc:
        raise InputError(f"not JSON ({exc})".split(";")[0], path=path) from None
    return Calibration.from_json(data, path)


def add_cost_model_flags(p: argparse.ArgumentParser) -> None:
    """`plan`'s --cost-model and --calibration."""
    p.add_argument("--cost-model", choices=("reference", "calibrated"), default=None,
                   help="cost model the plan is made and judged with (default: calibrated when "
                        "--calibration is given or the --db store holds enough calibration "
                        "data, else reference)")
    p.add_argument("--calibration", metavar="FILE",
                   help="a calibration `hulk-planner calibrate --out` wrote")


def cost_model_for(args: argparse.Namespace, net):
    """(the cost model's name as plans print it, the network to plan on) for `plan`'s flags:
    "reference" and ``net`` itself, or "calibrated (FILE or STORE)" and the calibrated copy."""
    wanted = getattr(args, "cost_model", None)
    path = getattr(args, "calibration", None)
    db = getattr(args, "db", None)
    if path:
        if wanted == "reference":
            raise InputError("a calibration is read only with --cost-model calibrated; drop one "
                             "of them", field="--calibration")
        return f"calibrated ({path})", load_calibration_file(path).apply(net)
    if wanted == "reference":
        return "reference", net
    if db:
        from planner.service.calibration_data import has_evidence

        cal, _ = load_store_calibration(db, net=net)
        if has_evidence(cal):
            return f"calibrated ({db})", cal.apply(net)
        if wanted == "calibrated":
            raise InputError(f"{db} holds too little calibration data for any factor (see "
                             "`hulk-planner calibrate --db`)", field="--cost-model")
        return "reference", net
    if wanted == "calibrated":
        raise InputError("expected --calibration FILE or --db STORE to calibrate from",
                         field="--cost-model")
    return "reference", net


def run(args: argparse.Namespace) -> int:
    if args.min_runs < 1:
        raise InputError(f"expected a whole number >= 1, got {args.min_runs}", field="--min-runs")
    cal, data = load_store_calibration(args.db, min_runs=args.min_runs, seed=args.seed)
    if not data.observations and not data.bandwidth:
        why = f"; {data.skipped[0]}" if data.skipped else ""
        raise InputError(f"no measured iterations in {args.db}: no placed job has reported its "
                         f"step times and no throughput test has finished{why}")
    doc = cal.to_json()
    if args.out:
        Path(args.out).write_text(json.dumps(doc, indent=2) + "\n")
    if args.json:
        print(json.dumps(doc, indent=2))
        return 0
    print_calibration(cal, data, args.db)
    if args.out:
        print(f"calibration written to {args.out}")
    return 0


def _num(x: float, unit: str = "") -> str:
    if not math.isfinite(x):
        return "-"
    if unit == "s":
        return f"{x * 1000:.1f} ms" if x < 1 else f"{x:.2f} s"
    if unit == "Gbit/s":
        return f"{x:.3g} Gbit/s"
    if unit == "exponent":
        return f"{x:.2f}"
    return f"{x:.3g}x"


def factor_rows(cal) -> list[tuple[str, str, str, str, str]]:
    """(factor, value, interval, runs, fitted or prior) for every factor of ``cal``; a link
    class's bandwidth is in Gbit/s, or "formula" while it is not fitted; the bandwidth
    exponent is the power of the formula's Gbit/s the class figures are multiplied by."""
    rows = []
    named = [(f"compute {k}", f, "") for k, f in cal.compute.items()]
    named += [(f"bandwidth {k}", f, "Gbit/s") for k, f in cal.bandwidth.items()]
    named += [("bandwidth exponent", cal.bandwidth_exponent, "exponent")]
    named += [("hop overhead", cal.hop_overhead_s, "s"),
              ("micro-batch overhead", cal.micro_batch_overhead_s, "s"),
              ("step overhead", cal.step_overhead_s, "s"),
              ("communication", cal.communication, ""),
              ("outer sync", cal.outer_sync, "")]
    for name, f, unit in named:
        interval = f"{_num(f.low, unit)} - {_num(f.high, unit)}" if f.fitted else "-"
        value = "formula" if unit == "Gbit/s" and not f.fitted else _num(f.value, unit)
        rows.append((name, value, interval, str(f.runs), "fitted" if f.fitted else "prior"))
    return rows


def print_calibration(cal, data, db: str) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    table = Table(title=f"calibration of {db}: {count(len(data.observations), 'job run')}, "
                        f"{count(len(data.bandwidth), 'site pair')} with throughput tests",
                  header_style="bold")
    for col in ("factor", "value", "interval (16-84%)", "runs", ""):
        table.add_column(col, justify="left" if col in ("factor", "") else "right")
    for row in factor_rows(cal):
        table.add_row(*row)
    console.print(table)
    if cal.outliers:
        console.print(f"left out as outliers: {', '.join(cal.outliers)}", highlight=False)
    for line in data.skipped:
        console.print(f"[dim]not used: {line}[/dim]", highlight=False)
