"""Every input's bounds in one registry, and docs/BOUNDS.md rendered from it.

The checks stay where the inputs are read (admission, the file readers, the flag and settings
checks, the agent's readers); this module imports the tables and constants those checks use and
lists them per input: the wire records of the gRPC contract, the MQTT payloads, the files and
the flags. A field nothing limits is an :class:`hulk.bounds.Unbounded` row, so the doc says so.

    python -m planner.bounds                        # print docs/BOUNDS.md
    python -m planner.bounds --write docs/BOUNDS.md
    python -m planner.bounds --check docs/BOUNDS.md # exit 1 when the file is not current

tests/hostile/ holds the numeric rows of the wire records against the checks they name.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from agent import config as agent_config
from agent import progress as agent_progress
from hulk import bounds as hb
from hulk.bounds import ID_TEXT, JOB_NAME, Limit, Rule, Table, Text, Unbounded, numbers
from hulk.validate import Bound
from hulk.wire import histogram
from hulk.wire import progress as wire_progress
from hulk.wire.placement import MAX_COMMAND_WORDS, MAX_PATH, MAX_TEXT_CHARS
from hulk.wire.records import SITE_MAX_CHARS
from planner import settings as planner_settings
from planner.commands import serve
from planner.core import calibration
from planner.core import fleet as core_fleet
from planner.core.jobs import (COMPRESSION_BYTES, DEFAULT_DTYPE, DTYPE_BYTES, DTYPE_FIELDS,
                               JOB_BOUNDS, SYNC_BOUNDS, SYNC_MODES)
from planner.files import jobs as jobs_file
from planner.files import paper
from planner.files import plan as plan_file
from planner.service import admission as adm
from planner.service.ingest import ServerLimits

BOOLEAN = Rule("true or false")
INT64 = 2 ** 63 - 1
NO_CONTROL = "no control characters"
PORT_OR_NONE = Bound(0, 65535, "TCP port (0: none)", integer=True)
LIMITS = ServerLimits()


def _wire(names: Iterable[str], prefix: str) -> tuple[tuple[str, Bound], ...]:
    return tuple((prefix + name, adm.WIRE_BOUNDS[name]) for name in names)


REGISTER = Table("RegisterRequest", "wire record", "planner/service/admission.py", (
    ("(message)", Rule(f"at most {LIMITS.max_register_bytes:,}", "bytes")),
    ("node_id", ID_TEXT),
    ("hostname", Text(adm.TEXT_LIMITS["hostname"], NO_CONTROL)),
    ("agent_version", Text(adm.TEXT_LIMITS["agent_version"], NO_CONTROL)),
    ("address", Text(253, "an IP address or a DNS host name; empty: the node id")),
    ("probe_port", PORT_OR_NONE),
    ("throughput_port", PORT_OR_NONE),
    ("location.city", Text(adm.TEXT_LIMITS["city"], NO_CONTROL)),
    ("location.site", Text(SITE_MAX_CHARS)),
    ("location.has_coordinates", BOOLEAN),
    ("location.latitude", Bound(-90, 90, "degrees")),
    ("location.longitude", Bound(-180, 180, "degrees")),
    ("inventory.gpus", Bound(0, adm.MAX_GPUS, "GPUs", integer=True)),
    ("inventory.gpus[].name", Text(adm.TEXT_LIMITS["gpu.name"], NO_CONTROL)),
    ("inventory.gpus[].uuid", Text(adm.TEXT_LIMITS["gpu.uuid"], NO_CONTROL)),
    ("inventory.gpus[].memory_bytes", Bound(0, adm.MAX_GPU_MEMORY_BYTES, "bytes", integer=True)),
    ("inventory.gpus[].compute_capability",
     Bound(0, adm.MAX_COMPUTE_CAPABILITY, "a CUDA compute capability")),
    ("inventory.driver_version", Text(adm.TEXT_LIMITS["inventory.driver_version"], NO_CONTROL)),
    ("inventory.unavailable_reason",
     Text(adm.TEXT_LIMITS["inventory.unavailable_reason"], NO_CONTROL)),
    ("inventory.declared", BOOLEAN),
    ("allowed_commands", Bound(0, adm.MAX_ALLOWED_COMMANDS, "command prefixes", integer=True)),
    ("allowed_commands[].argv", Rule(f"1 to {MAX_COMMAND_WORDS} printable words, "
                                     f"{adm.MAX_PREFIX_CHARS:,} characters in all")),
    ("allowed_commands_known", BOOLEAN),
))

HEARTBEAT = Table("HeartbeatRequest", "wire record",
                  "planner/service/ingest.py, planner/service/admission.py", (
    ("(message)", Rule(f"at most {LIMITS.max_heartbeat_bytes:,}", "bytes")),
    ("node_id", Rule("the caller's own node id")),
    ("time_ms", Rule("any int64 (0 or less: not given)", "unix milliseconds, the agent's clock")),
    ("spool_depth", Bound(0, INT64, "records", integer=True)),
    ("spool_dropped", Bound(0, INT64, "records", integer=True)),
    ("launch.state", Rule("a LaunchState the planner knows (0-5)")),
    *((f"launch.{name}", Text(limit, "any; a longer one is cut to this length"))
      for name, limit in adm.LAUNCH_TEXT_LIMITS.items()),
    ("launch.exit_code", Rule("any int32")),
    ("launch.exit_cause", Rule("an ExitCause (0-1); another, or one with a state other than "
                               "EXITED, reads as 0 (the process's own exit)")),
    ("launch.changed_at_ms", Unbounded("any int64, stored as sent")),
    ("launch.progress", Rule("see StepProgress")),
))

REPORT = Table("ReportRequest", "wire record",
               "planner/service/ingest.py, planner/service/admission.py", (
    ("(message)", Rule(f"at most {LIMITS.max_message_bytes:,}", "bytes")),
    ("node_id", Rule("the caller's own node id")),
    ("batch_id", Text(64, "letters, digits, '.', '_', '-'", 1)),
    ("samples + summaries + throughput",
     Bound(0, LIMITS.max_batch_samples, "records", integer=True)),
    ("spool_dropped", Bound(0, INT64, "records", integer=True)),
    ("samples[].peer_id, summaries[].peer_id",
     Rule("a registered node's id (another is rejected and counted)")),
    ("samples[].sent_at_ms, summaries[].round_start_ms",
     Rule("int64; older than the raw retention: rejected and counted; ahead of the planner's "
          "clock: the batch is moved back", "unix milliseconds")),
    ("samples[].kind, summaries[].kind", Rule("a known ProbeKind")),
    ("samples[].lost", BOOLEAN),
    *_wire(("payload_bytes", "timeout_ms", "rtt_ms"), "samples[]."),
    *_wire((n for n in adm.WIRE_BOUNDS if n != "rtt_ms"), "summaries[]."),
    ("summaries[].histogram_buckets", Rule(f"increasing bucket numbers, at most "
                                           f"{histogram.OVERFLOW}; first and last hold min, max")),
    ("summaries[].histogram_counts", Rule("each at least 1, adding up to count - lost")),
    ("throughput[]", Rule("see ThroughputResult")),
))

_F = core_fleet.FLEET_BOUNDS
_FLEET_TEXT = Text(core_fleet.FLEET_TEXT_CHARS)
FLEET_JSON = Table("fleet JSON", "file", "planner/files/fleet.py, planner/files/fleet_links.py", (
    ("(file)", Rule(f"a regular file of at most {paper.MAX_FLEET_FILE_BYTES:,}", "bytes")),
    ("name", _FLEET_TEXT),
    ("nodes[].id", ID_TEXT),
    ("nodes[].city, site, gpu_name", _FLEET_TEXT),
    ("nodes[].gpus", _F["gpus"]),
    ("nodes[].memory_gb", _F["memory_gb"]),
    ("nodes[].compute_capability", _F["compute_capability"]),
    ("nodes[].latitude", Bound(-90, 90, "degrees")),
    ("nodes[].longitude", Bound(-180, 180, "degrees")),
    ("sites[].id", _FLEET_TEXT),
    ("links[].src, dst; site_links[].src, dst", Rule("a node (site) of the file")),
    *((f"links[].{name}, site_links[].{name}", _F[name])
      for name in ("rtt_ms", "bandwidth_gbps", "loss", "samples")),
    ("site_links[].source", Rule("one of " + ", ".join(core_fleet.SITE_LINK_SOURCES)
                                 + " (default measured)")),
    ("site_links[].rtt_hi_ms", Rule("as rtt_ms, and at least the link's rtt_ms", "ms")),
    ("site_links[].bandwidth_lo_gbps", Rule("as bandwidth_gbps, and at most the link's "
                                            "bandwidth_gbps (which it needs)", "Gbit/s")),
    ("site_links[].rtt_source", Rule("one of " + ", ".join(core_fleet.SITE_LINK_SOURCES)
                                     + " (default: as source)")),
    ("nodes", Bound(1, core_fleet.MAX_FLEET_NODES, "nodes", integer=True)),
    ("links", Rule("any count within the file's size")),
))

PAPER = Table("paper fleet (node_feature.csv, edge.txt, zip)", "file", "planner/files/paper.py", (
    ("(file, archive member)", Rule(f"a regular file of at most "
                                    f"{paper.MAX_FLEET_FILE_BYTES:,}; not encrypted", "bytes")),
    ("node_feature.csv Capability", _F["compute_capability"]),
    ("node_feature.csv Memory", _F["memory_gb"]),
    ("node_feature.csv node; edge.txt src, dst", Rule("an integer whose digits follow the "
                                                      "node-id rule (1 to 128 characters)")),
    ("node_feature.csv City", _FLEET_TEXT),
    ("node_feature.csv rows", Bound(1, core_fleet.MAX_FLEET_NODES, "nodes", integer=True)),
    ("edge.txt weight", _F["rtt_ms"]),
))

JOBS_YAML = Table("jobs.yaml", "file", "planner/files/jobs.py, planner/core/jobs.py", (
    ("jobs[].name", JOB_NAME),
    ("jobs[].model", Text(jobs_file.MAX_MODEL_CHARS, "printable characters", 1)),
    *numbers(JOB_BOUNDS, "jobs[]."),
    ("jobs[].sync", Rule(" or ".join(SYNC_MODES) + " (default step)")),
    *numbers(SYNC_BOUNDS, "jobs[]."),
    ("jobs[].outer_compression", Rule("one of " + ", ".join(COMPRESSION_BYTES)
                                      + "; under sync: auto, a list of them")),
    *((f"jobs[].{key}", Rule("one of " + ", ".join(DTYPE_BYTES) + f" (default {DEFAULT_DTYPE})"))
      for key in DTYPE_FIELDS),
    ("jobs[].command", Rule(f"1 to {MAX_COMMAND_WORDS} words, "
                           f"{jobs_file.MAX_COMMAND_CHARS:,} characters in all, no NUL")),
    ("jobs[].checkpoint_dir", Text(MAX_PATH, "no NUL; a relative path without '..'", 1)),
    ("(file)", Rule(f"a regular file of at most {jobs_file.MAX_JOBS_FILE_BYTES:,}", "bytes")),
    ("jobs", Rule("any count within the file's size")),
))

PLAN_JSON = Table("plan JSON (hulk-plan/1)", "file", "planner/files/plan.py", (
    ("method", Text(MAX_TEXT_CHARS, min_chars=1)),
    ("fleet.nodes", Bound(0, plan_file.MAX_COUNT, "nodes", integer=True)),
    ("jobs[].name", JOB_NAME),
    ("jobs[].phase", Bound(0, plan_file.MAX_COUNT, "phase", integer=True)),
    ("jobs[].micro_batch", Bound(1, JOB_BOUNDS["micro_batch"].high, "sequences", integer=True)),
    ("jobs[].stages[].layers", Bound(0, JOB_BOUNDS["layers"].high, "layers", integer=True)),
    ("jobs[].stages[].nodes[]", Text(MAX_TEXT_CHARS, "any (a node of the fleet with --fleet)", 1)),
    ("jobs[].estimate.*, totals.*", Rule("a finite number >= 0, or null", "seconds")),
    ("jobs[].sync.inner_steps", SYNC_BOUNDS["inner_steps"]),
    ("jobs[].sync.compression", Rule("one of " + ", ".join(COMPRESSION_BYTES))),
    ("jobs[].sync.streaming_fragments", Rule("0 to the job's layers")),
    ("jobs[].islands.replicas[]", Rule("whole numbers >= 1 summing to the stages' nodes")),
    ("unplaced[].name", Text(MAX_TEXT_CHARS, "any")),
    ("unplaced[].reason", Text(plan_file.MAX_REASON_CHARS, "any")),
    ("lower_bound.binding", Text(MAX_TEXT_CHARS, "any", 1)),
    ("lower_bound.seconds, gap", Rule("a finite number >= 0, or null")),
    ("(file)", Rule(f"a regular file of at most {plan_file.MAX_PLAN_FILE_BYTES:,}", "bytes")),
    ("jobs, unplaced", Rule("any count within the file's size")),
))

CALIBRATION = Table("calibration file (calibrate --out)", "file", "planner/core/calibration.py", (
    ("compute.*.value, low, high", Bound(*calibration.MULTIPLIER_RANGE, "a multiplier")),
    ("bandwidth.*.value, low, high", Bound(*calibration.BANDWIDTH_GBPS_RANGE, "Gbit/s")),
    ("communication.value, low, high", Bound(*calibration.MULTIPLIER_RANGE, "a divisor")),
    ("outer_sync.value, low, high", Bound(*calibration.MULTIPLIER_RANGE, "a multiplier")),
    ("hop_overhead_s.value, low, high", Bound(*calibration.OVERHEAD_S_RANGE, "seconds")),
    ("micro_batch_overhead_s.value, low, high", Bound(*calibration.OVERHEAD_S_RANGE,
                                                       "seconds")),
    ("step_overhead_s.value, low, high", Bound(*calibration.OVERHEAD_S_RANGE, "seconds")),
    ("bandwidth_exponent.value, low, high", Bound(*calibration.EXPONENT_RANGE, "an exponent")),
    ("*.low, *.value, *.high", Rule("low <= value <= high")),
    ("*.fitted", BOOLEAN),
    ("*.runs", Bound(0, calibration.MAX_RUNS, "runs", integer=True)),
    ("compute, bandwidth (keys); outliers[]", Text(calibration.MAX_NAME_CHARS, "any")),
    ("compute, bandwidth, outliers", Unbounded("any count (read whole)")),
))

PROGRESS_FILE = Table("progress file (HULK_PROGRESS_FILE)", "file", "agent/progress.py", (
    ("(read)", Rule(f"the last {agent_progress.READ_BYTES:,}", "bytes")),
    ("(line)", Rule(f"at most {agent_progress.MAX_LINE_BYTES:,} bytes; a longer one is skipped")),
    ("step, total_steps", Bound(0, wire_progress.MAX_STEPS, "steps", integer=True)),
    ("step_s, compute_s, communication_s", Bound(0, wire_progress.MAX_STEP_S, "seconds")),
    ("time", Bound(0, wire_progress.MAX_UPDATED_MS / 1000, "unix seconds")),
))

# What agent/config.py's and planner/settings.py's parsers that are not a Bound accept.
_AC = agent_config


def _agent_text(key: str, chars: str, min_chars: int = 0) -> Text:
    """An agent text setting's row: its bound from agent/config.py's TEXT_LIMITS."""
    return Text(_AC.TEXT_LIMITS[key][0], chars, min_chars)


_PATH = "a path, no control characters"
AGENT_SETTINGS = {
    "planner": _agent_text("planner", "HOST:PORT", 1), "node_id": ID_TEXT,
    "address": _agent_text("address", "an IP address, or empty"),
    "city": _agent_text("city", NO_CONTROL), "site": _agent_text("site", "printable characters"),
    "state_dir": _agent_text("state_dir", _PATH, 1), "insecure": BOOLEAN,
    "token": _agent_text("token", "visible ASCII (hulk1.<id>.<secret>)"),
    "ca": _agent_text("ca", "the path of a PEM file"),
    "client_cert": _agent_text("client_cert", "the path of a PEM file"),
    "client_key": _agent_text("client_key", "the path of a PEM file"),
    "mqtt": _agent_text("mqtt", "a broker URL"),
    "log_level": Rule("DEBUG, INFO, WARNING or ERROR"),
    "placement_key": Rule(f"at most {_AC.MAX_PLACEMENT_KEYS} Ed25519 public keys (ed25519:<base64> "
                          f"or a PEM file), {MAX_PATH:,} characters each"),
    "allowed_commands": Rule(f"at most {_AC.MAX_ALLOWED_COMMANDS} argv prefixes of 1 to "
                             f"{MAX_COMMAND_WORDS} printable words, {_AC.MAX_PREFIX_CHARS:,} "
                             f"characters in all (as Register takes them), "
                             f"{_AC.ALLOWED_COMMANDS_MAX_BYTES:,} bytes in all encoded"),
    "pass_env": Rule(f"at most {_AC.MAX_PASS_ENV} variable names of at most "
                     f"{_AC.ENV_NAME_MAX_CHARS} characters"),
    "torchrun": _agent_text("torchrun", "a path or a command name, no control characters"),
    "job_scope": Rule("a job scope name"),
    "metrics": _agent_text("metrics", "HOST:PORT"),
    "declared_gpus": _agent_text("declared_gpus", "COUNTxNAME:GB"),
}
PLANNER_SETTINGS = {
    "db": Rule("a path"), "listen": Rule("HOST:PORT"),
    "fleet": Text(128, "letters, digits, '.', '_', '-'", 1), "insecure": BOOLEAN,
    "mqtt": Rule("a broker URL"), "log_level": Rule("DEBUG, INFO, WARNING or ERROR"),
    "signing_key": Rule("a path"), "previous_placement_key": Rule("a path"),
}
SERVE_TEXT_FLAGS = {
    "--listen, --metrics, --dashboard": Rule("HOST:PORT"),
    "--fleet-name": Text(128, "letters, digits, '.', '_', '-'", 1),
    "--mqtt": Rule("a broker URL"),
    "--db, --signing-key, --tls-*, --client-ca, --dashboard-token, --model-dir": Rule("a path"),
}


def parser_rows(parsers: Mapping[str, Callable[[Any], Any]], described: Mapping[str, Limit],
                names: Callable[[str], str] = str) -> tuple[tuple[str, Limit], ...]:
    """A settings table's rows: a Bound parser is its own row, the others as ``described``
    (a parser without a description is listed as unbounded)."""
    return tuple((names(key), parser if isinstance(parser, Bound)
                  else described.get(key, Unbounded("not described in planner/bounds.py")))
                 for key, parser in parsers.items())


def _agent_name(key: str) -> str:
    """The field, its variable and its flag (agent.yaml, HULK_*, --flag)."""
    variable, flag = agent_config.SOURCES.get(key, (None, None))
    return ", ".join(x for x in (key, variable, flag) if x)


AGENT_YAML = Table("agent.yaml (and its HULK_* variables and flags)", "settings",
                   "agent/config.py", (
    ("(file)", Rule(f"a regular file of at most {agent_config.MAX_CONFIG_FILE_BYTES:,}", "bytes")),
    ("(keys)", Rule("each setting once: a key twice, or a field and its alias (interval, "
                    "interval_s), is refused")),
    *parser_rows(agent_config.PARSERS, AGENT_SETTINGS, _agent_name)))
PLANNER_ENV = Table("planner HULK_* variables", "settings", "planner/settings.py",
                    parser_rows(planner_settings.PARSERS, PLANNER_SETTINGS,
                                lambda key: planner_settings.VARIABLES[key]))
SERVE_FLAGS = Table("serve flags", "flags", "planner/commands/serve.py",
                    numbers(serve.FLAG_BOUNDS) + tuple(SERVE_TEXT_FLAGS.items()))

TABLES: tuple[Table, ...] = (
    REGISTER, HEARTBEAT, hb.STEP_PROGRESS, REPORT, hb.THROUGHPUT_RESULT, hb.THROUGHPUT_SLOT,
    hb.NODE_PLACEMENT, hb.PLAN_SUMMARY, FLEET_JSON, PAPER, JOBS_YAML, PLAN_JSON, CALIBRATION,
    PROGRESS_FILE, AGENT_YAML, PLANNER_ENV, SERVE_FLAGS)


# --------------------------------------------------------------------------------- rendering

HEADER = """\
# Bounds of every input

