"""The records of the gRPC contract (protos/hulk/v1/hulk.proto), one definition for both sides.

Each record is immutable and converts itself: ``record.to_proto()`` builds the hulk.v1 message,
``Record.from_proto(message)`` reads one. Conversions are faithful: proto3 zero values stay zero
(a ``ProbeSettings`` field of 0 means "not set") and nothing is checked here beyond what the
types need; the planner's ingest validates what it stores.

Requests and answers, by RPC:

    Register    RegisterRequest   -> RegisterAnswer
    Report      ReportRequest     -> ReportResult
    Heartbeat   HeartbeatRequest  -> HeartbeatResult
"""

from __future__ import annotations

import enum
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from hulk.errors import InputError
from hulk.v1 import hulk_pb2
from hulk.wire.histogram import histogram_of
from hulk.wire.progress import StepProgress
from hulk.wire.throughput import ThroughputResult, ThroughputSlot


class ProbeKind(enum.IntEnum):
    """How a sample was measured (hulk.v1.ProbeKind, same numbers)."""

    ICMP = 1
    TCP = 2


class ProbeSample(NamedTuple):
    """One probe packet (or one TCP connect); a lost packet is a sample with lost=True.

    A named tuple rather than a dataclass: the planner reads hundreds of thousands a second and
    the agent's spool builds one per row, so construction cost matters (it is immutable either
    way)."""

    peer_id: str
    sent_at_ms: int            # unix epoch milliseconds
    kind: int                  # a ProbeKind; read from the wire as the plain number sent
    payload_bytes: int
    lost: bool
    rtt_ms: float              # meaningful only when not lost
    timeout_ms: float          # the probe's timeout; an RTT above it is rejected

    def to_proto(self) -> hulk_pb2.Sample:
        return hulk_pb2.Sample(peer_id=self.peer_id, sent_at_ms=self.sent_at_ms,
                               kind=int(self.kind), payload_bytes=self.payload_bytes,
                               lost=self.lost, rtt_ms=self.rtt_ms, timeout_ms=self.timeout_ms)

    @classmethod
    def from_proto(cls, msg: hulk_pb2.Sample) -> ProbeSample:
        return cls(msg.peer_id, msg.sent_at_ms, msg.kind, msg.payload_bytes, msg.lost, msg.rtt_ms,
                   msg.timeout_ms)


class PeerSummary(NamedTuple):
    """One round of probes to one peer, folded by the agent (hulk.v1.PeerSummary).

    RTT figures cover the received packets (count - lost), 0 when none came back. ``buckets``
    is the RTT histogram in the fixed buckets of ``hulk.wire.histogram``: (bucket, count) pairs
    of the non-empty buckets, in increasing bucket order. Nothing is checked here; the planner's
    admission (``planner.service.admission.check_summary``) does."""

    peer_id: str
    round_start_ms: int        # unix epoch milliseconds: the round's first packet
    kind: int                  # a ProbeKind
    payload_bytes: int
    timeout_ms: float
    count: int                 # packets sent
    lost: int
    rtt_sum_ms: float
    rtt_sum_sq_ms2: float
    rtt_min_ms: float
    rtt_max_ms: float
    buckets: tuple[tuple[int, int], ...]

    @property
    def received(self) -> int:
        return self.count - self.lost

    @classmethod
    def of_samples(cls, samples: Sequence[ProbeSample]) -> PeerSummary:
        """The summary of one round's samples (same peer and kind; at least one sample)."""
        first = samples[0]
        rtts = [s.rtt_ms for s in samples if not s.lost]
        return cls(first.peer_id, min(s.sent_at_ms for s in samples), int(first.kind),
                   first.payload_bytes, first.timeout_ms, len(samples),
                   len(samples) - len(rtts), math.fsum(rtts), math.fsum(r * r for r in rtts),
                   min(rtts, default=0.0), max(rtts, default=0.0),
                   tuple(sorted(histogram_of(rtts).items())))

    def to_proto(self) -> hulk_pb2.PeerSummary:
        return hulk_pb2.PeerSummary(
            peer_id=self.peer_id, round_start_ms=self.round_start_ms, kind=int(self.kind),
            payload_bytes=self.payload_bytes, timeout_ms=self.timeout_ms, count=self.count,
            lost=self.lost, rtt_sum_ms=self.rtt_sum_ms, rtt_sum_sq_ms2=self.rtt_sum_sq_ms2,
            rtt_min_ms=self.rtt_min_ms, rtt_max_ms=self.rtt_max_ms,
            histogram_buckets=[k for k, _ in self.buckets],
            histogram_counts=[c for _, c in self.buckets])

    @classmethod
    def from_proto(cls, msg: hulk_pb2.PeerSummary, where: str = "summary") -> PeerSummary:
        """Faithful, except that bucket and count lists of different lengths are an
        InputError here (naming ``where``): no pairing of them is what the sender meant."""
        ks, cs = msg.histogram_buckets, msg.histogram_counts
        if len(ks) != len(cs):
            raise InputError(f"expected as many histogram counts as buckets, got {len(cs)} and "
                             f"{len(ks)}", field=f"{where}.histogram_counts")
        return cls(msg.peer_id, msg.round_start_ms, msg.kind, msg.payload_bytes, msg.timeout_ms,
                   msg.count, msg.lost, msg.rtt_sum_ms, msg.rtt_sum_sq_ms2, msg.rtt_min_ms,
                   msg.rtt_max_ms, tuple(zip(ks, cs)))


