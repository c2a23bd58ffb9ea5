"""The MQTT placement messages: what a node is told to run, and the retained plan summary.

- ``hulk/v1/<fleet>/nodes/<node_id>/placement`` carries one ``NodePlacement`` as
  ``hulk-placement/2`` JSON (``NodePlacement.to_bytes``, strictly read by ``parse_placement``).
- ``hulk/v1/<fleet>/plan`` carries the plan summary, ``hulk-plan-summary/2``: every job with its
  stages as node ids, its plan id and its specification, so a planner can rebuild the plan from
  the broker (``parse_summary`` reads it into a ``PlanSummary``).

Both carry ``issued_at_ms``, ``expires_at_ms`` and an Ed25519 ``signature`` over their canonical
bytes (``hulk.wire.signing``). A role's ``command`` is an argv list; job names are 1-64 of
``[A-Za-z0-9._-]`` (not "." or ".."); ids, names and addresses at most MAX_TEXT_CHARS characters
(every field's range: docs/BOUNDS.md).

A placement's ``seq`` only grows per node (the planner's ``planner.service.placement_seq``): the
agent keeps the highest it accepted and refuses older ones, so a captured message cannot be
replayed. It is left out at 0, so a message of a planner without sequences still verifies. A
placement with no roles clears the node (signed like any other).

Roles and ranks. A job with K stages and D replicas runs as one torchrun group of ``K * D`` nodes,
one process per node (``--nproc-per-node 1``). The node of stage k in replica p has
``rank = node_rank = k * D + p``; rank 0 (stage 0, replica 0) hosts the rendezvous. Every job
gets its own rendezvous port. A node may hold several roles when jobs wait for others (phase 1,
2, ...): roles are listed in phase order and run one after the other.

Building these from a Plan is the planner's (``planner.core.placements``); this module is the
format only and imports nothing beyond the standard library and ``hulk.errors``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from hulk.errors import InputError

PLACEMENT_FORMAT = "hulk-placement/2"
SUMMARY_FORMAT = "hulk-plan-summary/2"
JOB_NAME_RE = re.compile(r"^[A-Za-z0-9._-]{1,64}$")
MAX_COMMAND_WORDS = 256          # the most argv words a role's command may have
MAX_TEXT_CHARS = 255             # ids, names and addresses: a host name's 253 and a little
MAX_SEQ = 2**63 - 1
VALIDITY_MS = 7 * 24 * 3600 * 1000            # a placement's validity, as the planner signs it
# What the agent tolerates: validity a little above the planner's, issue times a little ahead
# of its own clock (clocks differ), nothing more (a message "valid" for years could not expire).
MAX_VALIDITY_MS = VALIDITY_MS + 3600 * 1000
MAX_CLOCK_AHEAD_MS = 5 * 60 * 1000


def valid_job_name(name: object) -> bool:
    """1-64 of [A-Za-z0-9._-], not "." or "..": safe as one path component."""
    return isinstance(name, str) and bool(JOB_NAME_RE.match(name)) and name not in (".", "..")


def command_allowed(argv: Sequence[str], prefixes: Iterable[Sequence[str]]) -> bool:
    """Whether an agent whose ``allowed_commands`` are ``prefixes`` runs ``argv``: it starts
    with one of them, word by word (the agent's launcher and `jobs submit` both ask this)."""
    words = tuple(argv)
    return any(prefix and words[:len(prefix)] == tuple(prefix) for prefix in prefixes)
# The shipped broker's max_packet_size (deploy/mosquitto/hulk.conf; a test holds them equal): a
# whole MQTT packet, topic and headers included. A 10,000-server plan's summary is about 0.5 MB.
BROKER_MAX_PACKET_BYTES = 2 << 20
# A PUBLISH packet's bytes besides its payload, rounded up: fixed header (5), the longest topic
# (281: a placement topic of a 128-character fleet name and node id) with its length (2), packet
# id (2) and MQTT 5 properties.
MAX_PUBLISH_OVERHEAD = 512
MAX_PLACEMENT_BYTES = 256 << 10     # a placement is a few KiB; far inside a broker packet
MAX_SUMMARY_BYTES = BROKER_MAX_PACKET_BYTES - MAX_PUBLISH_OVERHEAD


def publish_packet_bytes(topic: str, payload: bytes) -> int:
    """Bytes of the QoS 1 MQTT PUBLISH packet carrying ``payload`` on ``topic`` (with one byte of
    MQTT 5 properties): what the broker's max_packet_size bounds."""
    remaining = 2 + len(topic.encode()) + 2 + 1 + len(payload)
    length_bytes = 1 + sum(remaining >= 128 ** k for k in (1, 2, 3))   # MQTT's varint: 1-4 bytes
    return 1 + length_bytes + remaining


@dataclass(frozen=True)
class Role:
    """One node's part in one job."""

    plan_id: str           # the plan that placed this job (kept when other jobs are re-planned)
    job: str
    phase: int
    stage: int
    num_stages: int
    layer_lo: int
    layer_hi: int          # one past the last layer
    replica: int
    num_replicas: int
    rank: int              # = node_rank: one process per node
    world_size: int        # = nnodes
    rendezvous_address: str
    rendezvous_port: int
    micro_batch: int
    command: tuple[str, ...] | None = None   # argv
    micro_batches: int = 1                   # per replica per optimizer step (the plan's m)
    checkpoint_dir: str | None = None        # absolute, or relative to the job's working directory
    restart_count: int = 0                   # times the job has been placed again
    # Low-communication training (docs/COSTMODEL.md section 9): islands are contiguous blocks of
    # replica indices; every inner_steps steps each stage's pseudo-gradient is averaged over all
    # its replicas at outer_compression. At their defaults a role is an ordinary `sync: step` one.
    sync: str = "step"                       # "step" | "diloco"
    inner_steps: int = 1
    outer_compression: str = "none"          # "none" | "bf16" | "int8"
    streaming_fragments: int = 0
    island: int = 0                          # this replica's island
    num_islands: int = 1

    @property
    def nnodes(self) -> int:
        return self.world_size

    @property
    def node_rank(self) -> int:
        return self.rank


@dataclass(frozen=True)
class NodePlacement:
    """What one node should do: its roles in phase order (empty: nothing)."""

    fleet: str
    node: str
    plan_id: str
    roles: tuple[Role, ...] = ()
    issued_at_ms: int = 0
    expires_at_ms: int = 0
    signature: str = ""
    seq: int = 0           # grows per node with every placement signed for it

    def to_json(self) -> dict[str, Any]:
        doc = {
            "format": PLACEMENT_FORMAT,
            "fleet": self.fleet,
            "node": self.node,
            "plan_id": self.plan_id,
            "issued_at_ms": self.issued_at_ms,
            "expires_at_ms": self.expires_at_ms,
            "roles": [_role_json(r) for r in self.roles],
        }
        if self.seq:
            doc["seq"] = self.seq
        if self.signature:
            doc["signature"] = self.signature
        return doc

    def signed(self, signer: Any, *, issued_at_ms: int, expires_at_ms: int,
               seq: int | None = None) -> "NodePlacement":
        """This placement with fresh times, ``seq`` (None: its own) and ``signer``'s signature
        (a ``hulk.wire.signing.Signer``)."""
        bare = replace(self, issued_at_ms=issued_at_ms, expires_at_ms=expires_at_ms, signature="",
                       seq=self.seq if seq is None else seq)
        return replace(bare, signature=signer.sign(bare.to_json())["signature"])

    def to_bytes(self) -> bytes:
        return json.dumps(self.to_json(), sort_keys=True, separators=(",", ":")).encode()


def _role_json(role: Role) -> dict[str, Any]:
    return {
        "plan_id": role.plan_id,
        "job": role.job,
        "phase": role.phase,
        "stage": role.stage,
        "num_stages": role.num_stages,
        "layers": [role.layer_lo, role.layer_hi],
        "replica": role.replica,
        "num_replicas": role.num_replicas,
        "rank": role.rank,
        "world_size": role.world_size,
        "nnodes": role.world_size,
        "node_rank": role.rank,
        "rendezvous": {"address": role.rendezvous_address, "port": role.rendezvous_port},
        "micro_batch": role.micro_batch,
        "command": list(role.command) if role.command is not None else None,
        # Optional: left out at their defaults, so agents that predate them still read the role.
        **({"micro_batches": role.micro_batches} if role.micro_batches != 1 else {}),
        **({"checkpoint_dir": role.checkpoint_dir} if role.checkpoint_dir is not None else {}),
        **({"restart_count": role.restart_count} if role.restart_count else {}),
        **({"sync": role.sync} if role.sync != "step" else {}),
        **({"inner_steps": role.inner_steps} if role.inner_steps != 1 else {}),
        **({"outer_compression": role.outer_compression}
           if role.outer_compression != "none" else {}),
        **({"streaming_fragments": role.streaming_fragments} if role.streaming_fragments else {}),
        **({"island": role.island} if role.island else {}),
        **({"num_islands": role.num_islands} if role.num_islands != 1 else {}),
    }


# ------------------------------------------------------------------------------------ parsing

class _Reader:
    """Typed field access that fails with one line naming the field and what was expected."""

    def __init__(self, source: str):
        self.source = source

    def fail(self, field_name: str, expected: str, value: Any = None) -> InputError:
        got = f", got {json.dumps(value)[:60]}" if value is not None else ""
        return InputError(f"expected {expected}{got}", path=self.source, field=field_name)

    def obj(self, value: Any, name: str, keys: set[str], optional: set[str] = frozenset()) -> dict:
        if not isinstance(value, dict):
            raise self.fail(name, "an object", value)
        missing = keys - value.keys()
        if missing:
            raise self.fail(f"{name}.{sorted(missing)[0]}" if name else sorted(missing)[0], "a value")
        unknown = value.keys() - keys - optional
        if unknown:
            raise self.fail(f"{name}.{sorted(unknown)[0]}" if name else sorted(unknown)[0],
                            "no such field in " + PLACEMENT_FORMAT)
        return value

    def text(self, value: Any, name: str, *, empty: bool = False) -> str:
        if not isinstance(value, str) or (not empty and not value.strip()):
            raise self.fail(name, "a non-empty string", value)
        if len(value) > MAX_TEXT_CHARS:
            raise self.fail(name, f"at most {MAX_TEXT_CHARS} characters, got {len(value)}")
        return value

    def items(self, value: Any, name: str) -> list:
        """A list; an absent or empty value is an empty one."""
        if value in (None, [], {}, ""):
            return []
        if not isinstance(value, list):
            raise self.fail(name, "a list", value)
        return value

    def integer(self, value: Any, name: str, low: int = 0, high: int = 2**31 - 1) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise self.fail(name, f"an integer in [{low}, {high}]", value)
        return value


_ROLE_KEYS = {"plan_id", "job", "phase", "stage", "num_stages", "layers", "replica", "num_replicas",
              "rank", "world_size", "nnodes", "node_rank", "rendezvous", "micro_batch", "command"}
_OPTIONAL_ROLE_KEYS = {"micro_batches", "checkpoint_dir", "restart_count", "sync", "inner_steps",
                       "outer_compression", "streaming_fragments", "island", "num_islands"}
MAX_PATH = 4096
ROLE_SYNC_MODES = ("step", "diloco")
OUTER_COMPRESSIONS = ("none", "bf16", "int8")   # planner.core.jobs.COMPRESSION_BYTES's keys
MAX_INNER_STEPS = 100_000
MAX_FRAGMENTS = 10_000      # at most one per layer; planner.core.jobs.JOB_BOUNDS["layers"]


def _parse_role(r: _Reader, value: Any, name: str) -> Role:
    obj = r.obj(value, name, _ROLE_KEYS, _OPTIONAL_ROLE_KEYS)
    num_stages = r.integer(obj["num_stages"], f"{name}.num_stages", 1)
    stage = r.integer(obj["stage"], f"{name}.stage", 0, num_stages - 1)
    num_replicas = r.integer(obj["num_replicas"], f"{name}.num_replicas", 1)
    replica = r.integer(obj["replica"], f"{name}.replica", 0, num_replicas - 1)
    world = r.integer(obj["world_size"], f"{name}.world_size", 1)
    if world != num_stages * num_replicas:
        raise r.fail(f"{name}.world_size", f"num_stages * num_replicas = {num_stages * num_replicas}", world)
    if r.integer(obj["nnodes"], f"{name}.nnodes", 1) != world:
        raise r.fail(f"{name}.nnodes", f"world_size = {world}", obj["nnodes"])
    rank = r.integer(obj["rank"], f"{name}.rank", 0, world - 1)
    if rank != stage * num_replicas + replica:
        raise r.fail(f"{name}.rank", f"stage * num_replicas + replica = {stage * num_replicas + replica}", rank)
    if r.integer(obj["node_rank"], f"{name}.node_rank", 0, world - 1) != rank:
        raise r.fail(f"{name}.node_rank", f"rank = {rank}", obj["node_rank"])
    layers = obj["layers"]
    if (not isinstance(layers, list) or len(layers) != 2
            or any(isinstance(x, bool) or not isinstance(x, int) for x in layers)
            or not 0 <= layers[0] < layers[1]):
        raise r.fail(f"{name}.layers", "[lo, hi) with 0 <= lo < hi", layers)
    rdzv = r.obj(obj["rendezvous"], f"{name}.rendezvous", {"address", "port"})
    command = obj["command"]
    if command is not None:
        if (not isinstance(command, list) or not 1 <= len(command) <= MAX_COMMAND_WORDS
                or not all(isinstance(a, str) and "\0" not in a for a in command) or not command[0]):
            raise r.fail(f"{name}.command", f"an argv list of 1-{MAX_COMMAND_WORDS} strings", command)
        command = tuple(command)
    job = obj["job"]
    if not valid_job_name(job):
        raise r.fail(f"{name}.job", "a job name of 1-64 [A-Za-z0-9._-]", job)
    checkpoint_dir = obj.get("checkpoint_dir")
    if checkpoint_dir is not None and (not isinstance(checkpoint_dir, str) or not checkpoint_dir.strip()
                                       or len(checkpoint_dir) > MAX_PATH or "\0" in checkpoint_dir):
        raise r.fail(f"{name}.checkpoint_dir", f"a path of 1-{MAX_PATH} characters", checkpoint_dir)
    sync = obj.get("sync", "step")
    if sync not in ROLE_SYNC_MODES:
        raise r.fail(f"{name}.sync", " or ".join(ROLE_SYNC_MODES), sync)
    compression = obj.get("outer_compression", "none")
    if compression not in OUTER_COMPRESSIONS:
        raise r.fail(f"{name}.outer_compression", ", ".join(OUTER_COMPRESSIONS), compression)
    num_islands = r.integer(obj.get("num_islands", 1), f"{name}.num_islands", 1, num_replicas)
    return Role(
        plan_id=r.text(obj["plan_id"], f"{name}.plan_id"),
        job=job,
        phase=r.integer(obj["phase"], f"{name}.phase"),
        stage=stage, num_stages=num_stages, layer_lo=layers[0], layer_hi=layers[1],
        replica=replica, num_replicas=num_replicas, rank=rank, world_size=world,
        rendezvous_address=r.text(rdzv["address"], f"{name}.rendezvous.address"),
        rendezvous_port=r.integer(rdzv["port"], f"{name}.rendezvous.port", 1, 65535),
        micro_batch=r.integer(obj["micro_batch"], f"{name}.micro_batch", 1),
        command=command,
        micro_batches=r.integer(obj.get("micro_batches", 1), f"{name}.micro_batches", 1),
        checkpoint_dir=checkpoint_dir,
        restart_count=r.integer(obj.get("restart_count", 0), f"{name}.restart_count"),
        sync=sync,
        inner_steps=r.integer(obj.get("inner_steps", 1), f"{name}.inner_steps", 1, MAX_INNER_STEPS),
        outer_compression=compression,
        streaming_fragments=r.integer(obj.get("streaming_fragments", 0),
                                      f"{name}.streaming_fragments", 0, MAX_FRAGMENTS),
        island=r.integer(obj.get("island", 0), f"{name}.island", 0, num_islands - 1),
        num_islands=num_islands,
    )


def _load_json(data: bytes | str, source: str, fmt: str, limit: int) -> Any:
    """The JSON value of a message, or InputError (one line): too large, not UTF-8, not JSON,
    nested too deeply, NaN/Infinity, integers of thousands of digits."""
    if len(data) > limit:
        raise InputError(f"expected a {fmt} document of at most {limit} bytes, got {len(data)}",
                         path=source)
    try:
        text = data.decode("utf-8") if isinstance(data, (bytes, bytearray)) else data
        return json.loads(text, parse_constant=lambda c: (_ for _ in ()).throw(ValueError(c)))
    except RecursionError:
        raise InputError(f"expected a {fmt} document, got JSON nested too deeply",
                         path=source) from None
    except (UnicodeDecodeError, ValueError) as exc:
        raise InputError(f"expected a JSON {fmt} document ({exc})".splitlines()[0],
                         path=source) from None


def parse_placement(data: bytes | str, *, source: str = "placement",
                    verifier: Any = None) -> NodePlacement:
    """Strictly parse a ``hulk-placement/2`` message; InputError (one line) on anything else.

    With ``verifier`` (a ``hulk.wire.signing.Verifier``) its signature must be good too."""
    r = _Reader(source)
    value = _load_json(data, source, PLACEMENT_FORMAT, MAX_PLACEMENT_BYTES)
    if isinstance(value, dict) and value.get("format") != PLACEMENT_FORMAT:  # say the version first
        raise r.fail("format", repr(PLACEMENT_FORMAT), value.get("format"))
    obj = r.obj(value, "", {"format", "fleet", "node", "plan_id", "issued_at_ms", "expires_at_ms",
                            "roles"}, {"signature", "seq"})
    if verifier is not None:
        verifier.verify(obj, source=source)
    if not isinstance(obj["roles"], list):
        raise r.fail("roles", "a list", obj["roles"])
    roles = tuple(_parse_role(r, item, f"roles[{i}]") for i, item in enumerate(obj["roles"]))
    jobs = [role.job for role in roles]
    if len(set(jobs)) != len(jobs):
        raise r.fail("roles", "at most one role per job")
    if [role.phase for role in roles] != sorted(role.phase for role in roles):
        raise r.fail("roles", "roles in phase order")
    signature = obj.get("signature", "")
    return NodePlacement(fleet=r.text(obj["fleet"], "fleet"), node=r.text(obj["node"], "node"),
                         plan_id=r.text(obj["plan_id"], "plan_id"), roles=roles,
                         issued_at_ms=r.integer(obj["issued_at_ms"], "issued_at_ms", 0, 2**63 - 1),
                         expires_at_ms=r.integer(obj["expires_at_ms"], "expires_at_ms", 0, 2**63 - 1),
                         signature=r.text(signature, "signature", empty=True),
                         seq=r.integer(obj.get("seq", 0), "seq", 0, MAX_SEQ))


# ------------------------------------------------------------------------------ plan summary

@dataclass(frozen=True)
class SummaryJob:
    name: str
    plan_id: str
    phase: int
    micro_batch: int
    stages: tuple[tuple[int, int, tuple[str, ...]], ...]   # (lo, hi, node ids)
    spec: dict[str, Any] = field(default_factory=dict)
    islands: tuple[int, ...] = ()                   # replicas per island; () one group
    outer: tuple[int, str, int] | None = None       # (inner_steps, compression, fragments)

    @property
    def node_ids(self) -> list[str]:
        return [n for _, _, nodes in self.stages for n in nodes]


@dataclass(frozen=True)
class PlanSummary:
    fleet: str
    plan_id: str
    method: str
    issued_at_ms: int
    jobs: tuple[SummaryJob, ...]
    unplaced: tuple[tuple[str, str, dict[str, Any]], ...] = ()   # (name, reason, spec)
    expires_at_ms: int = 0
    document: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)  # as read


