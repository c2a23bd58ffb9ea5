from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ProbeKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PROBE_KIND_UNSPECIFIED: _ClassVar[ProbeKind]
    PROBE_KIND_ICMP: _ClassVar[ProbeKind]
    PROBE_KIND_TCP: _ClassVar[ProbeKind]

class LaunchState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    LAUNCH_STATE_UNSPECIFIED: _ClassVar[LaunchState]
    LAUNCH_STATE_IDLE: _ClassVar[LaunchState]
    LAUNCH_STATE_STARTING: _ClassVar[LaunchState]
    LAUNCH_STATE_RUNNING: _ClassVar[LaunchState]
    LAUNCH_STATE_EXITED: _ClassVar[LaunchState]
    LAUNCH_STATE_FAILED: _ClassVar[LaunchState]

class ExitCause(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    EXIT_CAUSE_UNSPECIFIED: _ClassVar[ExitCause]
    EXIT_CAUSE_FENCED: _ClassVar[ExitCause]
PROBE_KIND_UNSPECIFIED: ProbeKind
PROBE_KIND_ICMP: ProbeKind
PROBE_KIND_TCP: ProbeKind
LAUNCH_STATE_UNSPECIFIED: LaunchState
LAUNCH_STATE_IDLE: LaunchState
LAUNCH_STATE_STARTING: LaunchState
LAUNCH_STATE_RUNNING: LaunchState
LAUNCH_STATE_EXITED: LaunchState
LAUNCH_STATE_FAILED: LaunchState
EXIT_CAUSE_UNSPECIFIED: ExitCause
EXIT_CAUSE_FENCED: ExitCause

class Gpu(_message.Message):
    __slots__ = ("name", "uuid", "compute_capability", "memory_bytes")
    NAME_FIELD_NUMBER: _ClassVar[int]
    UUID_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_CAPABILITY_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    name: str
    uuid: str
    compute_capability: float
    memory_bytes: int
    def __init__(self, name: _Optional[str] = ..., uuid: _Optional[str] = ..., compute_capability: _Optional[float] = ..., memory_bytes: _Optional[int] = ...) -> None: ...

class GpuInventory(_message.Message):
    __slots__ = ("gpus", "driver_version", "unavailable_reason", "declared")
    GPUS_FIELD_NUMBER: _ClassVar[int]
    DRIVER_VERSION_FIELD_NUMBER: _ClassVar[int]
    UNAVAILABLE_REASON_FIELD_NUMBER: _ClassVar[int]
    DECLARED_FIELD_NUMBER: _ClassVar[int]
    gpus: _containers.RepeatedCompositeFieldContainer[Gpu]
    driver_version: str
    unavailable_reason: str
    declared: bool
    def __init__(self, gpus: _Optional[_Iterable[_Union[Gpu, _Mapping]]] = ..., driver_version: _Optional[str] = ..., unavailable_reason: _Optional[str] = ..., declared: _Optional[bool] = ...) -> None: ...

class Location(_message.Message):
    __slots__ = ("city", "has_coordinates", "latitude", "longitude", "site")
    CITY_FIELD_NUMBER: _ClassVar[int]
    HAS_COORDINATES_FIELD_NUMBER: _ClassVar[int]
    LATITUDE_FIELD_NUMBER: _ClassVar[int]
    LONGITUDE_FIELD_NUMBER: _ClassVar[int]
    SITE_FIELD_NUMBER: _ClassVar[int]
    city: str
    has_coordinates: bool
    latitude: float
    longitude: float
    site: str
    def __init__(self, city: _Optional[str] = ..., has_coordinates: _Optional[bool] = ..., latitude: _Optional[float] = ..., longitude: _Optional[float] = ..., site: _Optional[str] = ...) -> None: ...

class RegisterRequest(_message.Message):
    __slots__ = ("node_id", "hostname", "location", "agent_version", "inventory", "address", "probe_port", "throughput_port", "allowed_commands", "allowed_commands_known")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    HOSTNAME_FIELD_NUMBER: _ClassVar[int]
    LOCATION_FIELD_NUMBER: _ClassVar[int]
    AGENT_VERSION_FIELD_NUMBER: _ClassVar[int]
    INVENTORY_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    PROBE_PORT_FIELD_NUMBER: _ClassVar[int]
    THROUGHPUT_PORT_FIELD_NUMBER: _ClassVar[int]
    ALLOWED_COMMANDS_FIELD_NUMBER: _ClassVar[int]
    ALLOWED_COMMANDS_KNOWN_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    hostname: str
    location: Location
    agent_version: str
    inventory: GpuInventory
    address: str
    probe_port: int
    throughput_port: int
    allowed_commands: _containers.RepeatedCompositeFieldContainer[CommandPrefix]
    allowed_commands_known: bool
    def __init__(self, node_id: _Optional[str] = ..., hostname: _Optional[str] = ..., location: _Optional[_Union[Location, _Mapping]] = ..., agent_version: _Optional[str] = ..., inventory: _Optional[_Union[GpuInventory, _Mapping]] = ..., address: _Optional[str] = ..., probe_port: _Optional[int] = ..., throughput_port: _Optional[int] = ..., allowed_commands: _Optional[_Iterable[_Union[CommandPrefix, _Mapping]]] = ..., allowed_commands_known: _Optional[bool] = ...) -> None: ...

class CommandPrefix(_message.Message):
    __slots__ = ("argv",)
    ARGV_FIELD_NUMBER: _ClassVar[int]
    argv: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, argv: _Optional[_Iterable[str]] = ...) -> None: ...

