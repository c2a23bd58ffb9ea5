"""`hulk-planner serve`: the gRPC server agents report to, with its SQLite store."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
from pathlib import Path

import grpc

from hulk.errors import ConfigError
from hulk.settings import env
from planner.security.credentials import CredentialStore
from planner.security.guard import NodeGuard, RateLimit
from planner.service.runtime import PlannerRuntime
from planner.security.tls import server_credentials

log = logging.getLogger(__name__)


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("serve", help="serve agents over gRPC and keep the fleet store",
                              description=__doc__)
    p.add_argument("--db", default=env("HULK_DB"), help="SQLite store path (HULK_DB)")
    p.add_argument("--listen", default=env("HULK_LISTEN", "0.0.0.0:50051"),
                   help="HOST:PORT to serve gRPC on (HULK_LISTEN; default 0.0.0.0:50051)")
    p.add_argument("--insecure", action="store_true",
                   default=env("HULK_INSECURE", "0") in ("1", "true", "yes"),
                   help="plaintext gRPC (HULK_INSECURE=1); anyone on the path can forge reports")
    p.add_argument("--tls-cert", type=Path, help="server certificate (PEM) for TLS")
    p.add_argument("--tls-key", type=Path, help="server private key (PEM) for TLS")
    p.add_argument("--client-ca", type=Path,
                   help="CA (PEM) whose client certificates are required (mutual TLS, optional)")
    p.add_argument("--rate-limit", type=float, default=RateLimit.per_second,
                   help=f"gRPC calls per second per node (default {RateLimit.per_second:g})")
    p.add_argument("--rate-burst", type=float, default=RateLimit.burst,
                   help=f"calls a node may make at once above its rate (default {RateLimit.burst:g})")
    p.add_argument("--raw-days", type=int, default=int(env("HULK_RAW_DAYS", "7")),
                   help="days raw samples are kept (HULK_RAW_DAYS; default 7)")
    p.add_argument("--window-days", type=int, default=int(env("HULK_WINDOW_DAYS", "90")),
                   help="rolling window in days (HULK_WINDOW_DAYS; default 90)")
    p.add_argument("--fleet-name", default=env("HULK_FLEET", "default"),
                   help="fleet name used in MQTT topics (HULK_FLEET)")
    p.add_argument("--rollup-seconds", type=float, default=30.0,
                   help="how often raw samples are folded into the daily rollups (default 30)")
    from planner.service.recovery import add_serve_arguments  # --mqtt, --node-timeout (issue 5)

    add_serve_arguments(p)
    from planner.gnn.online import add_serve_arguments as add_gnn_arguments  # --model-dir, --retrain

    add_gnn_arguments(p)
    p.set_defaults(func=run)


def credentials_from_args(args: argparse.Namespace) -> grpc.ServerCredentials | None:
    if args.tls_cert or args.tls_key:
        if not (args.tls_cert and args.tls_key):
            raise ConfigError("give both --tls-cert and --tls-key", field="--tls-cert")
        return server_credentials(args.tls_cert, args.tls_key, getattr(args, "client_ca", None))
    if getattr(args, "client_ca", None):
        raise ConfigError("--client-ca needs --tls-cert and --tls-key", field="--client-ca")
    if not args.insecure:
        raise ConfigError("no TLS certificate given: pass --tls-cert and --tls-key, or "
                          "--insecure for plaintext gRPC (trusted networks only)",
                          field="--insecure")
    return None


def build_runtime(args: argparse.Namespace) -> PlannerRuntime:
    if not args.db:
        raise ConfigError("expected a store path", field="--db")
    if args.raw_days < 1:
        raise ConfigError(f"expected at least 1 day, got {args.raw_days}", field="--raw-days")
    if args.window_days < 1:
        raise ConfigError(f"expected at least 1 day, got {args.window_days}",
                          field="--window-days")
    credentials = credentials_from_args(args)
    # TLS: every call needs an enrolled node's token and is rate-limited per node;
    # --insecure (lab only): no authentication, no per-node limits (node ids are unproven there).
    rate = RateLimit(getattr(args, "rate_limit", RateLimit.per_second),
                     getattr(args, "rate_burst", RateLimit.burst))
    if rate.per_second <= 0 or rate.burst < 1:
        raise ConfigError("expected --rate-limit > 0 and --rate-burst >= 1", field="--rate-limit")
    guards = [] if credentials is None else [NodeGuard(CredentialStore(args.db), rate_limit=rate)]
    return PlannerRuntime(args.db, args.listen, fleet=args.fleet_name, credentials=credentials,
                          interceptors=guards,
                          raw_days=args.raw_days, window_days=args.window_days)


async def serve(runtime: PlannerRuntime) -> None:
    try:
        port = await runtime.start()
    except BaseException:
        await runtime.stop(grace_s=0)
        raise
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, runtime.request_stop)
    host = runtime.listen.rsplit(":", 1)[0]
    mode = "plaintext" if runtime.credentials is None else "TLS"
    if runtime.credentials is None:
        log.warning("serving plaintext gRPC without authentication (--insecure): anyone who "
                    "can reach %s can report as any node", runtime.listen)
    print(f"hulk-planner: listening on {host}:{port} ({mode}), store {runtime.db_path}, "
          f"fleet {runtime.fleet}", flush=True)
    try:
        await runtime.wait_stopped()
    finally:
        log.info("stopping")
        await runtime.stop()
        print("hulk-planner: stopped", flush=True)


def run(args: argparse.Namespace) -> int:
    runtime = build_runtime(args)
    from planner.gnn.online import add_to_runtime as add_gnn, serve_search
    from planner.service.recovery import add_to_runtime  # re-plan silent nodes' jobs when --mqtt is set

    # With --model-dir: re-planning uses the active GNN checkpoint, fine-tuned as the fleet changes.
    active = add_gnn(runtime, args)
    add_to_runtime(runtime, args, search=serve_search(active))
    asyncio.run(serve(runtime))
    return 0