def _summary_islands(r: _Reader, job: dict, name: str, replicas: int) -> dict[str, Any]:
    """A summary job's optional ``islands`` and ``outer`` (a low-communication job)."""
    if "outer" not in job and "islands" not in job:
        return {}
    outer = r.obj(job.get("outer"), f"{name}.outer",
                  {"inner_steps", "compression", "streaming_fragments"})
    if outer["compression"] not in OUTER_COMPRESSIONS:
        raise r.fail(f"{name}.outer.compression", ", ".join(OUTER_COMPRESSIONS),
                     outer["compression"])
    sizes = [r.integer(x, f"{name}.islands", 1) for x in r.items(job.get("islands"),
                                                                  f"{name}.islands")]
    if sum(sizes) != replicas:
        raise r.fail(f"{name}.islands", f"replicas per island summing to {replicas}", sizes)
    return {"islands": tuple(sizes),
            "outer": (r.integer(outer["inner_steps"], f"{name}.outer.inner_steps", 1,
                                MAX_INNER_STEPS), outer["compression"],
                      r.integer(outer["streaming_fragments"], f"{name}.outer.streaming_fragments",
                                0, MAX_FRAGMENTS))}


def parse_summary(data: bytes | str, *, source: str = "plan summary",
                  verifier: Any = None) -> PlanSummary:
    """Parse a ``hulk-plan-summary/2`` document (what ``hulk/v1/<fleet>/plan`` retains); with
    ``verifier`` its signature must be good."""
    r = _Reader(source)
    value = _load_json(data, source, SUMMARY_FORMAT, MAX_SUMMARY_BYTES)
    if not isinstance(value, dict) or value.get("format") != SUMMARY_FORMAT:
        raise r.fail("format", repr(SUMMARY_FORMAT), value.get("format") if isinstance(value, dict) else None)
    if verifier is not None:
        verifier.verify(value, source=source)
    jobs = []
    for i, job in enumerate(r.items(value.get("jobs"), "jobs")):
        name = f"jobs[{i}]"
        if not isinstance(job, dict):
            raise r.fail(name, "an object", job)
        stages = []
        for k, st in enumerate(r.items(job.get("stages"), f"{name}.stages")):
            if (not isinstance(st, dict) or not isinstance(st.get("layers"), list)
                    or len(st["layers"]) != 2 or not isinstance(st.get("nodes"), list)
                    or not all(isinstance(n, str) for n in st["nodes"])):
                raise r.fail(f"{name}.stages[{k}]", "{layers: [lo, hi], nodes: [ids]}", st)
            stages.append((r.integer(st["layers"][0], f"{name}.stages[{k}].layers"),
                           r.integer(st["layers"][1], f"{name}.stages[{k}].layers"), tuple(st["nodes"])))
        if not stages:
            raise r.fail(f"{name}.stages", "at least one stage")
        spec = job.get("spec")
        if not isinstance(spec, dict):
            raise r.fail(f"{name}.spec", "an object", spec)
        if not valid_job_name(job.get("name")):
            raise r.fail(f"{name}.name", "a job name of 1-64 [A-Za-z0-9._-]", job.get("name"))
        jobs.append(SummaryJob(name=job["name"],
                               plan_id=r.text(job.get("plan_id"), f"{name}.plan_id"),
                               phase=r.integer(job.get("phase"), f"{name}.phase"),
                               micro_batch=r.integer(job.get("micro_batch"), f"{name}.micro_batch", 1),
                               stages=tuple(stages), spec=spec,
                               **_summary_islands(r, job, name, len(stages[0][2]))))
    unplaced = tuple((r.text(u.get("name", ""), f"unplaced[{i}].name", empty=True),
                      str(u.get("reason", "")), u.get("spec") if isinstance(u.get("spec"), dict) else {})
                     for i, u in enumerate(r.items(value.get("unplaced"), "unplaced"))
                     if isinstance(u, dict))
    return PlanSummary(fleet=r.text(value.get("fleet"), "fleet"),
                       plan_id=r.text(value.get("plan_id"), "plan_id"),
                       method=r.text(value.get("method", ""), "method", empty=True),
                       issued_at_ms=r.integer(value.get("issued_at_ms", 0), "issued_at_ms", 0, 2**63 - 1),
                       expires_at_ms=r.integer(value.get("expires_at_ms", 0), "expires_at_ms", 0, 2**63 - 1),
                       jobs=tuple(jobs), unplaced=unplaced, document=value)


def summary_bytes(summary: dict[str, Any]) -> bytes:
    return json.dumps(summary, sort_keys=True, separators=(",", ":")).encode()