@dataclass(frozen=True)
class ProbeSettings:
    """How agents probe (``RegisterAnswer.settings``). The defaults are what the planner pushes,
    and what an agent uses for a setting that neither its operator nor the planner gave."""

    interval_s: float = 60.0       # one round per peer per interval
    packets_per_round: int = 3
    timeout_s: float = 2.0         # per packet
    payload_bytes: int = 56        # 56 + the 8-byte ICMP header: the 64-byte message `ping` sends
    max_concurrency: int = 64      # probe rounds in flight
    max_batch: int = 2000          # records (samples or summaries) per Report
    report_interval_s: float = 0.0  # Report at most this often; 0: the agent's own (5 s)

    def to_proto(self) -> hulk_pb2.ProbeSettings:
        return hulk_pb2.ProbeSettings(
            interval_s=self.interval_s, packets_per_round=self.packets_per_round,
            timeout_s=self.timeout_s, payload_bytes=self.payload_bytes,
            max_concurrency=self.max_concurrency, max_batch=self.max_batch,
            report_interval_s=self.report_interval_s)

    @classmethod
    def from_proto(cls, msg: hulk_pb2.ProbeSettings) -> ProbeSettings:
        return cls(interval_s=msg.interval_s, packets_per_round=msg.packets_per_round,
                   timeout_s=msg.timeout_s, payload_bytes=msg.payload_bytes,
                   max_concurrency=msg.max_concurrency, max_batch=msg.max_batch,
                   report_interval_s=msg.report_interval_s)


# ------------------------------------------------------------------------------ registration

@dataclass(frozen=True)
class GpuInfo:
    name: str                      # e.g. "NVIDIA A100-SXM4-40GB"
    uuid: str = ""
    compute_capability: float = 0.0
    memory_bytes: int = 0

    def to_proto(self) -> hulk_pb2.Gpu:
        return hulk_pb2.Gpu(name=self.name, uuid=self.uuid,
                            compute_capability=self.compute_capability,
                            memory_bytes=self.memory_bytes)

    @classmethod
    def from_proto(cls, msg: hulk_pb2.Gpu) -> GpuInfo:
        return cls(msg.name, msg.uuid, msg.compute_capability, msg.memory_bytes)


@dataclass(frozen=True)
class Inventory:
    """A node's GPUs (hulk.v1.GpuInventory)."""

    gpus: tuple[GpuInfo, ...] = ()
    driver_version: str = ""
    unavailable_reason: str = ""   # why the list is empty when it is; "" when GPUs were read
    declared: bool = False         # GPUs from the agent's declared_gpus setting, not NVML

    @property
    def count(self) -> int:
        return len(self.gpus)

    def to_proto(self) -> hulk_pb2.GpuInventory:
        return hulk_pb2.GpuInventory(gpus=[g.to_proto() for g in self.gpus],
                                     driver_version=self.driver_version,
                                     unavailable_reason=self.unavailable_reason,
                                     declared=self.declared)

    @classmethod
    def from_proto(cls, msg: hulk_pb2.GpuInventory) -> Inventory:
        return cls(gpus=tuple(GpuInfo.from_proto(g) for g in msg.gpus),
                   driver_version=msg.driver_version, unavailable_reason=msg.unavailable_reason,
                   declared=msg.declared)


