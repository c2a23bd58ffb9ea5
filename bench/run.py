"""Run every benchmark module present and write bench/results/*.json plus SUMMARY.md.

    python -m bench.run --shared ../shared [--quick] [--only plan_bench,ingest]

Each module runs in its own Python process (a crash, a hang past ``--timeout`` or a leaked event
loop in one cannot spoil the others) through ``python -m bench.run --one MODULE``, which calls
the module's ``run(out_dir, ...)`` with the arguments it accepts (``shared``, ``quick``) and, when
the module has ``summarize(result) -> str``, writes its markdown for the summary. A module that is
missing or fails is reported in SUMMARY.md and the others still run. SUMMARY.md and run.json
keep the latest run of every module: a run with ``--only`` replaces those modules' sections
(each heading says when and how it ran) and leaves the others as they were.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import inspect
import json
import re
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# In the order they run; each writes bench/results/<its name>.json.
MODULES = ["plan_bench", "portfolio_bench", "lower_bound_bench",
           "exact_bench", "diloco_bench", "gnn_bench", "gnn_ablation", "ingest", "agent_cost",
           "flood_bench", "lab_bench", "lab_jobs_bench", "calibration_lab_bench", "ingest_fleet",
           "store_size", "agent_cost_fleet", "scale_bench", "probe_plan_bench", "replan_bench",
           "serve_planner_bench", "skyplane_bench", "throughput_bench"]


def run_one(module_name: str, out_dir: Path, shared: Path, quick: bool, summary_file: Path) -> int:
    """In the child process: import and run one module, write its summary fragment."""
    module = importlib.import_module(f"bench.{module_name}")
    params = inspect.signature(module.run).parameters
    kwargs = {}
    if "shared" in params:
        kwargs["shared"] = shared
    if "quick" in params:
        kwargs["quick"] = quick
    result = module.run(out_dir, **kwargs)
    if hasattr(module, "summarize"):
        text = module.summarize(result)
    else:
        text = generic_summary(result)
    summary_file.write_text(text)
    return 0


def generic_summary(result) -> str:
    """Top-level scalars of a result dict as a bullet list (modules without ``summarize``)."""
    if not isinstance(result, dict):
        return f"- result: {result!r}\n"
    lines = []
    for key, value in result.items():
        if isinstance(value, (int, float, str, bool)) or value is None:
            if isinstance(value, float):
                value = f"{value:.4g}"
            lines.append(f"- {key}: {value}")
        elif isinstance(value, dict):
            flat = {k: v for k, v in value.items() if isinstance(v, (int, float, str, bool))}
            if flat:
                shown = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                                  for k, v in list(flat.items())[:12])
                lines.append(f"- {key}: {shown}")
    return "\n".join(lines) + "\n" if lines else "- (no scalar figures)\n"


def summary_sections(text: str) -> dict[str, str]:
    """A SUMMARY.md's sections by module name (each from its ``## name`` line to the next)."""
    sections: dict[str, str] = {}
    for part in re.split(r"(?m)^(?=## )", text):
        match = re.match(r"## (\S+)", part)
        if match:
            sections[match.group(1)] = part.rstrip("\n") + "\n"
    return sections


def merged_sections(old: dict[str, str], new: dict[str, str]) -> list[str]:
    """The latest section of every module: ``new`` over ``old``, in MODULES order (modules no
    longer in MODULES last, as they were)."""
    both = {**old, **new}
    order = [m for m in MODULES if m in both] + [m for m in both if m not in MODULES]
    return [both[m] for m in order]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__.splitlines()[0])
    parser.add_argument("--shared", type=Path, default=REPO / ".." / "shared")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    parser.add_argument("--quick", action="store_true", help="smaller sizes where modules allow it")
    parser.add_argument("--only", help="comma-separated module names (default: all present)")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds per module")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    parser.add_argument("--summary-file", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    shared = args.shared.resolve()
    out_dir = args.out.resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    if args.one:
        return run_one(args.one, out_dir, shared, args.quick, args.summary_file)

    wanted = args.only.split(",") if args.only else MODULES
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    how = f"{stamp}{', --quick' if args.quick else ''}"
    sections: dict[str, str] = {}
    status: dict[str, dict] = {}
    for name in wanted:
        if importlib.util.find_spec(f"bench.{name}") is None:
            print(f"[bench] {name}: not present, skipped", flush=True)
            status[name] = {"status": "missing", "at": stamp}
            sections[name] = f"## {name} ({how})\n\nnot present in this checkout.\n"
            continue
        fragment = out_dir / f".{name}.summary.md"
        fragment.unlink(missing_ok=True)
        cmd = [sys.executable, "-m", "bench.run", "--one", name, "--shared", str(shared),
               "--out", str(out_dir), "--summary-file", str(fragment)]
        if args.quick:
            cmd.append("--quick")
        print(f"[bench] {name}: running", flush=True)
        t0 = time.perf_counter()
        # stdout streams through (progress lines); stderr goes to a file, its tail to the summary.
        with tempfile.TemporaryFile(mode="w+") as err:
            try:
                proc = subprocess.run(cmd, cwd=REPO, timeout=args.timeout, stderr=err, text=True)
                rc = proc.returncode
                err.seek(0)
                tail = err.read().strip().splitlines()[-5:] if rc else []
            except subprocess.TimeoutExpired:
                rc, tail = None, [f"timed out after {args.timeout:.0f} s"]
        seconds = time.perf_counter() - t0
        if rc == 0 and fragment.exists():
            status[name] = {"status": "ok", "seconds": round(seconds, 1), "at": stamp,
                            "quick": args.quick}
            sections[name] = f"## {name} ({seconds:.0f} s, {how})\n\n{fragment.read_text()}"
            print(f"[bench] {name}: ok in {seconds:.0f} s", flush=True)
        else:
            why = "\n".join(tail + [f"exit code {rc}" if rc is not None else ""]).strip()
            status[name] = {"status": "failed", "seconds": round(seconds, 1), "error": why,
                            "at": stamp, "quick": args.quick}
            sections[name] = (f"## {name} (FAILED after {seconds:.0f} s, {how})\n\n"
                              f"```\n{why}\n```\n")
            print(f"[bench] {name}: FAILED ({why.splitlines()[-1] if why else rc})", flush=True)
        fragment.unlink(missing_ok=True)

    summary_path, run_path = out_dir / "SUMMARY.md", out_dir / "run.json"
    old = summary_sections(summary_path.read_text()) if summary_path.exists() else {}
    head = ("# Benchmark summary\n\nThe latest run of each benchmark (`python -m bench.run "
            "--shared ../shared [--quick] [--only M,...]`; each heading gives its run time, "
            "date and whether it was quick); figures in bench/results/*.json.\n\n")
    summary_path.write_text(head + "\n".join(merged_sections(old, sections)))
    try:
        previous = json.loads(run_path.read_text()).get("modules", {})
    except (OSError, ValueError, AttributeError):
        previous = {}
    run_path.write_text(json.dumps({"at": stamp, "modules": {**previous, **status}},
                                   indent=2) + "\n")
    failed = [n for n, s in status.items() if s["status"] == "failed"]
    print(f"[bench] summary written to {out_dir / 'SUMMARY.md'}"
          + (f"; failed: {', '.join(failed)}" if failed else ""), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
