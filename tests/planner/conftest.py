"""Small hand-built networks for the planner's unit tests."""

from __future__ import annotations

import numpy as np
import pytest

from planner.core.fleet import Network, Node


def make_net(specs: list[tuple[str, int, float]], rtt_ms: list[list[float]]) -> Network:
    """Nodes from (gpu_name, gpus, memory_gb) and a full RTT matrix; bandwidth from the TCP model."""
    nodes = [Node(id=str(k), city=None, gpus=g, gpu_name=name, memory_gb=mem)
             for k, (name, g, mem) in enumerate(specs)]
    return Network.from_matrix(nodes, np.array(rtt_ms, dtype=float))


@pytest.fixture
def net_factory():
    return make_net