SITE_MAX_CHARS = 100               # a site name's bound, checked by the agent and the planner


@dataclass(frozen=True)
class NodeLocation:
    """Where a node is: a gazetteer city (may be empty), (latitude, longitude) when known, and
    the site it belongs to (a data centre, cloud region or city; "" for its city)."""

    city: str = ""
    coordinates: tuple[float, float] | None = None
    site: str = ""

    def to_proto(self) -> hulk_pb2.Location:
        msg = hulk_pb2.Location(city=self.city, site=self.site)
        if self.coordinates is not None:
            msg.has_coordinates = True
            msg.latitude, msg.longitude = self.coordinates
        return msg

    @classmethod
    def from_proto(cls, msg: hulk_pb2.Location) -> NodeLocation:
        return cls(msg.city, (msg.latitude, msg.longitude) if msg.has_coordinates else None,
                   msg.site)


@dataclass(frozen=True)
class RegisterRequest:
    """What an agent tells the planner about its node (Register's request)."""

    node_id: str
    hostname: str = ""
    location: NodeLocation = field(default_factory=NodeLocation)
    agent_version: str = ""
    inventory: Inventory = field(default_factory=Inventory)
    address: str = ""              # the address peers probe
    probe_port: int = 0            # TCP port for peers' connect probes (0: none)
    throughput_port: int = 0       # TCP port for throughput tests (0: takes none)
    # The argv prefixes its launcher runs (its allowed_commands); None: an older agent that
    # does not say.
    allowed_commands: tuple[tuple[str, ...], ...] | None = None

    def to_proto(self) -> hulk_pb2.RegisterRequest:
        known = self.allowed_commands is not None
        return hulk_pb2.RegisterRequest(
            node_id=self.node_id, hostname=self.hostname, location=self.location.to_proto(),
            agent_version=self.agent_version, inventory=self.inventory.to_proto(),
            address=self.address, probe_port=self.probe_port,
            throughput_port=self.throughput_port,
            allowed_commands=[hulk_pb2.CommandPrefix(argv=list(p))
                              for p in (self.allowed_commands or ())],
            allowed_commands_known=known)

    @classmethod
    def from_proto(cls, msg: hulk_pb2.RegisterRequest) -> RegisterRequest:
        allowed = (tuple(tuple(p.argv) for p in msg.allowed_commands)
                   if msg.allowed_commands_known else None)
        return cls(node_id=msg.node_id, hostname=msg.hostname,
                   location=NodeLocation.from_proto(msg.location),
                   agent_version=msg.agent_version,
                   inventory=Inventory.from_proto(msg.inventory), address=msg.address,
                   probe_port=msg.probe_port, throughput_port=msg.throughput_port,
                   allowed_commands=allowed)


@dataclass(frozen=True)
class Peer:
    """A node to probe."""

    node_id: str
    address: str = ""
    probe_port: int = 0

    def to_proto(self) -> hulk_pb2.Peer:
        return hulk_pb2.Peer(node_id=self.node_id, address=self.address,
                             probe_port=self.probe_port)

    @classmethod
    def from_proto(cls, msg: hulk_pb2.Peer) -> Peer:
        return cls(msg.node_id, msg.address, msg.probe_port)


