"""The running agent: registers, probes into the spool, reports, heartbeats, feeds the watchdog.

Extension seam (the placement subscriber and the launcher plug in here):

    runtime = AgentRuntime.from_config(config)
    runtime.add_component(my_component)         # anything with .name and async run(runtime)
    runtime.set_launch_status(LaunchStatus(...)) # goes out in the next Heartbeat.launch
    await runtime.run()

With ``throughput_port`` set, the runtime also owns the throughput tests (agent/throughput.py):
the slots heartbeats bring go to it, and the results it hands back are spooled and reported
like probe summaries. The prober keeps quiet while this node is in a test (its probes would
queue behind the test's bytes and measure the queue).

A component's ``run(runtime)`` starts after the first successful registration may be awaited
with ``await runtime.wait_registered()`` (``runtime.registration.fleet`` names the MQTT fleet);
it is cancelled on stop and restarted (after a pause) if it raises.
"""

from __future__ import annotations

import asyncio
import logging
import random
import socket
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import fields, replace
from typing import Protocol

from agent.clock import Clock, SystemClock, epoch_ms
from agent.config import PROBE_DEFAULTS, AgentConfig
from agent.icmp import IcmpPinger, detect_icmp_mode
from agent.inventory import inventory_reader_for
from agent.lease import NodeLease
from agent.metrics import NO_EVENTS, AgentEvents
from agent.peers import paced_interval_s
from agent.prober import Connector, Pinger, Prober, ProbeListener, TcpConnector
from agent.reporter import Backoff, GrpcPlannerClient, PlannerClient, Reporter
from agent.spool import Spool
from agent.spool_store import SpoolStore
from agent.systemd import SystemdNotifier
from hulk import __version__, errors, geo
from hulk.wire.records import (Inventory, LaunchState, LaunchStatus, NodeLocation, PeerSummary,
                               ProbeSample, ProbeSettings, RegisterAnswer, RegisterRequest)
from hulk.wire.throughput import ThroughputResult, ThroughputSlot

log = logging.getLogger(__name__)


class Component(Protocol):
    """Something that runs beside the agent's own loops (e.g. the placement subscriber)."""

    name: str

    async def run(self, runtime: AgentRuntime) -> None: ...


class ThroughputTests(Protocol):
    """What the runtime needs of agent.throughput.ThroughputTests."""

    def accept(self, slots: Sequence[ThroughputSlot]) -> None: ...

    def testing(self, now_ms: int) -> bool: ...

    async def run(self) -> None: ...


# What the agent takes from the planner's ProbeSettings: a value outside is not used (the local
# one is, with one warning). A NaN fails every comparison, so it is outside too.
PLANNER_SETTING_RANGES: dict[str, tuple[float, float]] = {
    "interval_s": (0.1, 86400.0), "packets_per_round": (1, 100), "timeout_s": (0.01, 60.0),
    "payload_bytes": (0, 1472), "max_concurrency": (1, 4096), "max_batch": (1, 10_000),
    "report_interval_s": (0.1, 3600.0),
}


def unusable_planner_settings(planner: ProbeSettings | None) -> dict[str, str]:
    """The planner's settings the agent will not use (0 means not sent: never unusable), with
    why."""
    problems = {}
    for name, (low, high) in PLANNER_SETTING_RANGES.items():
        value = getattr(planner, name) if planner is not None else 0
        if value and not low <= value <= high:
            problems[name] = f"{value!r} is outside {low:g}-{high:g}"
    return problems


def effective_settings(config: AgentConfig, planner: ProbeSettings | None) -> ProbeSettings:
    """The probe settings to use: a value the operator set locally wins, else the planner's
    (when it sent a usable one: 0 means not set), else the local default."""
    unusable = unusable_planner_settings(planner)
    values = {}
    for name in (f.name for f in fields(ProbeSettings)):
        local = getattr(config, name, getattr(PROBE_DEFAULTS, name))
        remote = getattr(planner, name) if planner is not None and name not in unusable else 0
        values[name] = local if name in config.explicit or not remote else type(local)(remote)
    return ProbeSettings(**values)


