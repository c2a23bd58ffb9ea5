"""The bounds of every field the agent may read or send, as rows of one registry.

The checks stay where the records are (``hulk.wire.*``); this module only names their limits, by
importing the constants those checks use, so a table here cannot drift from its check without a
test noticing (tests/hostile/ holds each numeric row against the check it names). The planner's
tables, and the rendering of docs/BOUNDS.md, are ``planner.bounds``.

A row is a field and its rule: a :class:`hulk.validate.Bound` (a number), a :class:`Text` (a
string), a :class:`Rule` (anything else: a choice, a pattern, a byte size) or :class:`Unbounded`
(a field nothing limits yet: the audit's findings). Imports nothing beyond the standard library
and ``hulk``: the agent may use it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from hulk.validate import Bound
from hulk.wire import placement, progress, throughput


@dataclass(frozen=True)
class Text:
    """A string of ``min_chars`` to ``max_chars`` characters of the kind ``chars`` names."""

    max_chars: int
    chars: str = "printable characters"
    min_chars: int = 0


@dataclass(frozen=True)
class Rule:
    """A limit that is neither a range nor a length: a choice, a pattern, a size in bytes."""

    text: str
    unit: str = ""


@dataclass(frozen=True)
class Unbounded:
    """A field no check limits: listed so that the next round of hardening starts from it."""

    why: str = ""


Limit = Bound | Text | Rule | Unbounded


@dataclass(frozen=True)
class Table:
    """One input's fields: a wire record, a file format, a flag set or a settings file."""

    name: str                          # "RegisterRequest", "jobs.yaml", "serve flags"
    kind: str                          # "wire record", "file", "flags", "settings", "MQTT payload"
    source: str                        # the module whose checks enforce the rows
    rows: tuple[tuple[str, Limit], ...]

    def limit(self, field: str) -> Limit:
        return dict(self.rows)[field]


def numbers(bounds: Mapping[str, Bound], prefix: str = "") -> tuple[tuple[str, Bound], ...]:
    """Rows of a table of Bounds (``{"steps": Bound(...)}``), field names under ``prefix``."""
    return tuple((prefix + name, bound) for name, bound in bounds.items())


PORT = Bound(1, 65535, "TCP port", integer=True)
ID_TEXT = Text(128, "letters, digits, '.', '_', '-'; a letter or digit first", 1)
JOB_NAME = Text(64, "letters, digits, '.', '_', '-'; not '.' or '..'", 1)

_PROGRESS_UNITS = {"steps": "steps", "total_steps": "steps (0: unknown)",
                   "iteration_s": "seconds", "iteration_p90_s": "seconds",
                   "compute_s": "seconds", "communication_s": "seconds",
                   "samples": "steps", "updated_ms": "unix milliseconds",
                   "wall_iteration_s": "seconds (0: unknown)", "wall_steps": "steps"}
_PROGRESS_INTEGERS = frozenset({"steps", "total_steps", "samples", "updated_ms", "wall_steps"})

STEP_PROGRESS = Table("StepProgress", "wire record", "hulk/wire/progress.py", tuple(
    (name, Bound(0, high, _PROGRESS_UNITS[name], integer=name in _PROGRESS_INTEGERS))
    for name, high in progress.BOUNDS.items()))

_T = throughput
THROUGHPUT_SLOT = Table("ThroughputSlot", "wire record", "hulk/wire/throughput.py", (
    ("test_id", Rule("32 lowercase hex digits")),
    ("role", Rule("one of " + ", ".join(_T.ROLES))),
    ("peer_id", Text(_T.MAX_ID_CHARS, min_chars=1)),
    ("peer_address", Text(_T.MAX_ADDRESS_CHARS, min_chars=1)),
    ("port", PORT),
    ("start_ms", Bound(0, _T.MAX_MS, "unix milliseconds", integer=True)),
    ("duration_s", Bound(_T.MIN_DURATION_S, _T.MAX_DURATION_S, "seconds (above the least)")),
    ("streams", Bound(1, _T.MAX_STREAMS, "TCP streams", integer=True)),
    ("secret", Rule(f"exactly {_T.SECRET_BYTES} bytes")),
))