@dataclass(frozen=True)
class RegisterAnswer:
    """The planner's answer to Register: whom to probe, how, and the fleet's name."""

    peers: tuple[Peer, ...]
    settings: ProbeSettings
    fleet: str                     # used in the MQTT topics
    server_time_ms: int

    def to_proto(self) -> hulk_pb2.RegisterResponse:
        return hulk_pb2.RegisterResponse(peers=[p.to_proto() for p in self.peers],
                                         settings=self.settings.to_proto(), fleet=self.fleet,
                                         server_time_ms=self.server_time_ms)

    @classmethod
    def from_proto(cls, msg: hulk_pb2.RegisterResponse) -> RegisterAnswer:
        return cls(peers=tuple(Peer.from_proto(p) for p in msg.peers),
                   settings=ProbeSettings.from_proto(msg.settings), fleet=msg.fleet,
                   server_time_ms=msg.server_time_ms)


# ----------------------------------------------------------------------------------- reports

@dataclass(frozen=True)
class ReportRequest:
    """A batch of raw samples, per-round summaries and/or throughput results (Report's
    request); retries reuse the batch id. Agents before summaries send samples only; every kind
    may share a batch."""

    node_id: str
    batch_id: str
    samples: tuple[ProbeSample, ...] = ()
    spool_dropped: int = 0         # records the agent's spool dropped past its bound, cumulative
    summaries: tuple[PeerSummary, ...] = ()
    throughput: tuple[ThroughputResult, ...] = ()

    def to_proto(self) -> hulk_pb2.ReportRequest:
        return hulk_pb2.ReportRequest(node_id=self.node_id, batch_id=self.batch_id,
                                      samples=[s.to_proto() for s in self.samples],
                                      spool_dropped=self.spool_dropped,
                                      summaries=[s.to_proto() for s in self.summaries],
                                      throughput=[r.to_proto() for r in self.throughput])

    @classmethod
    def from_proto(cls, msg: hulk_pb2.ReportRequest) -> ReportRequest:
        """InputError (naming the record) for a summary's mismatched histogram lists or a
        throughput result out of bounds."""
        make = ProbeSample
        summaries = [PeerSummary.from_proto(s, f"summaries[{i}]")
                     for i, s in enumerate(msg.summaries)]
        throughput = [ThroughputResult.from_proto(r, f"throughput[{i}]")
                      for i, r in enumerate(msg.throughput)]
        return cls(node_id=msg.node_id, batch_id=msg.batch_id, spool_dropped=msg.spool_dropped,
                   samples=tuple(make(s.peer_id, s.sent_at_ms, s.kind, s.payload_bytes, s.lost,
                                      s.rtt_ms, s.timeout_ms) for s in msg.samples),
                   summaries=tuple(summaries), throughput=tuple(throughput))


@dataclass(frozen=True)
class ReportResult:
    """The planner's answer to Report."""

    accepted: int
    rejected: int                  # e.g. below the speed-of-light bound between the two cities
    duplicate: bool                # the batch id was stored before; nothing stored again

    def to_proto(self) -> hulk_pb2.ReportResponse:
        return hulk_pb2.ReportResponse(accepted=self.accepted, rejected=self.rejected,
                                       duplicate=self.duplicate)

    @classmethod
    def from_proto(cls, msg: hulk_pb2.ReportResponse) -> ReportResult:
        return cls(msg.accepted, msg.rejected, msg.duplicate)


# -------------------------------------------------------------------------------- heartbeats

class LaunchState(enum.IntEnum):
    """The state of a launched training process (hulk.v1.LaunchState, same numbers)."""

    UNSPECIFIED = 0
    IDLE = 1
    STARTING = 2
    RUNNING = 3
    EXITED = 4
    FAILED = 5


class ExitCause(enum.IntEnum):
    """Why an EXITED process ended, where that was not its own doing (hulk.v1.ExitCause, same
    numbers). A value this side does not know reads as UNSPECIFIED: the process's own exit, what
    a planner that predates the field makes of the report too."""

    UNSPECIFIED = 0
    FENCED = 1          # its wrapper stopped it: the node's lease lapsed (docs/JOBS.md, Fencing)

    @classmethod
    def of(cls, value: int) -> ExitCause:
        try:
            return cls(value)
        except ValueError:
            return cls.UNSPECIFIED