class Peer(_message.Message):
    __slots__ = ("node_id", "address", "probe_port")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    PROBE_PORT_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    address: str
    probe_port: int
    def __init__(self, node_id: _Optional[str] = ..., address: _Optional[str] = ..., probe_port: _Optional[int] = ...) -> None: ...

class ProbeSettings(_message.Message):
    __slots__ = ("interval_s", "packets_per_round", "timeout_s", "payload_bytes", "max_concurrency", "max_batch", "report_interval_s")
    INTERVAL_S_FIELD_NUMBER: _ClassVar[int]
    PACKETS_PER_ROUND_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_CONCURRENCY_FIELD_NUMBER: _ClassVar[int]
    MAX_BATCH_FIELD_NUMBER: _ClassVar[int]
    REPORT_INTERVAL_S_FIELD_NUMBER: _ClassVar[int]
    interval_s: float
    packets_per_round: int
    timeout_s: float
    payload_bytes: int
    max_concurrency: int
    max_batch: int
    report_interval_s: float
    def __init__(self, interval_s: _Optional[float] = ..., packets_per_round: _Optional[int] = ..., timeout_s: _Optional[float] = ..., payload_bytes: _Optional[int] = ..., max_concurrency: _Optional[int] = ..., max_batch: _Optional[int] = ..., report_interval_s: _Optional[float] = ...) -> None: ...

class RegisterResponse(_message.Message):
    __slots__ = ("peers", "settings", "fleet", "server_time_ms")
    PEERS_FIELD_NUMBER: _ClassVar[int]
    SETTINGS_FIELD_NUMBER: _ClassVar[int]
    FLEET_FIELD_NUMBER: _ClassVar[int]
    SERVER_TIME_MS_FIELD_NUMBER: _ClassVar[int]
    peers: _containers.RepeatedCompositeFieldContainer[Peer]
    settings: ProbeSettings
    fleet: str
    server_time_ms: int
    def __init__(self, peers: _Optional[_Iterable[_Union[Peer, _Mapping]]] = ..., settings: _Optional[_Union[ProbeSettings, _Mapping]] = ..., fleet: _Optional[str] = ..., server_time_ms: _Optional[int] = ...) -> None: ...

class Sample(_message.Message):
    __slots__ = ("peer_id", "sent_at_ms", "kind", "payload_bytes", "lost", "rtt_ms", "timeout_ms")
    PEER_ID_FIELD_NUMBER: _ClassVar[int]
    SENT_AT_MS_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_BYTES_FIELD_NUMBER: _ClassVar[int]
    LOST_FIELD_NUMBER: _ClassVar[int]
    RTT_MS_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    peer_id: str
    sent_at_ms: int
    kind: ProbeKind
    payload_bytes: int
    lost: bool
    rtt_ms: float
    timeout_ms: float
    def __init__(self, peer_id: _Optional[str] = ..., sent_at_ms: _Optional[int] = ..., kind: _Optional[_Union[ProbeKind, str]] = ..., payload_bytes: _Optional[int] = ..., lost: _Optional[bool] = ..., rtt_ms: _Optional[float] = ..., timeout_ms: _Optional[float] = ...) -> None: ...

