"""A small fleet and placements the calibration tests share: four A100 nodes on two sites, a
two-stage x two-replica step placement and a one-stage DiLoCo placement of two islands."""

from __future__ import annotations

import numpy as np

from planner.core.costmodel import OuterSync, Placement, Stage
from planner.core.fleet import Network, Node
from planner.core.jobs import Job

JOB = Job("j", params=1e9, layers=24, hidden=1024, seq_len=1024, global_batch=64, micro_batch=2)


def lab_net(n: int = 4) -> Network:
    """``n`` A100 nodes, two sites, 1 ms within a site and 80 ms between them."""
    nodes = [Node(id=f"n{i}", gpus=1, gpu_name="A100", memory_gb=320, site=f"s{i % 2}")
             for i in range(n)]
    rtt = np.array([[0.0 if i == j else 1.0 if i % 2 == j % 2 else 80.0 for j in range(n)]
                    for i in range(n)])
    return Network.from_matrix(nodes, rtt)


def step_placement(job: Job = JOB) -> Placement:
    return Placement(job, (Stage(0, 12, (0, 2)), Stage(12, 24, (1, 3))), micro_batch=2)


def diloco_placement(job: Job = JOB) -> Placement:
    return Placement(job, (Stage(0, 24, (0, 2, 1, 3)),), micro_batch=2, islands=(2, 2),
                     outer=OuterSync(inner_steps=10, compression="int8"))
