"""Launch examples/train_gpt.py as one placement: a process per node, on loopback or in the lab.

This plays the agents' part for tests and the benchmark: every node gets torchrun's variables
(RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT) and the HULK_* variables of its stage and replica,
exactly as the placement spells them out, and runs in its host's namespace when a lab is given.
"""

from __future__ import annotations

import json
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from lab.wan import REPO, WanLab

EXAMPLE = REPO / "examples" / "train_gpt.py"
_STEP = re.compile(r"^step (\d+)/\d+ stage (\d+) replica (\d+) time ([0-9.]+)s(?: loss ([0-9.eE+-]+|nan|inf))?"
                   r"(?:.* at ([0-9.]+)$)?",
                   re.M)


@dataclass
class NodeRun:
    host: str
    rank: int
    stage: int
    replica: int
    returncode: int
    output: str
    step_s: list[float] = field(default_factory=list)
    loss: list[float] = field(default_factory=list)
    end_s: list[float] = field(default_factory=list)    # wall clock at each step's end


@dataclass
class JobRun:
    nodes: list[NodeRun]

    @property
    def ok(self) -> bool:
        return all(n.returncode == 0 for n in self.nodes)

    def iteration_s(self, skip: int = 1) -> float:
        """Median over steps (after ``skip`` warm-up steps) of the slowest node's step time.

        The nodes wait on each other, so a step lasts as long as its slowest node; the median keeps
        one step slowed by something else on the machine from moving the figure."""
        steps = min(len(n.step_s) for n in self.nodes)
        per_step = [max(n.step_s[i] for n in self.nodes) for i in range(skip, steps)]
        return statistics.median(per_step) if per_step else float("nan")

    @property
    def loss(self) -> list[float]:
        return next((n.loss for n in self.nodes if n.loss and n.replica == 0), [])

    def mean_loss(self) -> list[float]:
        """Per step, the loss averaged over the replicas (each on its share of the batch)."""
        curves = [n.loss for n in self.nodes if n.loss]
        steps = min((len(c) for c in curves), default=0)
        return [sum(c[i] for c in curves) / len(curves) for i in range(steps)]

    def mean_iteration_s(self, skip: int = 1) -> float:
        """Mean over steps (after ``skip``) of the slowest node's step: the steps an outer sync
        lengthens count at their share, as in the wall time."""
        steps = min(len(n.step_s) for n in self.nodes)
        per_step = [max(n.step_s[i] for n in self.nodes) for i in range(skip, steps)]
        return statistics.fmean(per_step) if per_step else float("nan")

    def wall_iteration_s(self, skip: int = 1) -> float:
        """Wall seconds per step after ``skip`` steps: from the last node's end of step ``skip``
        to the last node's end of the final step, over the steps between (the lab's hosts share
        one clock). The job goes at its slowest node's pace; islands of a DiLoCo job that drift
        apart between outer steps meet again at each one, so a per-step maximum over nodes counts
        that drift twice (in the slower island's steps and in the other's wait). NaN when a node
        printed no clock."""
        steps = min(len(n.step_s) for n in self.nodes)
        if steps <= skip or skip < 1 or any(len(n.end_s) < steps for n in self.nodes):
            return float("nan")
        start = max(n.end_s[skip - 1] for n in self.nodes)
        end = max(n.end_s[steps - 1] for n in self.nodes)
        return (end - start) / (steps - skip)

    def failure(self) -> str:
        bad = [n for n in self.nodes if n.returncode != 0]
        return "\n".join(f"--- {n.host} (rank {n.rank}) exit {n.returncode}\n{n.output[-2000:]}" for n in bad)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def split_layers(layers: int, stages: int) -> list[tuple[int, int]]:
    return [(layers * k // stages, layers * (k + 1) // stages) for k in range(stages)]


def run_placement(stages: list[list[str]], *, lab: WanLab | None = None, layers: int = 4,
                  steps: int = 3, micro_batch: int = 2, args: list[str] | None = None,
                  timeout_s: float = 300.0, python: str = sys.executable,
                  job: str = "train-gpt", plan_id: str = "lab", reverse_ranks: bool = False,
                  layer_ranges: list[tuple[int, int]] | None = None,
                  env_for: Callable[[int, int], dict[str, str]] | None = None) -> JobRun:
    """Run the example with ``stages[k]`` = the hosts of stage k (the p-th host is replica p),
    stage k holding blocks ``layer_ranges[k]`` (default: ``layers`` split evenly).

    ``env_for(stage, replica)``: more variables for that node (a DiLoCo job's HULK_SYNC family).
    Without a lab the hosts are just labels and everything runs on 127.0.0.1. Ranks follow stage
    order, or the reverse with ``reverse_ranks`` (a launcher may number nodes any way it likes).
    """
    k, d = len(stages), len(stages[0])
    if any(len(s) != d for s in stages):
        raise ValueError("every stage must list the same number of hosts")
    ranges = split_layers(layers, k) if layer_ranges is None else [tuple(r) for r in layer_ranges]
    if len(ranges) != k or ranges[0][0] != 0 or ranges[-1][1] != layers \
            or any(a[1] != b[0] or a[0] >= a[1] for a, b in zip(ranges, ranges[1:] + [(layers, 0)])):
        raise ValueError(f"layer ranges {ranges} must split [0, {layers}) into {k} contiguous stages")
    # The rendezvous store lives with rank 0.
    master_host = stages[-1][-1] if reverse_ranks else stages[0][0]
    master_addr = lab.address(master_host) if lab else "127.0.0.1"
    port = 29500 if lab else free_port()
    procs = []
    nodes: list[NodeRun] = []
    base_env = {key: os.environ[key] for key in ("PATH", "HOME", "LANG") if key in os.environ}
    base_env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    base_env["OMP_NUM_THREADS"] = "1"
    natural = 0
    with tempfile.TemporaryDirectory(prefix="hulk-train-") as tmp:
        for s, hosts in enumerate(stages):
            for r, host in enumerate(hosts):
                rank = k * d - 1 - natural if reverse_ranks else natural
                natural += 1
                env = dict(base_env, RANK=str(rank), LOCAL_RANK="0", WORLD_SIZE=str(k * d),
                           MASTER_ADDR=master_addr, MASTER_PORT=str(port),
                           HULK_STAGE=str(s), HULK_NUM_STAGES=str(k),
                           HULK_LAYER_LO=str(ranges[s][0]), HULK_LAYER_HI=str(ranges[s][1]),
                           HULK_REPLICA=str(r), HULK_NUM_REPLICAS=str(d),
                           HULK_MICRO_BATCH=str(micro_batch), HULK_JOB=job, HULK_PLAN_ID=plan_id,
                           **(env_for(s, r) if env_for else {}))
                argv = [python, str(EXAMPLE), "--steps", str(steps), "--layers", str(layers),
                        *(args or [])]
                log = open(Path(tmp) / f"rank{rank}.log", "w+")
                if lab:
                    proc = lab.popen(host, argv, env=env, stdout=log, stderr=subprocess.STDOUT)
                else:
                    proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)
                procs.append((proc, log))
                nodes.append(NodeRun(host, rank, s, r, -1, ""))
        try:
            for (proc, _), node in zip(procs, nodes):
                node.returncode = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            for proc, _ in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
        for (proc, log), node in zip(procs, nodes):
            if node.returncode == -1:
                node.returncode = proc.returncode if proc.returncode is not None else -9
            log.seek(0)
            node.output = log.read()
            log.close()
            for m in _STEP.finditer(node.output):
                node.step_s.append(float(m.group(4)))
                if m.group(5):
                    node.loss.append(float(m.group(5)))
                if m.group(6):
                    node.end_s.append(float(m.group(6)))
    return JobRun(nodes)


def main(argv: list[str] | None = None) -> int:
    """``python -m lab.train HOST,HOST HOST,HOST`` on loopback: stage per argument."""
    import argparse

    p = argparse.ArgumentParser(prog="python -m lab.train")
    p.add_argument("stages", nargs="+", help="comma-separated hosts of each stage")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--layers", type=int, default=4)
    a = p.parse_args(argv)
    run = run_placement([s.split(",") for s in a.stages], steps=a.steps, layers=a.layers)
    print(json.dumps({"ok": run.ok, "iteration_s": run.iteration_s(), "loss": run.loss}))
    return 0 if run.ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