THROUGHPUT_RESULT = Table("ThroughputResult", "wire record", "hulk/wire/throughput.py", (
    ("test_id", Rule("32 lowercase hex digits")),
    ("sender_id", Text(_T.MAX_ID_CHARS, min_chars=1)),
    ("start_ms", Bound(0, _T.MAX_MS, "unix milliseconds", integer=True)),
    ("duration_s", Bound(0.0, _T.MAX_RESULT_DURATION_S, "seconds")),
    ("bytes", Bound(0, _T.MAX_BYTES, "bytes", integer=True)),
    ("streams", Bound(0, _T.MAX_STREAMS, "TCP streams", integer=True)),
    ("gbps", Bound(0.0, _T.MAX_GBPS, "Gbit/s (0 when not ok)")),
    ("ok", Rule("true or false")),
    ("detail", Text(_T.MAX_DETAIL_CHARS)),
))

_P = placement
INT31 = 2 ** 31 - 1
NODE_PLACEMENT = Table("placement (hulk-placement/2)", "MQTT payload", "hulk/wire/placement.py", (
    ("(document)", Rule(f"at most {_P.MAX_PLACEMENT_BYTES:,}", "bytes of JSON")),
    ("fleet", Text(_P.MAX_TEXT_CHARS, "any", 1)),
    ("node", Text(_P.MAX_TEXT_CHARS, "any", 1)),
    ("plan_id", Text(_P.MAX_TEXT_CHARS, "any", 1)),
    ("issued_at_ms", Bound(0, 2 ** 63 - 1, "unix milliseconds (the agent: not ahead of its "
                                            "clock by more than 5 minutes)", integer=True)),
    ("expires_at_ms", Bound(0, 2 ** 63 - 1, "unix milliseconds (the agent: at most 7 days and "
                                             "1 hour after issued_at_ms)", integer=True)),
    ("seq", Bound(0, _P.MAX_SEQ, "placements", integer=True)),
    ("signature", Rule("Ed25519 signature, base64")),
    ("roles[].job", JOB_NAME),
    ("roles[].plan_id", Text(_P.MAX_TEXT_CHARS, "any", 1)),
    ("roles[].phase", Bound(0, INT31, "phase", integer=True)),
    ("roles[].num_stages", Bound(1, INT31, "stages", integer=True)),
    ("roles[].stage", Rule("0 to num_stages - 1")),
    ("roles[].num_replicas", Bound(1, INT31, "replicas", integer=True)),
    ("roles[].replica", Rule("0 to num_replicas - 1")),
    ("roles[].world_size, nnodes", Rule("num_stages x num_replicas")),
    ("roles[].rank, node_rank", Rule("stage x num_replicas + replica")),
    ("roles[].layers", Rule("[lo, hi) with 0 <= lo < hi <= 2**31 - 1")),
    ("roles[].rendezvous.address", Text(_P.MAX_TEXT_CHARS, "any", 1)),
    ("roles[].rendezvous.port", PORT),
    ("roles[].micro_batch", Bound(1, INT31, "sequences", integer=True)),
    ("roles[].micro_batches", Bound(1, INT31, "micro-batches", integer=True)),
    ("roles[].command", Rule(f"1 to {_P.MAX_COMMAND_WORDS} words, no NUL", "argv words")),
    ("roles[].checkpoint_dir", Text(_P.MAX_PATH, "any but NUL", 1)),
    ("roles[].restart_count", Bound(0, INT31, "restarts", integer=True)),
))

PLAN_SUMMARY = Table("plan summary (hulk-plan-summary/2)", "MQTT payload",
                     "hulk/wire/placement.py", (
    ("(document)", Rule(f"at most {_P.MAX_SUMMARY_BYTES:,}", "bytes of JSON")),
    ("fleet, plan_id", Text(_P.MAX_TEXT_CHARS, "any", 1)),
    ("issued_at_ms, expires_at_ms", Bound(0, 2 ** 63 - 1, "unix milliseconds", integer=True)),
    ("jobs[].name", JOB_NAME),
    ("jobs[].plan_id", Text(_P.MAX_TEXT_CHARS, "any", 1)),
    ("jobs[].phase", Bound(0, INT31, "phase", integer=True)),
    ("jobs[].micro_batch", Bound(1, INT31, "sequences", integer=True)),
    ("jobs[].stages[].layers", Bound(0, INT31, "layers", integer=True)),
    ("jobs[].stages[].nodes", Rule("a list of node ids (strings)")),
    ("jobs[].spec", Rule("a JSON object (the job's fields, read by the planner)")),
    ("method", Text(_P.MAX_TEXT_CHARS, "any")),
    ("unplaced[].name", Text(_P.MAX_TEXT_CHARS, "any")),
    ("unplaced[].reason, spec", Rule("any text, an object (within the document's size)")),
))

TABLES: tuple[Table, ...] = (STEP_PROGRESS, THROUGHPUT_SLOT, THROUGHPUT_RESULT, NODE_PLACEMENT,
                             PLAN_SUMMARY)
