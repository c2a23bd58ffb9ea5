"""Every HULK_* environment variable, in one place.

Components read their variables only through :func:`env`, so this table is the complete list.
Each program validates its own on load, with the parsers of :mod:`hulk.validate`: the agent's in
``agent.config.AgentConfig``, the planner's in ``planner.settings.PlannerSettings`` (HULK_MODEL
where the GNN checkpoint is loaded); a bad value is a one-line ConfigError naming the variable.
Precedence everywhere: command-line flag > environment variable > config file > default.
"""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class EnvVar:
    name: str
    used_by: str
    meaning: str


ENV_VARS: dict[str, EnvVar] = {v.name: v for v in [
    # agent
    EnvVar("HULK_PLANNER", "agent", "planner address HOST:PORT"),
    EnvVar("HULK_NODE_ID", "agent", "this node's id"),
    EnvVar("HULK_ADDRESS", "agent", "address peers probe (default: the outgoing interface's)"),
    EnvVar("HULK_CITY", "agent", "city name from the gazetteer"),
    EnvVar("HULK_SITE", "agent", "this node's site: data centre, cloud region or city (default: its city)"),
    EnvVar("HULK_INTERVAL", "agent", "seconds between probe rounds to each peer"),
    EnvVar("HULK_STATE_DIR", "agent", "directory for the spool and placements"),
    EnvVar("HULK_CONFIG", "agent", "path of the agent's YAML config file"),
    EnvVar("HULK_INSECURE", "agent, planner", "1 (true/yes/on) for plaintext gRPC (warned about)"),
    EnvVar("HULK_TOKEN", "agent", "the node's enrolment token for gRPC"),
    EnvVar("HULK_CA", "agent", "CA certificate to verify the planner"),
    EnvVar("HULK_CLIENT_CERT", "agent", "this node's client certificate (PEM) for a planner run with --client-ca"),
    EnvVar("HULK_CLIENT_KEY", "agent", "the private key (PEM) of HULK_CLIENT_CERT"),
    EnvVar("HULK_MQTT", "agent, planner", "broker URL mqtt://[user:pass@]HOST:PORT, or "
           "mqtts://...[?ca=PATH][&cert=PATH&key=PATH] (TLS; cert/key: a client certificate)"),
    EnvVar("HULK_SPOOL_MAX", "agent", "most samples the spool keeps before dropping the oldest"),
    EnvVar("HULK_LOG_LEVEL", "agent, planner", "DEBUG, INFO, WARNING or ERROR"),
    EnvVar("HULK_PROBE_PORT", "agent", "TCP port this agent listens on for peers' connect probes (0: none)"),
    EnvVar("HULK_THROUGHPUT_PORT", "agent", "TCP port this agent receives throughput tests on, at times the planner sets (0: none)"),
    EnvVar("HULK_PACKETS_PER_ROUND", "agent", "probe packets per round to each peer"),
    EnvVar("HULK_PROBE_TIMEOUT", "agent", "seconds to wait for each probe's reply"),
    EnvVar("HULK_PAYLOAD_BYTES", "agent", "ICMP payload bytes (56 gives a 64-byte ICMP message)"),
    EnvVar("HULK_MAX_CONCURRENCY", "agent", "most probe rounds in flight at once"),
    EnvVar("HULK_MAX_PROBE_RATE", "agent", "most probe packets per second (default 10); a longer peer list stretches the interval"),
    EnvVar("HULK_TORCHRUN", "agent", "torchrun executable that launches placed jobs (default: beside python)"),
    EnvVar("HULK_JOB_SCOPE", "agent", "auto, systemd or session: whether jobs run in a systemd scope outside the agent's (default auto)"),
    EnvVar("HULK_PLACEMENT_KEY", "agent", "pinned placement-signing public key (ed25519:... or .pub file)"),
    EnvVar("HULK_ALLOWED_COMMANDS", "agent", "commands placements may run: argv prefixes, separated by ';'"),
    EnvVar("HULK_METRICS", "agent", "HOST:PORT to serve Prometheus metrics on (/metrics; unset: off)"),
    EnvVar("HULK_DECLARED_GPUS", "agent", "labs and tests: GPUs to report instead of NVML's, COUNTxNAME:GB (unset: off)"),
    EnvVar("HULK_PASS_ENV", "agent", "variables jobs get besides HULK_*, PATH, HOME, LANG (a,b)"),
    # planner
    EnvVar("HULK_DB", "planner", "path of the planner's SQLite store"),
    EnvVar("HULK_LISTEN", "planner", "HOST:PORT the planner serves gRPC on"),
    EnvVar("HULK_FLEET", "planner, agent", "fleet name used in MQTT topics (default 'default')"),
    EnvVar("HULK_RAW_DAYS", "planner", "days raw samples are kept (default 7)"),
    EnvVar("HULK_WINDOW_DAYS", "planner", "rolling window in days (default 90)"),
    EnvVar("HULK_MODEL", "planner", "GNN checkpoint to use instead of the shipped one"),
    EnvVar("HULK_SIGNING_KEY", "planner", "Ed25519 key that signs placements (from enroll --init-ca)"),
    EnvVar("HULK_PREVIOUS_PLACEMENT_KEY", "planner", "public keys the signing key replaced "
           "(ed25519:... or .pub files, a,b): serve re-signs what they signed"),
    EnvVar("HULK_PROBE_PEERS", "planner", "most peers each agent probes (default 64; the probe plan)"),
    EnvVar("HULK_PROBE_SITE_REPS", "planner", "probes per ordered site pair per epoch (default 2)"),
    EnvVar("HULK_PROBE_EPOCH", "planner", "seconds between rotations of each agent's peers (default 600)"),
    # the training process an agent launches
    EnvVar("HULK_PLAN_ID", "launched job", "plan id of the placement"),
    EnvVar("HULK_JOB", "launched job", "job name"),
    EnvVar("HULK_STAGE", "launched job", "this node's pipeline stage index"),
    EnvVar("HULK_NUM_STAGES", "launched job", "number of pipeline stages"),
    EnvVar("HULK_LAYER_LO", "launched job", "first layer of this stage"),
    EnvVar("HULK_LAYER_HI", "launched job", "one past the last layer of this stage"),
    EnvVar("HULK_REPLICA", "launched job", "this node's data-parallel replica index"),
    EnvVar("HULK_NUM_REPLICAS", "launched job", "number of replicas"),
    EnvVar("HULK_MICRO_BATCH", "launched job", "micro-batch size"),
    EnvVar("HULK_RANK", "launched job", "this node's rank in the job: stage * num_replicas + replica"),
    EnvVar("HULK_WORLD_SIZE", "launched job", "nodes in the job: num_stages * num_replicas"),
    EnvVar("HULK_RDZV_ADDRESS", "launched job", "rendezvous address (the rank-0 node's)"),
    EnvVar("HULK_RDZV_PORT", "launched job", "rendezvous port of the job"),
    EnvVar("HULK_MICRO_BATCHES", "launched job",
           "micro-batches per replica per optimizer step (the plan's m)"),
    EnvVar("HULK_CHECKPOINT_DIR", "launched job", "the job's checkpoint_dir (relative: to its working "
           "directory; empty: none)"),
    EnvVar("HULK_RESTART_COUNT", "launched job", "times the job has been placed again (0 the first time)"),
    EnvVar("HULK_PROGRESS_FILE", "launched job", "absolute path where the job appends one JSON line "
           "per step (docs/JOBS.md); unset: nowhere to report"),
    EnvVar("HULK_SYNC", "launched job", "step (gradients averaged every step) or diloco "
           "(islands; an outer sync every HULK_INNER_STEPS steps)"),
    EnvVar("HULK_INNER_STEPS", "launched job", "diloco: inner steps between outer syncs (H)"),
    EnvVar("HULK_OUTER_COMPRESSION", "launched job", "diloco: the pseudo-gradients' wire format: "
           "none (fp32), bf16 or int8"),
    EnvVar("HULK_STREAMING_FRAGMENTS", "launched job", "diloco: fragments synced at staggered "
           "times (0: the whole model at once)"),
    EnvVar("HULK_ISLAND", "launched job", "diloco: this node's island (a block of replicas)"),
    EnvVar("HULK_NUM_ISLANDS", "launched job", "diloco: islands in the job"),
]}


def env(name: str, default: str | None = None) -> str | None:
    """Read a HULK_* variable; only names listed in ENV_VARS may be read."""
    if name not in ENV_VARS:
        raise KeyError(f"{name} is not listed in hulk.settings.ENV_VARS")
    value = os.environ.get(name)
    return value if value not in (None, "") else default
