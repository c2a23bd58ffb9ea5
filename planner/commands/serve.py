"""`hulk-planner serve`: the gRPC server agents report to, with its SQLite store."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import grpc

from hulk.errors import ConfigError
from hulk.lease import lease_for
from hulk.validate import Bound, located
from hulk.metrics import parse_metrics_address, start_metrics_server
from hulk.wire.broker import check_name, parse_broker_url
from hulk.wire.records import ProbeSettings
from planner.gnn.online import (ACTIVE_NAME, RESULTS_NAME, RetrainConfig, Retrainer, append_result,
                                retrain_on_change, seed_active_checkpoint)
from planner.security.credentials import CredentialStore
from planner.security.guard import NodeGuard, RateLimit
from planner.security.tls import server_credentials
from planner.service.database import refuse_foreign_file
from planner.service.metrics import NO_EVENTS, PlannerMetrics, ServeEvents, StoreReader
from planner.service.runtime import BackgroundTask, PlannerRuntime
from planner.service.peer_plan import ProbePlanSettings
from planner.settings import DAYS, PROBE_EPOCH, PROBE_PEERS, PROBE_SITE_REPS, PlannerSettings

if TYPE_CHECKING:
    from hulk.wire.signing import Signer

log = logging.getLogger(__name__)
DASHBOARD_REFRESH_S = 2.0   # how often the dashboard's documents are rebuilt from the store


def register(subparsers: argparse._SubParsersAction, settings: PlannerSettings) -> None:
    p = subparsers.add_parser("serve", help="serve agents over gRPC and keep the fleet store",
                              description=__doc__)
    p.add_argument("--db", default=settings.db, help="SQLite store path (HULK_DB)")
    p.add_argument("--listen", default=settings.listen,
                   help="HOST:PORT to serve gRPC on (HULK_LISTEN; default 0.0.0.0:50051)")
    p.add_argument("--insecure", action="store_true", default=settings.insecure,
                   help="plaintext gRPC (HULK_INSECURE=1); anyone on the path can forge reports")
    p.add_argument("--tls-cert", type=Path, help="server certificate (PEM) for TLS")
    p.add_argument("--tls-key", type=Path, help="server private key (PEM) for TLS")
    p.add_argument("--client-ca", type=Path,
                   help="CA (PEM) whose client certificates are required (mutual TLS, optional)")
    p.add_argument("--rate-limit", type=float, default=RateLimit.per_second,
                   help=f"gRPC calls per second per node (default {RateLimit.per_second:g})")
    p.add_argument("--rate-burst", type=float, default=RateLimit.burst,
                   help=f"calls a node may make at once above its rate (default {RateLimit.burst:g})")
    p.add_argument("--raw-days", type=int, default=settings.raw_days,
                   help="days raw samples are kept (HULK_RAW_DAYS; default 7)")
    p.add_argument("--window-days", type=int, default=settings.window_days,
                   help="rolling window in days (HULK_WINDOW_DAYS; default 90)")
    p.add_argument("--fleet-name", default=settings.fleet,
                   help="fleet name used in MQTT topics: 1-128 letters, digits, '.', '_' or '-' "
                        "(HULK_FLEET)")
    # The probe plan: whom each agent probes (planner/core/probe_plan.py).
    p.add_argument("--probe-peers", type=int, default=settings.probe_peers, metavar="N",
                   help="most peers each agent probes: its site's nodes and a few of every other "
                        f"site (HULK_PROBE_PEERS; default {settings.probe_peers})")
    p.add_argument("--probe-site-reps", type=int, default=settings.probe_site_reps, metavar="K",
                   help="probes per ordered pair of sites per epoch (HULK_PROBE_SITE_REPS; "
                        f"default {settings.probe_site_reps})")
    p.add_argument("--probe-epoch", type=float, default=settings.probe_epoch_s, metavar="SECONDS",
                   help="how often each agent's peers rotate (HULK_PROBE_EPOCH; default "
                        f"{settings.probe_epoch_s:g})")
    p.add_argument("--rollup-seconds", type=float, default=30.0,
                   help="how often raw samples are folded into the daily rollups (default 30)")
    p.add_argument("--metrics", metavar="HOST:PORT",
                   help="serve Prometheus metrics at http://HOST:PORT/metrics (off by default; "
                        "docs/METRICS.md)")
    p.add_argument("--report-seconds", type=float, default=0.0, metavar="SECONDS",
                   help="agents send a Report at most this often (default, 0: automatic, "
                        "their own 5 s up to 100 agents, then agents/20 s so the fleet sends "
                        "about 20 Reports a second, at most 600 s)")
    # Throughput tests between sites (planner/service/throughput.py).
    p.add_argument("--throughput-tests", action=argparse.BooleanOptionalAction, default=True,
                   help="schedule throughput tests between agents that offer a throughput port; "
                        "measured Gbit/s replaces the formula's bandwidth (default on)")
    p.add_argument("--throughput-period", type=float, default=6 * 3600.0, metavar="SECONDS",
                   help="each directed site pair is tested once per period (default 21600)")
    p.add_argument("--throughput-budget-gb", type=float, default=200.0, metavar="GB",
                   help="bytes all throughput tests may move a day, in GB (default 200)")
    p.add_argument("--throughput-on-busy", action="store_true",
                   help="let throughput tests use servers of running jobs (default: idle ones)")
    # The calibrated cost model serve plans with (planner/service/calibration_refit.py).
    p.add_argument("--calibration-interval", type=float, default=600.0, metavar="SECONDS",
                   help="refit the cost model to the step times jobs report and the throughput "
                        "tests, and check the link model of unmeasured site pairs, every SECONDS "
                        "and plan with them (default 600; 0: plan with the reference model)")
    # Recovery: re-plan the jobs of nodes that go silent.
    p.add_argument("--mqtt", metavar="URL", default=settings.mqtt,
                   help="broker mqtt://[user:pass@]HOST:PORT (HULK_MQTT): re-plan and push "
                        "placements when a node of the current plan goes silent")
    p.add_argument("--signing-key", metavar="FILE", default=settings.signing_key,
                   help="Ed25519 key that signs placements (HULK_SIGNING_KEY; needed with --mqtt)")
    p.add_argument("--previous-placement-key", metavar="KEY_OR_FILE", action="append",
                   default=list(settings.previous_placement_key),
                   help="a public key (ed25519:... or a .pub file) the signing key replaced: the "
                        "retained plan it signed is trusted and re-signed with the new key "
                        "(repeatable; added to HULK_PREVIOUS_PLACEMENT_KEY; see deploy/INSTALL.md, "
                        "'Rotating the placement-signing key')")
    p.add_argument("--node-timeout", type=float, default=30.0, metavar="SECONDS",
                   help="a node silent this long is down; its jobs are re-planned (default 30). "
                        "Its jobs' processes stop by themselves before then (the node lease, "
                        "docs/JOBS.md)")
    p.add_argument("--recovery-interval", type=float, default=None, metavar="SECONDS",
                   help="seconds between checks for silent nodes (default: a third of --node-timeout)")
    p.add_argument("--jobs-interval", type=float, default=2.0, metavar="SECONDS",
                   help="seconds between job lifecycle rounds: start queued jobs, follow running "
                        "ones, retire finished and cancelled ones (`hulk-planner jobs`; default 2)")
    # The GNN: re-plan with it and fine-tune it as the fleet changes.
    retrain = RetrainConfig()
    p.add_argument("--model-dir", type=Path, metavar="DIR",
                   help=f"folder of the active GNN checkpoint ({ACTIVE_NAME}, seeded from the "
                        "shipped one or HULK_MODEL; the replaced one is kept as *.prev.pt). "
                        "With it, re-planning uses the GNN and it is fine-tuned as the fleet changes")
    p.add_argument("--retrain", action=argparse.BooleanOptionalAction, default=None,
                   help="fine-tune the GNN in the background when the fleet changes "
                        "(default: on when --model-dir is given)")
    p.add_argument("--retrain-check-interval", type=float, default=300.0, metavar="SECONDS",
                   help="seconds between fleet-change checks (default 300)")
    p.add_argument("--retrain-job-sets", type=int, default=retrain.job_sets, metavar="N",
                   help=f"teacher-labelled job sets per fine-tuning run (default {retrain.job_sets})")
    p.add_argument("--retrain-epochs", type=int, default=retrain.epochs, metavar="E",
                   help=f"epochs per fine-tuning run (default {retrain.epochs})")
    p.add_argument("--retrain-teacher-budget", type=float, default=retrain.teacher_budget_s,
                   metavar="SECONDS",
                   help=f"search-planner budget per teacher label (default {retrain.teacher_budget_s:g})")
    # The read-only web dashboard (planner/dashboard/).
    p.add_argument("--dashboard", metavar="HOST:PORT",
                   help="serve the fleet dashboard (map, nodes, jobs, the last plan's comparison) "
                        "at http(s)://HOST:PORT/; HTTPS with --tls-cert. Off by default; an address "
                        "other than loopback needs --dashboard-token")
    p.add_argument("--dashboard-token", metavar="FILE", type=Path,
                   help="file (mode 0600) whose first line is the operator token the dashboard "
                        "asks for: the password of basic authentication (any user name) or a "
                        "bearer token")
    p.set_defaults(func=run)


# ----------------------------------------------------------------------------------- checks

# Bounds of serve's numeric flags (the probe plan's are the settings').
RATE_LIMIT = Bound(0.001, 1e6, "calls per second")
RATE_BURST = Bound(1, 1e6, "calls")
REPORT_SECONDS = Bound(0.1, 3600.0, "seconds")      # or 0: automatic
PERIOD = Bound(0.1, 86400.0, "seconds")   # rollups, rounds, checks: under 0.1 s they spin a core
NODE_TIMEOUT = Bound(0.1, 7 * 86400.0, "seconds")
THROUGHPUT_PERIOD = Bound(60.0, 30 * 86400.0, "seconds")
THROUGHPUT_BUDGET = Bound(0.0, 1e6, "GB")
RETRAIN_JOB_SETS = Bound(2, 100_000, "job sets", integer=True)
RETRAIN_EPOCHS = Bound(1, 100_000, "epochs", integer=True)


@dataclass(frozen=True)
class ServeFlags:
    """What checking serve's flags loaded besides the flags themselves."""

    signer: Signer | None = None     # the placement-signing key, with --mqtt