Every field of every wire record, MQTT payload, file and flag the planner or the agent reads, with
the range its check accepts. A value outside is refused with one line naming the field (gRPC
INVALID_ARGUMENT, exit code 2 in the CLI); "cut" texts are shortened instead, so that a heartbeat
is never refused for its launch report. **unbounded** rows are fields no check limits yet.

This file is generated from `planner/bounds.py`, which imports the tables the checks use (the
agent's from `hulk/bounds.py`): edit the check's table, then run
`python -m planner.bounds --write docs/BOUNDS.md`; `tests/test_docs.py` fails while it is not
current.

The hostile-input suite is `tests/hostile/`: property tests (hypothesis, a fixed seed: the `ci`
profile of `tests/conftest.py`) that feed every gRPC request, file format and agent reader
hostile values (huge, negative, NaN, long and control-character texts, many items) and expect a
value within these bounds or one clear refusal, never another exception; and the reproductions
of past findings, one test each. To add a case: a bound goes into the check's table and a row
here; a new input gets a strategy in `tests/hostile/` beside its reader's, and a reproduction of
a finding is a plain test named after what it shows, in the file of its input.
"""


def _number(x: float) -> str:
    """1,000,000 for whole numbers a reader counts digits of; 0.001 and 1e+13 as they are."""
    if float(x).is_integer() and abs(x) < 1e12:
        return f"{int(x):,}"
    return f"{x:g}" if isinstance(x, float) else f"{x:,}"


def _range(limit: Limit) -> tuple[str, str]:
    if isinstance(limit, Bound):
        return f"{_number(limit.low)} to {_number(limit.high)}", limit.unit
    if isinstance(limit, Text):
        return f"{limit.min_chars} to {limit.max_chars:,} characters", limit.chars
    if isinstance(limit, Rule):
        return limit.text, limit.unit
    return "**unbounded**", limit.why


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def render(tables: Iterable[Table] = TABLES) -> str:
    out = [HEADER]
    loose: list[str] = []
    for table in tables:
        out += [f"\n## {table.name}\n", f"Kind: {table.kind}; checked in `{table.source}`.\n",
                "| field | range | unit |", "|---|---|---|"]
        for field, limit in table.rows:
            rng, unit = _range(limit)
            out.append(f"| `{_cell(field)}` | {_cell(rng)} | {_cell(unit)} |")
            if isinstance(limit, Unbounded):
                loose.append(f"- {table.name}: `{field}` ({limit.why})")
    out += ["\n## Unbounded fields\n", *(loose or ["None."])]
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m planner.bounds", description=__doc__.split("\n")[0])
    group = p.add_mutually_exclusive_group()
    group.add_argument("--write", metavar="FILE", help="write the document to FILE")
    group.add_argument("--check", metavar="FILE", help="exit 1 unless FILE is current")
    args = p.parse_args(argv)
    text = render()
    if args.write:
        Path(args.write).write_text(text, encoding="utf-8")
    elif args.check:
        try:
            current = Path(args.check).read_text(encoding="utf-8") == text
        except OSError:
            current = False
        if not current:
            print(f"{args.check} is not current: run python -m planner.bounds --write "
                  f"{args.check}", file=sys.stderr)
            return 1
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