@dataclass(frozen=True)
class LaunchStatus:
    """The training process this node launched; sent in every Heartbeat."""

    state: LaunchState = LaunchState.IDLE
    plan_id: str = ""
    job: str = ""
    exit_code: int = 0
    detail: str = ""
    changed_at_ms: int = 0
    progress: StepProgress | None = None   # the rank's step progress, when its job reports it
    exit_cause: ExitCause = ExitCause.UNSPECIFIED   # EXITED only: FENCED when its lease lapsed

    def to_proto(self) -> hulk_pb2.LaunchStatus:
        msg = hulk_pb2.LaunchStatus(plan_id=self.plan_id, job=self.job, state=int(self.state),
                                    exit_code=self.exit_code, detail=self.detail,
                                    changed_at_ms=self.changed_at_ms,
                                    exit_cause=int(self.exit_cause))
        if self.progress is not None:
            msg.progress.CopyFrom(self.progress.to_proto())
        return msg

    @classmethod
    def from_proto(cls, msg: hulk_pb2.LaunchStatus) -> LaunchStatus:
        """InputError for a state this side does not know (an agent newer than the planner),
        or for progress figures that cannot be true (NaN, negative, past their bounds). An exit
        cause it does not know is UNSPECIFIED (the report is never refused for it), and so is
        one sent with a state other than EXITED."""
        try:
            state = LaunchState(msg.state)
        except ValueError:
            raise InputError(f"unknown LaunchState value {msg.state}",
                             field="launch.state") from None
        progress = (StepProgress.from_proto(msg.progress, "launch.progress")
                    if msg.HasField("progress") else None)
        cause = (ExitCause.of(msg.exit_cause) if state == LaunchState.EXITED
                 else ExitCause.UNSPECIFIED)
        return cls(state=state, plan_id=msg.plan_id, job=msg.job, exit_code=msg.exit_code,
                   detail=msg.detail, changed_at_ms=msg.changed_at_ms, progress=progress,
                   exit_cause=cause)


@dataclass(frozen=True)
class HeartbeatRequest:
    """Liveness, spool counters and the launch status (Heartbeat's request)."""

    node_id: str
    time_ms: int = 0
    spool_depth: int = 0
    spool_dropped: int = 0
    launch: LaunchStatus | None = None

    def to_proto(self) -> hulk_pb2.HeartbeatRequest:
        msg = hulk_pb2.HeartbeatRequest(node_id=self.node_id, time_ms=self.time_ms,
                                        spool_depth=self.spool_depth,
                                        spool_dropped=self.spool_dropped)
        if self.launch is not None:
            msg.launch.CopyFrom(self.launch.to_proto())
        return msg

    @classmethod
    def from_proto(cls, msg: hulk_pb2.HeartbeatRequest) -> HeartbeatRequest:
        return cls(node_id=msg.node_id, time_ms=msg.time_ms, spool_depth=msg.spool_depth,
                   spool_dropped=msg.spool_dropped,
                   launch=LaunchStatus.from_proto(msg.launch) if msg.HasField("launch") else None)


@dataclass(frozen=True)
class HeartbeatResult:
    """The planner's answer to Heartbeat."""

    server_time_ms: int
    reregister: bool = False       # the planner does not know this node: Register again
    peers_changed: bool = False    # Register again to fetch the new peer list or settings
    throughput_slots: tuple[ThroughputSlot, ...] = ()   # tests this node takes part in, soon
    lease_s: float = 0.0           # the node lease (hulk/lease.py); 0: not sent

    def to_proto(self) -> hulk_pb2.HeartbeatResponse:
        return hulk_pb2.HeartbeatResponse(
            server_time_ms=self.server_time_ms, reregister=self.reregister,
            peers_changed=self.peers_changed,
            throughput_slots=[s.to_proto() for s in self.throughput_slots], lease_s=self.lease_s)

    @classmethod
    def from_proto(cls, msg: hulk_pb2.HeartbeatResponse) -> HeartbeatResult:
        """Slots are read as sent, unchecked: one malformed slot must not cost the heartbeat
        (a reregister, a peer change); the agent checks each (``ThroughputSlot.check``)."""
        return cls(msg.server_time_ms, msg.reregister, msg.peers_changed,
                   tuple(ThroughputSlot.from_proto(s, check=False)
                         for s in msg.throughput_slots), msg.lease_s)