def check_flags(args: argparse.Namespace) -> ServeFlags:
    """Every bad flag value as a one-line ConfigError naming the flag, before anything is
    opened; ``args`` is left as parsed."""
    if not args.db:
        raise ConfigError("expected a store path", field="--db")
    check_name(args.fleet_name, "--fleet-name")      # a level of every MQTT topic
    _check_numbers(args)
    if getattr(args, "metrics", None):
        parse_metrics_address(args.metrics, field="--metrics")
    if getattr(args, "dashboard_token", None) and not getattr(args, "dashboard", None):
        raise ConfigError("--dashboard-token needs --dashboard HOST:PORT", field="--dashboard-token")
    _check_gnn(args)
    return ServeFlags(signer=_recovery_signer(args))


def _bounded(flag: str, bound: Bound, value: object) -> None:
    with located(ConfigError, field=flag):
        bound.check(value)


# Every numeric flag and its bound (docs/BOUNDS.md is rendered from this table). The
# --retrain- flags are checked only with --model-dir; --report-seconds and
# --calibration-interval also take 0 (automatic, off), --recovery-interval may be left out.
FLAG_BOUNDS: dict[str, Bound] = {
    "--raw-days": DAYS, "--window-days": DAYS, "--rate-limit": RATE_LIMIT,
    "--rate-burst": RATE_BURST, "--probe-peers": PROBE_PEERS,
    "--probe-site-reps": PROBE_SITE_REPS, "--probe-epoch": PROBE_EPOCH,
    "--rollup-seconds": PERIOD, "--node-timeout": NODE_TIMEOUT, "--jobs-interval": PERIOD,
    "--throughput-period": THROUGHPUT_PERIOD, "--throughput-budget-gb": THROUGHPUT_BUDGET,
    "--retrain-check-interval": PERIOD, "--retrain-teacher-budget": PERIOD,
    "--retrain-job-sets": RETRAIN_JOB_SETS, "--retrain-epochs": RETRAIN_EPOCHS,
    "--report-seconds": REPORT_SECONDS, "--recovery-interval": PERIOD,
    "--calibration-interval": PERIOD,
}
_ZERO_OR_ABSENT = {"--report-seconds": 0, "--recovery-interval": None,
                   "--calibration-interval": 0}
