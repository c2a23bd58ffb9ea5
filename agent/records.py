"""Plain values the agent's parts pass to each other; the reporter converts them to protobuf."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field


class ProbeKind(enum.IntEnum):
    """Mirrors hulk.v1.ProbeKind (same numbers)."""

    ICMP = 1
    TCP = 2


@dataclass(frozen=True)
class ProbeSample:
    """One probe packet (or one TCP connect). A lost packet is a sample with lost=True."""

    peer_id: str
    sent_at_ms: int
    kind: ProbeKind
    payload_bytes: int
    lost: bool
    rtt_ms: float
    timeout_ms: float


@dataclass(frozen=True)
class Peer:
    node_id: str
    address: str
    probe_port: int = 0


@dataclass(frozen=True)
class ProbeSettings:
    """How to probe; zero fields mean "not set" (the planner leaves them to the agent)."""

    interval_s: float = 0.0
    packets_per_round: int = 0
    timeout_s: float = 0.0
    payload_bytes: int = 0
    max_concurrency: int = 0
    max_batch: int = 0


@dataclass(frozen=True)
class Registration:
    """What the planner answered to Register."""

    peers: tuple[Peer, ...]
    settings: ProbeSettings
    fleet: str
    server_time_ms: int


@dataclass(frozen=True)
class ReportResult:
    accepted: int
    rejected: int
    duplicate: bool


@dataclass(frozen=True)
class HeartbeatResult:
    server_time_ms: int
    reregister: bool
    peers_changed: bool


class LaunchState(enum.IntEnum):
    """Mirrors hulk.v1.LaunchState (same numbers)."""

    UNSPECIFIED = 0
    IDLE = 1
    STARTING = 2
    RUNNING = 3
    EXITED = 4
    FAILED = 5


@dataclass(frozen=True)
class LaunchStatus:
    """The state of the training process this node launched; sent in every Heartbeat."""

    state: LaunchState = LaunchState.IDLE
    plan_id: str = ""
    job: str = ""
    exit_code: int = 0
    detail: str = ""
    changed_at_ms: int = 0


@dataclass(frozen=True)
class GpuInfo:
    name: str
    uuid: str
    compute_capability: float
    memory_bytes: int


@dataclass(frozen=True)
class Inventory:
    gpus: tuple[GpuInfo, ...] = ()
    driver_version: str = ""
    # Why the list is empty when it is; "" when GPUs were read.
    unavailable_reason: str = ""

    @property
    def count(self) -> int:
        return len(self.gpus)


@dataclass(frozen=True)
class NodeIdentity:
    """What Register tells the planner about this node."""

    node_id: str
    hostname: str
    city: str
    coordinates: tuple[float, float] | None
    agent_version: str
    address: str
    probe_port: int
    inventory: Inventory = field(default_factory=Inventory)