def detect_address(planner: str) -> str:
    """The local address of the interface that routes to the planner (no packet is sent)."""
    host, _, port = planner.rpartition(":")
    host = host.strip("[]")
    try:
        info = socket.getaddrinfo(host, int(port), type=socket.SOCK_DGRAM)[0]
        with socket.socket(info[0], socket.SOCK_DGRAM) as probe:
            probe.connect(info[4])
            return probe.getsockname()[0]
    except OSError as err:
        raise errors.ConfigError(f"cannot find this node's address towards {planner!r} ({err}); "
                                 "give --address", field="address") from None


class AgentRuntime:
    def __init__(self, config: AgentConfig, *, client: PlannerClient, spool: Spool | SpoolStore,
                 pinger: Pinger | None, connector: Connector | None = None,
                 inventory_reader: Callable[[], Inventory] | None = None,
                 notifier: SystemdNotifier | None = None, clock: Clock | None = None,
                 hostname: str | None = None, components: Iterable[Component] = (),
                 heartbeat_interval_s: float = 10.0, flush_deadline_s: float = 3.0,
                 register_backoff: Backoff | None = None, report_backoff: Backoff | None = None,
                 restart_delay_s: float = 5.0, report_linger_s: float = 5.0,
                 spool_write_s: float = 1.0,
                 rng: random.Random | None = None, summarize: bool = True,
                 events: AgentEvents = NO_EVENTS,
                 throughput_tests: Callable[..., ThroughputTests] | None = None):
        self.config = config
        self.events = events   # metrics (agent/metrics.py); no-op by default
        self.client = client
        self.spool = spool
        self.clock = clock or SystemClock()
        self.notifier = notifier or SystemdNotifier(None)
        self._inventory_reader = inventory_reader or inventory_reader_for(config.declared_gpus)
        self._hostname = hostname or socket.gethostname()
        self._components: list[Component] = list(components)
        self.heartbeat_interval_s = heartbeat_interval_s
        self.flush_deadline_s = flush_deadline_s
        self.restart_delay_s = restart_delay_s
        self.spool_write_s = spool_write_s
        self.report_linger_s = report_linger_s
        self._register_backoff = register_backoff or Backoff(rng=rng)
        self.registration: RegisterAnswer | None = None
        self.fatal: errors.HulkError | None = None   # a permanent error that ended the agent
        self.inventory: Inventory | None = None
        self._launch = LaunchStatus(state=LaunchState.IDLE, changed_at_ms=epoch_ms(self.clock))
        self._pinger = pinger
        self.listener = ProbeListener(config.address, config.probe_port) if config.probe_port \
            else None
        settings = effective_settings(config, None)
        self.prober = Prober(settings, self._sink, pinger=pinger,
                             connector=connector or TcpConnector(), clock=self.clock, rng=rng,
                             summarize=summarize, paused=self._in_throughput_test)
        self.reporter = Reporter(config.node_id, spool, client, max_batch=settings.max_batch,
                                 backoff=report_backoff or Backoff(rng=rng),
                                 clock=self.clock, linger_s=report_linger_s,
                                 on_unregistered=self.request_reregister, events=events)
        self._stop: asyncio.Event | None = None
        self._registered: asyncio.Event | None = None
        self._reregister: asyncio.Event | None = None
        self.heartbeats_sent = 0
        # Renewed by each acknowledged heartbeat; the launcher keeps it in its jobs' folders.
        state_dir = getattr(config, "state_dir", None)
        self.lease = NodeLease(state_dir / "jobs" if state_dir else None)
        self._warned_settings: set[tuple[str, str]] = set()
        self.throughput: ThroughputTests | None = None
        if config.throughput_port:
            if throughput_tests is None:  # only an agent that takes tests loads the engine
                from agent.throughput import ThroughputTests as throughput_tests
            self.throughput = throughput_tests(
                port=config.throughput_port, sink=self._throughput_sink, clock=self.clock,
                bind_host=config.address or "0.0.0.0")

    @classmethod
    def from_config(cls, config: AgentConfig, *, components: Iterable[Component] = (),
                    **overrides) -> AgentRuntime:
        """The real thing: gRPC client, SQLite spool in state_dir (in memory while that cannot
        be written), ICMP as allowed, NVML."""
        if not config.address:
            config = replace(config, address=detect_address(config.planner))
        mode = detect_icmp_mode()
        if mode is None:
            log.warning("no ICMP socket allowed (not root, and net.ipv4.ping_group_range excludes "
                        "our groups): probing over TCP only")
        parts = dict(
            client=GrpcPlannerClient.connect(config.planner, insecure=config.insecure,
                                             ca=config.ca, token=config.token,
                                             client_cert=config.client_cert,
                                             client_key=config.client_key),
            spool=SpoolStore(config.spool_path, config.spool_max),
            pinger=IcmpPinger(mode) if mode else None,
            notifier=SystemdNotifier.from_environ(),
        )
        parts.update(overrides)
        return cls(config, components=components, **parts)

    # ------------------------------------------------------------------ the public seam
    def add_component(self, component: Component) -> None:
        """Run ``component`` beside the agent's loops; call before run()."""
        self._components.append(component)

    @property
    def launch_status(self) -> LaunchStatus:
        return self._launch

    def set_launch_status(self, status: LaunchStatus) -> None:
        """The launched training process changed state; sent with the next Heartbeat."""
        if not status.changed_at_ms:
            status = replace(status, changed_at_ms=epoch_ms(self.clock))
        self.events.launch_changed(self._launch, status)
        self._launch = status

    async def wait_registered(self) -> RegisterAnswer:
        await self._events()[1].wait()
        assert self.registration is not None
        return self.registration

    def request_reregister(self) -> None:
        self._events()[2].set()

    def request_stop(self) -> None:
        """Stop cleanly (signal handlers call this)."""
        self._events()[0].set()

    @property
    def stopping(self) -> bool:
        return self._stop is not None and self._stop.is_set()

    # ------------------------------------------------------------------ running
    def _events(self) -> tuple[asyncio.Event, asyncio.Event, asyncio.Event]:
        if self._stop is None:
            self._stop, self._registered, self._reregister = (asyncio.Event(), asyncio.Event(),
                                                              asyncio.Event())
        return self._stop, self._registered, self._reregister  # type: ignore[return-value]

    def register_request(self) -> RegisterRequest:
        """What Register tells the planner about this node."""
        city = geo.canonical_city(self.config.city) or self.config.city
        return RegisterRequest(node_id=self.config.node_id, hostname=self._hostname,
                               location=NodeLocation(city, geo.coordinates(city),
                                                     self.config.site),
                               agent_version=__version__, inventory=self.inventory or Inventory(),
                               address=self.config.address,
                               probe_port=self.listener.port if self.listener else 0,
                               throughput_port=self.config.throughput_port
                               if self.throughput is not None else 0,
                               allowed_commands=tuple(self.config.allowed_commands))

    async def run(self) -> int:
        """Run until request_stop(); returns the exit code (0)."""
        stop, _, _ = self._events()
        if self.config.city and geo.canonical_city(self.config.city) is None:
            log.warning("city %r is not in the gazetteer: the planner cannot check RTTs against "
                        "the distance", self.config.city)
        self.inventory = await asyncio.to_thread(self._inventory_reader)
        if self.inventory.gpus:
            log.info("%d GPU(s): %s", self.inventory.count, self.inventory.gpus[0].name)
        else:
            log.info("no GPUs: %s", self.inventory.unavailable_reason)
        open_pinger = getattr(self._pinger, "open", None)
        if open_pinger is not None:
            open_pinger()
        if self.listener is not None:
            try:
                await self.listener.start()
            except OSError as err:
                log.warning("cannot listen for TCP probes on port %d: %s", self.config.probe_port,
                            err)
                self.listener = None
        tasks = [asyncio.create_task(self._supervise(name, job), name=name) for name, job in [
            ("watchdog", self._watchdog_loop),
            ("registrar", self._registrar_loop),
            ("prober", self._prober_loop),
            ("spool writer", self._spool_writer_loop),
            ("reporter", self._reporter_loop),
            ("heartbeat", self._heartbeat_loop),
        ]]
        if self.throughput is not None:
            tasks.append(asyncio.create_task(
                self._supervise("throughput tests", self.throughput.run), name="throughput"))
        for component in self._components:
            tasks.append(asyncio.create_task(
                self._supervise(component.name, lambda c=component: c.run(self)),
                name=component.name))
        self.notifier.ready(f"waiting for the planner at {self.config.planner}")
        log.info("hulk-agent %s: node %s at %s, planner %s", __version__, self.config.node_id,
                 self.config.address, self.config.planner)
        try:
            await stop.wait()
        finally:
            await self._shutdown(tasks)
        if self.fatal is not None:
            raise self.fatal  # the CLI prints its one line and exits with its code
        return 0

    async def _shutdown(self, tasks: Sequence[asyncio.Task]) -> None:
        self.notifier.stopping("stopping")
        log.info("stopping")
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        try:
            self._write_spool()
        except errors.StoreError as err:
            log.error("%s; %d samples stay in memory", err, self.spool.held)
        if self.registration is not None:
            sent = await self.reporter.flush(self.flush_deadline_s)
            log.info("flushed %d batch(es); %d samples stay spooled", sent, self.spool.depth)
        if self.listener is not None:
            await self.listener.stop()
        close_pinger = getattr(self._pinger, "close", None)
        if close_pinger is not None:
            close_pinger()
        try:
            await asyncio.wait_for(self.client.close(), timeout=2.0)
        except (asyncio.TimeoutError, errors.HulkError) as err:
            log.info("closing the planner connection: %s", err)
        self.spool.close()
        self.notifier.close()

    async def _supervise(self, name: str, job: Callable[[], Awaitable[None]]) -> None:
        """Periodic jobs catch, log and go on: a crashed loop restarts after a pause."""
        while True:
            try:
                await job()
                return
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("%s failed; restarting it in %.0f s", name, self.restart_delay_s)
                await self.clock.sleep(self.restart_delay_s)

    def _sink(self, samples: Sequence[ProbeSample | PeerSummary]) -> None:
        # Held in memory for up to spool_write_s: one SQLite transaction a second, not one a round.
        self.spool.hold(samples)
        self.events.probed(samples)

    def _throughput_sink(self, result: ThroughputResult) -> None:
        """A test this node received: spooled, then reported like a summary (the planner stores
        it once by test_id). One that fails the wire's checks would cost its whole batch."""
        try:
            result.check()
        except errors.InputError as err:
            log.error("not reporting a throughput test result: %s", err)
            return
        log.info("throughput test %s from %s: %s", result.test_id, result.sender_id,
                 f"{result.gbps:.3g} Gbit/s" if result.ok else f"failed ({result.detail})")
        self.spool.hold([result])

    def _in_throughput_test(self) -> bool:
        return self.throughput is not None and self.throughput.testing(epoch_ms(self.clock))

    def _accept_slots(self, slots: Sequence[ThroughputSlot]) -> None:
        """The heartbeat's slots (read unchecked) to the throughput tests, which check each,
        skip a malformed one and say so once."""
        if self.throughput is None:
            log.debug("ignoring %d throughput slot(s): throughput_port is 0", len(slots))
            return
        self.throughput.accept(slots)

    def _write_spool(self) -> None:
        """What the spool holds in memory onto disk, as far as there is room (a full disk is
        not an error: the samples wait in memory, bounded, and are counted if dropped)."""
        if not self.spool.held:
            return
        dropped = self.spool.save()
        if dropped:
            log.warning("spool full (%d samples): dropped the %d oldest", self.spool.max_samples,
                        dropped)
        self.reporter.wake()

    async def _spool_writer_loop(self) -> None:
        while True:
            await self.clock.sleep(self.spool_write_s)
            self._write_spool()

    async def _register_once(self) -> RegisterAnswer:
        registration = await self.client.register(self.register_request())
        self.registration = registration
        for name, why in unusable_planner_settings(registration.settings).items():
            if (name, why) not in self._warned_settings:
                self._warned_settings.add((name, why))
                log.warning("ignoring the planner's %s: %s; using %r", name, why,
                            getattr(effective_settings(self.config, None), name))
        settings = effective_settings(self.config, registration.settings)
        paced = paced_interval_s(settings.interval_s, len(registration.peers),
                                 settings.packets_per_round, self.config.max_probe_rate)
        if paced > settings.interval_s:
            log.info("%d peers at %d packets a round: a round every %.0f s keeps probing under "
                     "%g packets/s (max_probe_rate)", len(registration.peers),
                     settings.packets_per_round, paced, self.config.max_probe_rate)
            settings = replace(settings, interval_s=paced)
        self.prober.set_settings(settings)
        self.prober.set_peers(registration.peers)
        self.reporter.max_batch = settings.max_batch
        self.reporter.linger_s = settings.report_interval_s or self.report_linger_s
        self.notifier.status(f"registered with {self.config.planner}; probing "
                             f"{len(registration.peers)} peers every {settings.interval_s:g} s")
        log.info("registered with %s (fleet %r): %d peers, a round every %g s",
                 self.config.planner, registration.fleet, len(registration.peers),
                 settings.interval_s)
        return registration

    def fail(self, error: errors.HulkError) -> None:
        """End the agent with ``error`` (a permanent configuration error: exit 2, which the
        unit does not restart, so systemd shows it failed with this one line)."""
        self.fatal = error
        log.error("%s", error)
        self.request_stop()

    async def _registrar_loop(self) -> None:
        _, registered, reregister = self._events()
        certificate_failures = 0
        while True:
            try:
                await self._register_once()
            except (errors.UnauthenticatedError, errors.PermissionDeniedError) as err:
                # No retry can fix a token the planner refuses or a node id it is not for: end
                # the agent (exit 2, which the unit does not restart), so systemd shows it failed.
                self.fatal = errors.ConfigError(
                    f"the planner refuses this node's credentials ({err}); check node_id and "
                    "HULK_TOKEN (`hulk-planner enroll NODE_ID` prints a token), then restart")
                log.error("%s", self.fatal)
                self.request_stop()
                return
            except errors.CertificateError as err:
                # Several in a row: one odd handshake (a middlebox) is not a wrong CA.
                certificate_failures += 1
                if certificate_failures >= errors.CERTIFICATE_FAILURES_FATAL:
                    self.fail(errors.certificate_config_error(
                        f"the planner {self.config.planner}", self.config.ca,
                        "ca (HULK_CA, --ca)", err, certificate_failures))
                    return
                delay = self._register_backoff.next_delay()
                log.warning("register failed (%s); retrying in %.1f s", err, delay)
                await self.clock.sleep(delay)
                continue
            except errors.HulkError as err:
                delay = self._register_backoff.next_delay()
                log.warning("register failed (%s); retrying in %.1f s", err, delay)
                await self.clock.sleep(delay)
                continue
            certificate_failures = 0
            self._register_backoff.reset()
            registered.set()
            reregister.clear()
            await reregister.wait()

    async def _prober_loop(self) -> None:
        await self.wait_registered()
        await self.prober.run()

    async def _reporter_loop(self) -> None:
        await self.wait_registered()
        await self.reporter.run()

    def beat_interval_s(self) -> float:
        """The heartbeat interval: at most a third of the lease's renewal, so one lost beat
        costs no job."""
        return min(self.heartbeat_interval_s, self.lease.terms.renew_s / 3)

    async def _heartbeat_loop(self) -> None:
        await self.wait_registered()
        failures = 0
        first = True
        while True:
            # The first beat right after registering: a restarted agent renews the lease of the
            # job it adopts before the one its predecessor left lapses.
            if not first:
                await self.clock.sleep(self.beat_interval_s())
            first = False
            sent_ms = epoch_ms(self.clock)
            sent_at = self.lease.clock()     # the lease counts from the send, never the answer
            try:
                result = await self.client.heartbeat(
                    self.config.node_id, sent_ms,
                    self.spool.depth,
                    self.spool.dropped, self._launch)
            except errors.HulkError as err:
                self.events.heartbeat(False)
                failures += 1
                # One line per outage, not one per beat.
                (log.warning if failures == 1 else log.debug)("heartbeat failed: %s", err)
                # Unknown node: register again. A token refused after registration (revoked, or
                # the planner's store replaced): register again too, so the registrar's refusal
                # ends the agent with its one line and exit 2 rather than beating forever.
                if isinstance(err, (errors.NotFoundError, errors.UnauthenticatedError,
                                    errors.PermissionDeniedError)):
                    self.request_reregister()
                continue
            failures = 0
            self.heartbeats_sent += 1
            self.lease.granted(sent_at, getattr(result, "lease_s", 0.0))
            self.events.heartbeat(True, sent_ms, epoch_ms(self.clock), result.server_time_ms)
            if result.throughput_slots:
                self._accept_slots(result.throughput_slots)
            if result.reregister or result.peers_changed:
                log.info("planner asks to register again (%s)",
                         "unknown node" if result.reregister else "peers or settings changed")
                self.request_reregister()

    async def _watchdog_loop(self) -> None:
        interval = self.notifier.watchdog_interval_s
        if interval is None:
            return
        while True:
            self.notifier.watchdog()
            await self.clock.sleep(interval)