_DEFAULTS = {"--jobs-interval": 2.0, "--throughput-period": 6 * 3600.0,
             "--throughput-budget-gb": 200.0, "--calibration-interval": 0.0}


def _check_numbers(args: argparse.Namespace) -> None:
    for flag, bound in FLAG_BOUNDS.items():
        if flag.startswith("--retrain-"):
            continue   # _check_gnn's, only with --retrain-every
        value = getattr(args, flag[2:].replace("-", "_"), _DEFAULTS.get(flag))
        if flag in _ZERO_OR_ABSENT and value == _ZERO_OR_ABSENT[flag]:
            continue
        _bounded(flag, bound, value)


def _recovery_signer(args: argparse.Namespace) -> Signer | None:
    """With --mqtt: the broker URL checked and the signing key loaded."""
    if not args.mqtt:
        return None
    parse_broker_url(args.mqtt, source="--mqtt")
    from planner.security.signing import load_signer
    return load_signer(args.signing_key, "--signing-key",
                       previous=getattr(args, "previous_placement_key", None))


def _check_gnn(args: argparse.Namespace) -> None:
    if args.model_dir is None:
        if args.retrain:
            raise ConfigError("--retrain needs --model-dir (where the fine-tuned checkpoint goes)",
                              field="--retrain")
        return
    if args.model_dir.exists() and not args.model_dir.is_dir():
        raise ConfigError(f"{args.model_dir}: expected a folder", field="--model-dir")
    for flag in ("--retrain-check-interval", "--retrain-teacher-budget", "--retrain-job-sets",
                 "--retrain-epochs"):
        _bounded(flag, FLAG_BOUNDS[flag], getattr(args, flag[2:].replace("-", "_")))