class PeerSummary(_message.Message):
    __slots__ = ("peer_id", "round_start_ms", "kind", "payload_bytes", "timeout_ms", "count", "lost", "rtt_sum_ms", "rtt_sum_sq_ms2", "rtt_min_ms", "rtt_max_ms", "histogram_buckets", "histogram_counts")
    PEER_ID_FIELD_NUMBER: _ClassVar[int]
    ROUND_START_MS_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_BYTES_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    LOST_FIELD_NUMBER: _ClassVar[int]
    RTT_SUM_MS_FIELD_NUMBER: _ClassVar[int]
    RTT_SUM_SQ_MS2_FIELD_NUMBER: _ClassVar[int]
    RTT_MIN_MS_FIELD_NUMBER: _ClassVar[int]
    RTT_MAX_MS_FIELD_NUMBER: _ClassVar[int]
    HISTOGRAM_BUCKETS_FIELD_NUMBER: _ClassVar[int]
    HISTOGRAM_COUNTS_FIELD_NUMBER: _ClassVar[int]
    peer_id: str
    round_start_ms: int
    kind: ProbeKind
    payload_bytes: int
    timeout_ms: float
    count: int
    lost: int
    rtt_sum_ms: float
    rtt_sum_sq_ms2: float
    rtt_min_ms: float
    rtt_max_ms: float
    histogram_buckets: _containers.RepeatedScalarFieldContainer[int]
    histogram_counts: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, peer_id: _Optional[str] = ..., round_start_ms: _Optional[int] = ..., kind: _Optional[_Union[ProbeKind, str]] = ..., payload_bytes: _Optional[int] = ..., timeout_ms: _Optional[float] = ..., count: _Optional[int] = ..., lost: _Optional[int] = ..., rtt_sum_ms: _Optional[float] = ..., rtt_sum_sq_ms2: _Optional[float] = ..., rtt_min_ms: _Optional[float] = ..., rtt_max_ms: _Optional[float] = ..., histogram_buckets: _Optional[_Iterable[int]] = ..., histogram_counts: _Optional[_Iterable[int]] = ...) -> None: ...

class ReportRequest(_message.Message):
    __slots__ = ("node_id", "batch_id", "samples", "spool_dropped", "summaries", "throughput")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    BATCH_ID_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    SPOOL_DROPPED_FIELD_NUMBER: _ClassVar[int]
    SUMMARIES_FIELD_NUMBER: _ClassVar[int]
    THROUGHPUT_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    batch_id: str
    samples: _containers.RepeatedCompositeFieldContainer[Sample]
    spool_dropped: int
    summaries: _containers.RepeatedCompositeFieldContainer[PeerSummary]
    throughput: _containers.RepeatedCompositeFieldContainer[ThroughputResult]
    def __init__(self, node_id: _Optional[str] = ..., batch_id: _Optional[str] = ..., samples: _Optional[_Iterable[_Union[Sample, _Mapping]]] = ..., spool_dropped: _Optional[int] = ..., summaries: _Optional[_Iterable[_Union[PeerSummary, _Mapping]]] = ..., throughput: _Optional[_Iterable[_Union[ThroughputResult, _Mapping]]] = ...) -> None: ...

class ReportResponse(_message.Message):
    __slots__ = ("accepted", "rejected", "duplicate")
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    REJECTED_FIELD_NUMBER: _ClassVar[int]
    DUPLICATE_FIELD_NUMBER: _ClassVar[int]
    accepted: int
    rejected: int
    duplicate: bool
    def __init__(self, accepted: _Optional[int] = ..., rejected: _Optional[int] = ..., duplicate: _Optional[bool] = ...) -> None: ...

class LaunchStatus(_message.Message):
    __slots__ = ("plan_id", "job", "state", "exit_code", "detail", "changed_at_ms", "progress", "exit_cause")
    PLAN_ID_FIELD_NUMBER: _ClassVar[int]
    JOB_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    CHANGED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    EXIT_CAUSE_FIELD_NUMBER: _ClassVar[int]
    plan_id: str
    job: str
    state: LaunchState
    exit_code: int
    detail: str
    changed_at_ms: int
    progress: StepProgress
    exit_cause: ExitCause
    def __init__(self, plan_id: _Optional[str] = ..., job: _Optional[str] = ..., state: _Optional[_Union[LaunchState, str]] = ..., exit_code: _Optional[int] = ..., detail: _Optional[str] = ..., changed_at_ms: _Optional[int] = ..., progress: _Optional[_Union[StepProgress, _Mapping]] = ..., exit_cause: _Optional[_Union[ExitCause, str]] = ...) -> None: ...

class StepProgress(_message.Message):
    __slots__ = ("steps", "total_steps", "iteration_s", "iteration_p90_s", "compute_s", "communication_s", "samples", "updated_ms", "wall_iteration_s", "wall_steps")
    STEPS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_STEPS_FIELD_NUMBER: _ClassVar[int]
    ITERATION_S_FIELD_NUMBER: _ClassVar[int]
    ITERATION_P90_S_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_S_FIELD_NUMBER: _ClassVar[int]
    COMMUNICATION_S_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    UPDATED_MS_FIELD_NUMBER: _ClassVar[int]
    WALL_ITERATION_S_FIELD_NUMBER: _ClassVar[int]
    WALL_STEPS_FIELD_NUMBER: _ClassVar[int]
    steps: int
    total_steps: int
    iteration_s: float
    iteration_p90_s: float
    compute_s: float
    communication_s: float
    samples: int
    updated_ms: int
    wall_iteration_s: float
    wall_steps: int
    def __init__(self, steps: _Optional[int] = ..., total_steps: _Optional[int] = ..., iteration_s: _Optional[float] = ..., iteration_p90_s: _Optional[float] = ..., compute_s: _Optional[float] = ..., communication_s: _Optional[float] = ..., samples: _Optional[int] = ..., updated_ms: _Optional[int] = ..., wall_iteration_s: _Optional[float] = ..., wall_steps: _Optional[int] = ...) -> None: ...

