"""What one run of bench/diloco_lab_bench.py measured, from the trainers' output
(examples/train_gpt.py's step lines): its iteration, tokens per second, loss curve and outer
steps."""

from __future__ import annotations

import math
import re
import statistics

from bench.calibration_lab_bench import GLOBAL_BATCH, SEQ_LEN
from lab.train import JobRun

OUTER = re.compile(r" outer \d+ ([0-9.]+)s")
PHASES = re.compile(r" outer (\d+) ([0-9.]+)s exchange ([0-9.]+)s broadcast ([0-9.]+)s enter ([0-9.]+)")


def figures(done: JobRun, skip: int, tokens_per_step: int = GLOBAL_BATCH * SEQ_LEN) -> dict:
    iteration = done.wall_iteration_s(skip)
    loss = done.mean_loss()
    tail = max(1, len(loss) // 10)
    return {"iteration_s": iteration, "median_step_s": done.iteration_s(skip),
            "step_max_mean_s": done.mean_iteration_s(skip),
            "tokens_per_s": tokens_per_step / iteration, "tokens_per_step": tokens_per_step,
            "loss": loss,
            "final_loss": statistics.fmean(loss[-tail:]) if loss else math.nan,
            "outer_syncs": max((n.output.count(" outer ") for n in done.nodes), default=0),
            "outer_sync_s": outer_seconds(done)}


def outer_seconds(done: JobRun) -> list[float]:
    """Per outer step, the longest any node spent in it (the trainer's ``outer N T s``)."""
    per_node = [[float(t) for t in OUTER.findall(n.output)] for n in done.nodes]
    per_node = [times for times in per_node if times]
    return [max(ts) for ts in zip(*per_node)] if per_node else []


def outer_phases(done: JobRun, leaders: set[str]) -> list[dict]:
    """Per outer step, where its time went (the trainer's ``outer N T s exchange E s broadcast
    B s enter W``): ``wait_s``, how long the first island leader to arrive waited for the last
    (their entry clocks; the lab's hosts share one clock); ``exchange_s``, the last leader's
    exchange, the transfer without that wait; ``broadcast_s``, the longest broadcast within an
    island, its wait for the leader included; ``total_s``, the longest outer step of any node."""
    per_node = {n.host: {int(m[0]): [float(v) for v in m[1:]] for m in PHASES.findall(n.output)}
                for n in done.nodes}
    rounds = sorted(set().union(*(set(v) for v in per_node.values())))
    out = []
    for r in rounds:
        lead = [per_node[h][r] for h in leaders if r in per_node.get(h, {})]
        rest = [v[r] for h, v in per_node.items() if h not in leaders and r in v]
        if not lead:
            continue
        enters = [v[3] for v in lead]
        last = max(lead, key=lambda v: v[3])
        out.append({"round": r, "wait_s": max(enters) - min(enters), "exchange_s": last[1],
                    "broadcast_s": max((v[2] for v in rest), default=0.0),
                    "total_s": max(v[0] for v in lead + rest)})
    return out