def credentials_from_args(args: argparse.Namespace) -> grpc.ServerCredentials | None:
    if args.tls_cert or args.tls_key:
        if not (args.tls_cert and args.tls_key):
            raise ConfigError("give both --tls-cert and --tls-key", field="--tls-cert")
        return server_credentials(args.tls_cert, args.tls_key, args.client_ca)
    if args.client_ca:
        raise ConfigError("--client-ca needs --tls-cert and --tls-key", field="--client-ca")
    if not args.insecure:
        raise ConfigError("no TLS certificate given: pass --tls-cert and --tls-key, or "
                          "--insecure for plaintext gRPC (trusted networks only)",
                          field="--insecure")
    return None


# ----------------------------------------------------------------------------------- building

def build_runtime(args: argparse.Namespace, events: ServeEvents = NO_EVENTS) -> PlannerRuntime:
    credentials = credentials_from_args(args)
    # TLS: every call needs an enrolled node's token and is rate-limited per node;
    # --insecure (lab only): no authentication, no per-node limits (node ids are unproven there).
    rate = RateLimit(args.rate_limit, args.rate_burst)
    if credentials is not None:
        refuse_foreign_file(args.db)     # the credential table would be written into it first
    guards = [] if credentials is None else [NodeGuard(CredentialStore(args.db), rate_limit=rate)]
    return PlannerRuntime(args.db, args.listen, fleet=args.fleet_name, credentials=credentials,
                          interceptors=guards, raw_days=args.raw_days,
                          window_days=args.window_days, rollup_interval_s=args.rollup_seconds,
                          settings=ProbeSettings(report_interval_s=args.report_seconds),
                          events=events,
                          probe=ProbePlanSettings(args.probe_peers, args.probe_site_reps,
                                                  args.probe_epoch))


