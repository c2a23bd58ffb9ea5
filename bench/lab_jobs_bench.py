"""WAN lab benchmark of job recovery and hand-over, with real serve, agents and
torchrun training of examples/train_gpt.py:

- node death -> running again from a checkpoint: a job's node (agent and training process) is
  SIGKILLed mid-run; seconds until a rank on another node prints that it resumed from a
  checkpoint (also: until the job record was re-planned, and until it finished);
- last rank exit -> next waiting job starting: two jobs on a one-host fleet, the second waits;
  seconds from the first job's torchrun exiting to the second's torchrun starting.

Target: under 30 s each. serve runs with --node-timeout 5, --recovery-interval 0.5 and
--jobs-interval 0.5; the agents heartbeat every 1 s (lab/job_scenarios.py).

    python -m bench.lab_jobs_bench [--quick]      (root: it builds network namespaces)
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from lab import job_scenarios
from lab import matrix as lab_matrix
from lab.fleet import LabFleet
from lab.netns import LabError, require_root
from lab.wan import WanLab

REPO = Path(__file__).resolve().parents[1]
NODE_TIMEOUT_S = 5.0
TARGET_S = 30.0
RECOVERY_CITIES = ["Beijing", "Tokyo", "London"]
SCALE = 0.25


def _in_fleet(cities: list[str], scenario, work: Path, **kwargs) -> dict:
    """One fresh lab and fleet per run, so runs do not share jobs, nodes or checkpoints."""
    work.mkdir(parents=True)
    with WanLab(lab_matrix.from_cities(cities).scaled(SCALE), work_dir=work / "lab") as lab:
        fleet = LabFleet(lab, work)
        try:
            job_scenarios.start(fleet, NODE_TIMEOUT_S)
            return scenario(fleet, work, **kwargs)
        finally:
            fleet.services.stop()


def _stats(values: list[float]) -> dict:
    return {"runs_s": values, "median_s": statistics.median(values), "max_s": max(values),
            "under_target": max(values) < TARGET_S}


def run(out_dir: Path, quick: bool = False) -> dict:
    require_root()
    if shutil.which("mosquitto") is None:
        raise LabError("mosquitto is not installed")
    rounds = 1 if quick else 3
    t0 = time.monotonic()
    kills, handoffs = [], []
    with tempfile.TemporaryDirectory(prefix="hulk-lab-jobs-") as tmp:
        for k in range(rounds):
            kills.append(_in_fleet(RECOVERY_CITIES, job_scenarios.kill_node_mid_run,
                                   Path(tmp) / f"kill{k}", steps=200 if quick else 300))
            handoffs.append(_in_fleet(["Beijing"], job_scenarios.queue_handoff,
                                      Path(tmp) / f"queue{k}", steps=40))
    for got in kills:
        if got["listed"]["state"] != "succeeded" or not got["resumed"]:
            raise RuntimeError(f"the killed node's job did not resume and succeed: {got}")
    result = {
        "node_timeout_s": NODE_TIMEOUT_S, "target_s": TARGET_S, "rounds": rounds,
        "node_death_to_resumed": _stats([g["kill_to_resumed_s"] for g in kills]),
        "node_death_to_replanned": _stats([g["kill_to_replanned_s"] for g in kills]),
        "last_exit_to_next_start": _stats([g["exit_to_next_start_s"] for g in handoffs]),
        "resumed_from_steps": [sorted({s for s, _ in g["resumed"].values()}) for g in kills],
        "kill_runs": [{k: g[k] for k in ("victim", "first_nodes", "replanned_nodes",
                                         "checkpoint_at_kill", "kill_to_finished_s")} for g in kills],
        "handoff_runs": handoffs,
        "wall_s": time.monotonic() - t0,
    }
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "lab_jobs.json").write_text(json.dumps(result, indent=1, default=str))
    return result


def summarize(result: dict) -> str:
    lines = [f"Jobs in the WAN lab (serve --node-timeout {result['node_timeout_s']:g}, "
             f"{result['rounds']} run(s) each; target under {result['target_s']:g} s):", "",
             "| interval | median s | max s | runs s | under target |", "|---|---|---|---|---|"]
    for key, label in (("node_death_to_resumed", "node SIGKILLed -> job resumed from a checkpoint"),
                       ("node_death_to_replanned", "node SIGKILLed -> job re-planned (record)"),
                       ("last_exit_to_next_start", "last rank exits -> waiting job starts")):
        s = result[key]
        runs = ", ".join(f"{v:.1f}" for v in s["runs_s"])
        lines.append(f"| {label} | {s['median_s']:.1f} | {s['max_s']:.1f} | {runs} | "
                     f"{'yes' if s['under_target'] else 'NO'} |")
    lines += ["", f"- resumed from steps: {result['resumed_from_steps']}", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.lab_jobs_bench")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    a = p.parse_args(argv)
    try:
        result = run(a.out, quick=a.quick)
    except LabError as err:
        print(f"lab_jobs_bench: {err}", file=sys.stderr)
        return 2
    print(summarize(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
