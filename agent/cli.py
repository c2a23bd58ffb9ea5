"""hulk-agent: the command line.

Errors print one line, ``hulk-agent: <message>``, to stderr (never a traceback) and exit with
the error's code (2 for bad input or settings).
"""

from __future__ import annotations

import argparse
import asyncio
import errno
import logging
import signal
import sys
from collections.abc import Sequence

from agent import __version__
from agent.config import PROBE_DEFAULTS, AgentConfig, load_config
from hulk.errors import HulkError

PROG = "hulk-agent"
log = logging.getLogger("agent")


class _OneLineParser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse's default prints the whole usage block
        print(f"{PROG}: {message} (see {PROG} --help)", file=sys.stderr)
        raise SystemExit(2)


def build_parser() -> argparse.ArgumentParser:
    parser = _OneLineParser(
        prog=PROG,
        description="Hulk's node agent: reports this server's GPUs, measures RTTs to its peers "
                    "and reports them to the planner.",
        epilog="Settings come from the config file < HULK_* variables < flags. "
               "The gRPC token is read from HULK_TOKEN or the config file only.")
    add = parser.add_argument
    add("--planner", metavar="HOST:PORT", help="the planner's gRPC address")
    add("--node-id", metavar="ID", help="this node's id")
    add("--address", metavar="IP", help="the address peers probe (default: the interface "
                                         "towards the planner)")
    add("--city", metavar="NAME", help="city from the gazetteer (e.g. Beijing)")
    add("--site", metavar="NAME", help="this node's site: a data centre, cloud region or city "
                                       "(default: its city)")
    add("--interval", metavar="SECONDS", help="seconds between probe rounds to each peer "
                                              f"(default {PROBE_DEFAULTS.interval_s:g})")
    add("--state-dir", metavar="DIR", help="where the spool lives (default /var/lib/hulk-agent)")
    add("--config", metavar="FILE", help="YAML config file (default: $HULK_CONFIG)")
    add("--insecure", action="store_const", const=True, default=None,
        help="plaintext gRPC (warned about); default: TLS")
    add("--ca", metavar="FILE", help="CA certificate that signs the planner's certificate")
    add("--client-cert", metavar="FILE", help="this node's client certificate (PEM), for a "
                                              "planner that requires one (--client-ca)")
    add("--client-key", metavar="FILE", help="the private key (PEM) of --client-cert")
    add("--mqtt", metavar="URL", help="broker URL mqtt://[user:pass@]HOST:PORT")
    add("--spool-max", metavar="N", help="most samples spooled before the oldest are dropped")
    add("--packets-per-round", metavar="N", help="probe packets per round "
                                                 f"(default {PROBE_DEFAULTS.packets_per_round})")
    add("--timeout", metavar="SECONDS", help="per-packet timeout "
                                             f"(default {PROBE_DEFAULTS.timeout_s:g})")
    add("--max-concurrency", metavar="N", help="most probe rounds in flight "
                                               f"(default {PROBE_DEFAULTS.max_concurrency})")
    add("--probe-port", metavar="PORT", help="TCP port to accept peers' connect probes on "
                                             "(default 0: none)")
    add("--throughput-port", metavar="PORT", help="TCP port peers send throughput tests to, "
                                                  "planned by the planner (default 0: none)")
    add("--metrics", metavar="HOST:PORT", help="serve Prometheus metrics at "
                                               "http://HOST:PORT/metrics (default: off)")
    add("--declared-gpus", metavar="COUNTxNAME:GB",
        help="labs and tests only: report these GPUs (e.g. '8xNVIDIA A100-SXM4-40GB:40') instead "
             "of reading them through NVML; the planner shows them as declared (default: off)")
    add("--log-level", metavar="LEVEL", help="DEBUG, INFO, WARNING or ERROR (default INFO)")
    add("--version", action="version", version=f"{PROG} {__version__}")
    return parser


def config_from_args(args: argparse.Namespace) -> AgentConfig:
    return load_config({
        "config": args.config, "planner": args.planner, "node_id": args.node_id,
        "address": args.address, "city": args.city, "site": args.site,
        "interval_s": args.interval,
        "state_dir": args.state_dir, "insecure": args.insecure, "ca": args.ca,
        "client_cert": args.client_cert, "client_key": args.client_key,
        "mqtt": args.mqtt, "spool_max": args.spool_max,
        "packets_per_round": args.packets_per_round, "timeout_s": args.timeout,
        "max_concurrency": args.max_concurrency, "probe_port": args.probe_port,
        "throughput_port": args.throughput_port,
        "log_level": args.log_level, "metrics": args.metrics,
        "declared_gpus": args.declared_gpus,
    })


def setup_logging(level: str) -> None:
    logging.basicConfig(level=getattr(logging, level), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def quiet_closed_socket(loop: asyncio.AbstractEventLoop, context: dict) -> None:
    """The loop's exception handler: aiomqtt registers a socket's writer in a later loop round,
    and when the broker closes the connection in between (the agent and the broker stopping
    together) that finds the descriptor closed. Nothing is lost then: one debug line, not a
    traceback; everything else goes to asyncio's default handler."""
    exc = context.get("exception")
    if isinstance(exc, OSError) and exc.errno == errno.EBADF:
        log.debug("a closed socket's callback: %s", context.get("message", exc))
        return
    loop.default_exception_handler(context)


async def serve(config: AgentConfig) -> int:
    from agent.runtime import AgentRuntime  # grpc import cost only when actually running

    components = []
    if config.mqtt:  # placements arrive over MQTT; the launcher acts on them
        from agent.placement import PlacementComponent

        components.append(PlacementComponent.from_config(config))
    metrics = endpoint = None
    if config.metrics:  # bound before anything starts: a port in use ends the agent (exit 2)
        from agent.metrics import AgentMetrics
        from hulk.metrics import start_metrics_server

        metrics = AgentMetrics(config.node_id)
        endpoint = start_metrics_server(config.metrics, metrics.registry, field="metrics")
        log.info("metrics on %s", endpoint.url)
    try:
        runtime = AgentRuntime.from_config(config, components=components,
                                           **({"events": metrics} if metrics else {}))
        if metrics is not None:
            metrics.watch(runtime)
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(quiet_closed_socket)
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, runtime.request_stop)
        return await runtime.run()
    finally:
        if endpoint is not None:
            endpoint.close()


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        config = config_from_args(args)
        setup_logging(config.log_level)
        return asyncio.run(serve(config))
    except HulkError as err:
        print(f"{PROG}: {err}", file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt:  # a second Ctrl-C during shutdown
        return 130
    except Exception as err:  # a bug: one line for the user, the traceback at debug level
        log.debug("internal error", exc_info=True)
        print(f"{PROG}: internal error: {type(err).__name__}: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