def add_gnn(runtime: PlannerRuntime, args: argparse.Namespace) -> Path | None:
    """With --model-dir: the active checkpoint (seeded when absent) and, unless --no-retrain,
    the background fine-tuning task. Returns the active checkpoint (None without --model-dir)."""
    if args.model_dir is None:
        return None
    active = seed_active_checkpoint(args.model_dir / ACTIVE_NAME)
    if args.retrain is False:
        log.info("GNN: planning with %s; fine-tuning off (--no-retrain)", active)
        return active
    from planner.service.graph import fleet_from_store  # networkx: only serve --model-dir needs it

    results = args.model_dir / RESULTS_NAME
    config = RetrainConfig(job_sets=args.retrain_job_sets, epochs=args.retrain_epochs,
                           teacher_budget_s=args.retrain_teacher_budget)
    retrainer = Retrainer(active, config=config,
                          on_result=lambda result: append_result(results, result))
    check = retrain_on_change(
        lambda: fleet_from_store(runtime.store, runtime.window_days, runtime.fleet), retrainer)
    # The check reads the store, so it runs on the store's thread (fine-tuning has its own).
    runtime.add_task(BackgroundTask("gnn-retrain", check, args.retrain_check_interval,
                                    in_store_thread=True, run_at_start=True))
    log.info("GNN: planning with %s; fine-tuning when the fleet changes (checked every %.0f s, "
             "results in %s)", active, args.retrain_check_interval, results)
    return active


def serve_options(runtime: PlannerRuntime, args: argparse.Namespace):
    """The lifecycle's, recovery's and throughput tests' settings from the flags."""
    from planner.service.seams import ServeOptions

    return ServeOptions(fleet=runtime.fleet, node_timeout_s=args.node_timeout,
                        throughput_tests=getattr(args, "throughput_tests", True),
                        throughput_period_s=getattr(args, "throughput_period", 6 * 3600.0),
                        throughput_budget_gb=getattr(args, "throughput_budget_gb", 200.0),
                        throughput_on_busy=getattr(args, "throughput_on_busy", False),
                        calibration_interval_s=getattr(args, "calibration_interval", 600.0))


def add_throughput(runtime: PlannerRuntime, args: argparse.Namespace) -> None:
    """Unless --no-throughput-tests: plan throughput tests, hand their slots out by heartbeat."""
    from planner.service.throughput import add_to_runtime

    add_to_runtime(runtime, serve_options(runtime, args))


def add_calibration(runtime: PlannerRuntime, args: argparse.Namespace):
    """With --mqtt and a --calibration-interval: the refit task; None otherwise (nothing plans
    without --mqtt)."""
    if not args.mqtt:
        return None
    from planner.service.calibration_refit import add_to_runtime

    return add_to_runtime(runtime, serve_options(runtime, args))


def add_link_model(runtime: PlannerRuntime, args: argparse.Namespace, dashboard):
    """With --mqtt or --dashboard and a --calibration-interval: the link model that predicts
    unmeasured site pairs (planner/service/link_model.py); None otherwise."""
    if not (args.mqtt or dashboard is not None):
        return None
    from planner.service.link_model import add_to_runtime

    return add_to_runtime(runtime, serve_options(runtime, args),
                          dashboard_state=dashboard.state if dashboard is not None else None)


def add_recovery(runtime: PlannerRuntime, args: argparse.Namespace, active: Path | None,
                 signer: Signer | None, calibration=None, links=None) -> None:
    """With --mqtt: re-plan (with the GNN when there is a model dir) the jobs of silent nodes,
    and run the job lifecycle (`hulk-planner jobs`) and reconciliation (lost placements sent
    again, unplanned processes stopped) next to it, on the network ``calibration`` (serve's
    ServeCalibration, None: the reference model) calibrates."""
    if not args.mqtt:
        return
    # Imported here: it loads the search planner, which other commands need not wait for.
    from planner.service.lifecycle import add_to_runtime as add_lifecycle
    from planner.service.reconcile import add_to_runtime as add_reconcile
    from planner.service.recovery import add_to_runtime

    from planner.methods import serve_planner

    search = serve_planner(checkpoint=active)   # the GNN, when given, adds a start
    replanner = add_to_runtime(
        runtime, broker=parse_broker_url(args.mqtt, source="--mqtt"),
        options=serve_options(runtime, args),
        interval_s=args.recovery_interval or max(0.5, args.node_timeout / 3), planner=search,
        signer=signer, calibrate=calibration.apply if calibration is not None else None,
        links=links.prediction if links is not None else None)
    jobs_interval = getattr(args, "jobs_interval", 2.0)
    add_lifecycle(runtime, replanner, interval_s=jobs_interval, planner=search)
    add_reconcile(runtime, replanner, interval_s=jobs_interval)


