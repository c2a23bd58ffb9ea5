"""Small hand-built networks, jobs and plans for the planner's tests (plain values)."""

from __future__ import annotations

import numpy as np

from planner.core.costmodel import Placement, Stage
from planner.core.fleet import Network, Node
from planner.core.jobs import MODEL_CATALOG, Job
from planner.core.plan import Plan

A100 = "NVIDIA A100-SXM4-40GB"


def make_net(specs: list[tuple[str, int, float]], rtt_ms: list[list[float]]) -> Network:
    """Nodes from (gpu_name, gpus, memory_gb) and a full RTT matrix; bandwidth from the TCP model."""
    nodes = [Node(id=str(k), city=None, gpus=g, gpu_name=name, memory_gb=mem)
             for k, (name, g, mem) in enumerate(specs)]
    return Network.from_matrix(nodes, np.array(rtt_ms, dtype=float))


def two_city_net(per_city: int = 3, ids: list[str] | None = None) -> Network:
    """``2 * per_city`` 8-GPU nodes, 1 ms inside a city, 80 ms between the two."""
    n = 2 * per_city
    ids = ids or [f"n{i}" for i in range(n)]
    nodes = [Node(id=ids[i], city="Beijing" if i < per_city else "Tokyo", gpus=8, gpu_name=A100,
                  memory_gb=320) for i in range(n)]
    rtt = np.full((n, n), 80.0)
    rtt[:per_city, :per_city] = 1.0
    rtt[per_city:, per_city:] = 1.0
    return Network.from_matrix(nodes, rtt)


def job(name: str, model: str = "gpt2-xl", command: tuple[str, ...] | None = None) -> Job:
    return Job(name=name, model=model, command=command, **MODEL_CATALOG[model])


def manual_plan(net: Network) -> Plan:
    """Job 'a': 2 stages x 2 replicas on n0..n3; job 'b': 1 stage on n4; n5 free."""
    a = Placement(job("a", command=("python", "train.py", "--steps", "3")),
                  (Stage(0, 20, (0, 1)), Stage(20, 48, (2, 3))), micro_batch=2)
    b = Placement(job("b", "bert-large"), (Stage(0, 24, (4,)),), micro_batch=8)
    return Plan("manual", [a, b])
