"""A one-role placement and a stand-in for torchrun, for the launcher's tests."""

from __future__ import annotations

import sys

from hulk.wire.placement import NodePlacement, Role


def placement(command: tuple[str, ...], job: str = "a") -> NodePlacement:
    role = Role(plan_id="p1", job=job, phase=0, stage=0, num_stages=1, layer_lo=0, layer_hi=4,
                replica=0, num_replicas=1, rank=0, world_size=1, rendezvous_address="127.0.0.1",
                rendezvous_port=29500, micro_batch=1, command=command)
    return NodePlacement(fleet="lab", node="n1", plan_id="p1", roles=(role,))


def direct(role: Role) -> list[str]:
    """Stands in for torchrun: runs the role's argv with this interpreter as ``python``."""
    argv = list(role.command)
    return [sys.executable, *argv[1:]] if argv[0] == "python" else argv