def build_dashboard(args: argparse.Namespace):
    """With --dashboard: the dashboard's server, bound (a bad address, a port in use or a public
    address without --dashboard-token is a ConfigError here, before serve opens anything)."""
    if not getattr(args, "dashboard", None):
        return None
    from planner.dashboard.server import DashboardServer, TokenCheck, tls_context
    from planner.dashboard.snapshot import DashboardState

    token = TokenCheck.from_file(args.dashboard_token) if args.dashboard_token else None
    tls = None
    if args.tls_cert and args.tls_key:   # the gRPC server's certificate (and client CA), as there
        tls = tls_context(args.tls_cert, args.tls_key, args.client_ca)
    state = DashboardState(fleet=args.fleet_name, node_timeout_s=args.node_timeout,
                           window_days=args.window_days)
    return DashboardServer(args.dashboard, state, token=token, tls=tls)


def add_dashboard(runtime: PlannerRuntime, dashboard) -> None:
    """The dashboard's documents, rebuilt every DASHBOARD_REFRESH_S: read on the store's thread,
    built on another (a large fleet's links take seconds to merge)."""
    if dashboard is None:
        return

    async def refresh() -> str:
        read = await runtime.in_store(dashboard.state.read, runtime.store)
        return await asyncio.to_thread(dashboard.state.build, read)

    runtime.add_task(BackgroundTask("dashboard", refresh, DASHBOARD_REFRESH_S,
                                    in_store_thread=False, run_at_start=True, retry_s=10.0))


# ----------------------------------------------------------------------------------- running

async def serve(runtime: PlannerRuntime, dashboard=None) -> None:
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
    if dashboard is not None:
        dashboard.start()
        auth = "token" if dashboard.token is not None else "no authentication, loopback only"
        print(f"hulk-planner: dashboard at {dashboard.url} ({auth})", flush=True)
    print(f"hulk-planner: listening on {host}:{port} ({mode}), store {runtime.db_path}, "
          f"fleet {runtime.fleet}", flush=True)
    try:
        await runtime.wait_stopped()
    finally:
        log.info("stopping")
        if dashboard is not None:
            await asyncio.to_thread(dashboard.stop)
        await runtime.stop()
        print("hulk-planner: stopped", flush=True)


def watch_fleet(metrics: PlannerMetrics, runtime: PlannerRuntime, node_timeout_s: float) -> None:
    """Export the fleet's state from the store, read on the store's thread at scrape time."""
    reader = StoreReader(runtime.store, node_timeout_s=node_timeout_s)

    def read():
        return runtime.store_executor.submit(reader).result(timeout=10)
    metrics.watch_fleet(read)


def run(args: argparse.Namespace) -> int:
    flags = check_flags(args)
    from planner.service.serve_lock import ServeLock
    with ServeLock(args.db):   # one serve per store: a second would place every job twice
        return _run(args, flags)


def _run(args: argparse.Namespace, flags: ServeFlags) -> int:
    from planner.security.guard import quiet_peer_encoding_errors

    quiet_peer_encoding_errors()     # a peer's undecodable header is no traceback in the log
    metrics = endpoint = None
    if getattr(args, "metrics", None):  # bound first: a port in use ends serve before the store opens
        metrics = PlannerMetrics(fleet=args.fleet_name)
        endpoint = start_metrics_server(args.metrics, metrics.registry, field="--metrics")
        print(f"hulk-planner: metrics on {endpoint.url}", flush=True)
    dashboard = None
    try:
        dashboard = build_dashboard(args)
        runtime = build_runtime(args, metrics or NO_EVENTS)
        # Every heartbeat answer grants the node lease: its jobs stop by themselves before this
        # serve could re-place them (hulk/lease.py, docs/JOBS.md "Fencing").
        runtime.service.lease_s = lease_for(args.node_timeout)
        if metrics is not None:
            watch_fleet(metrics, runtime, args.node_timeout)
        add_throughput(runtime, args)
        add_recovery(runtime, args, add_gnn(runtime, args), flags.signer,
                     add_calibration(runtime, args), add_link_model(runtime, args, dashboard))
        add_dashboard(runtime, dashboard)
        asyncio.run(serve(runtime, dashboard))
    finally:
        if dashboard is not None:
            dashboard.close()
        if endpoint is not None:
            endpoint.close()
    return 0