class HeartbeatRequest(_message.Message):
    __slots__ = ("node_id", "time_ms", "spool_depth", "spool_dropped", "launch")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    TIME_MS_FIELD_NUMBER: _ClassVar[int]
    SPOOL_DEPTH_FIELD_NUMBER: _ClassVar[int]
    SPOOL_DROPPED_FIELD_NUMBER: _ClassVar[int]
    LAUNCH_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    time_ms: int
    spool_depth: int
    spool_dropped: int
    launch: LaunchStatus
    def __init__(self, node_id: _Optional[str] = ..., time_ms: _Optional[int] = ..., spool_depth: _Optional[int] = ..., spool_dropped: _Optional[int] = ..., launch: _Optional[_Union[LaunchStatus, _Mapping]] = ...) -> None: ...

class HeartbeatResponse(_message.Message):
    __slots__ = ("server_time_ms", "reregister", "peers_changed", "throughput_slots", "lease_s")
    SERVER_TIME_MS_FIELD_NUMBER: _ClassVar[int]
    REREGISTER_FIELD_NUMBER: _ClassVar[int]
    PEERS_CHANGED_FIELD_NUMBER: _ClassVar[int]
    THROUGHPUT_SLOTS_FIELD_NUMBER: _ClassVar[int]
    LEASE_S_FIELD_NUMBER: _ClassVar[int]
    server_time_ms: int
    reregister: bool
    peers_changed: bool
    throughput_slots: _containers.RepeatedCompositeFieldContainer[ThroughputSlot]
    lease_s: float
    def __init__(self, server_time_ms: _Optional[int] = ..., reregister: _Optional[bool] = ..., peers_changed: _Optional[bool] = ..., throughput_slots: _Optional[_Iterable[_Union[ThroughputSlot, _Mapping]]] = ..., lease_s: _Optional[float] = ...) -> None: ...

class ThroughputSlot(_message.Message):
    __slots__ = ("test_id", "role", "peer_id", "peer_address", "port", "start_ms", "duration_s", "streams", "secret")
    TEST_ID_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    PEER_ID_FIELD_NUMBER: _ClassVar[int]
    PEER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    PORT_FIELD_NUMBER: _ClassVar[int]
    START_MS_FIELD_NUMBER: _ClassVar[int]
    DURATION_S_FIELD_NUMBER: _ClassVar[int]
    STREAMS_FIELD_NUMBER: _ClassVar[int]
    SECRET_FIELD_NUMBER: _ClassVar[int]
    test_id: str
    role: str
    peer_id: str
    peer_address: str
    port: int
    start_ms: int
    duration_s: float
    streams: int
    secret: bytes
    def __init__(self, test_id: _Optional[str] = ..., role: _Optional[str] = ..., peer_id: _Optional[str] = ..., peer_address: _Optional[str] = ..., port: _Optional[int] = ..., start_ms: _Optional[int] = ..., duration_s: _Optional[float] = ..., streams: _Optional[int] = ..., secret: _Optional[bytes] = ...) -> None: ...

class ThroughputResult(_message.Message):
    __slots__ = ("test_id", "sender_id", "start_ms", "duration_s", "bytes", "streams", "gbps", "ok", "detail")
    TEST_ID_FIELD_NUMBER: _ClassVar[int]
    SENDER_ID_FIELD_NUMBER: _ClassVar[int]
    START_MS_FIELD_NUMBER: _ClassVar[int]
    DURATION_S_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    STREAMS_FIELD_NUMBER: _ClassVar[int]
    GBPS_FIELD_NUMBER: _ClassVar[int]
    OK_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    test_id: str
    sender_id: str
    start_ms: int
    duration_s: float
    bytes: int
    streams: int
    gbps: float
    ok: bool
    detail: str
    def __init__(self, test_id: _Optional[str] = ..., sender_id: _Optional[str] = ..., start_ms: _Optional[int] = ..., duration_s: _Optional[float] = ..., bytes: _Optional[int] = ..., streams: _Optional[int] = ..., gbps: _Optional[float] = ..., ok: _Optional[bool] = ..., detail: _Optional[str] = ...) -> None: ...
