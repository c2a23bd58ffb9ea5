"""The agent's placement subscriber: its own MQTT topic -> state_dir/placement.json -> a callback.

- Subscribes to ``hulk/v1/<fleet>/nodes/<node_id>/placement`` (QoS 1). The message is
  retained, so after a reconnect the broker sends it again; an unchanged placement is a no-op.
  On the same connection it reads serve's presence (``hulk/v1/<fleet>/planner/presence``), which
  renews the node lease while serve is offline (agent/presence.py).
- Reconnects with exponential backoff (with jitter) when the broker goes away; the backoff starts
  over after a connection that worked. A broker whose certificate fails verification several
  times in a row (a wrong or missing ``?ca=``) is a configuration error: ``run`` raises
  ConfigError, and the component ends the agent with it (exit 2).
- A placement is acted on only when it is signed by one of the pinned ``placement_key`` keys
  (the planner's Ed25519 key; the old and the new one while it is rotated), addressed to this node and fleet, not expired, not issued in the future (beyond
  ``MAX_CLOCK_AHEAD_MS``), valid for no longer than ``MAX_VALIDITY_MS``, and newer than the one
  accepted last: a higher ``seq``, or the same message again (same ``seq`` and digest: the
  retained placement after a restart). The accepted ``seq`` and digest are kept in
  state_dir/placement-accepted.json across restarts, so a captured message is never run twice.
  Anything else (unsigned, wrongly signed, expired, replayed, malformed however deep or large)
  is logged in one line and ignored: the previous placement (file and process) stays. Without a
  pinned key every placement is refused. The same retained message redelivered (after a
  reconnect) is a no-op before any of these checks, so a running job is never stopped by it.
- A placement without roles clears the node: the file is removed and the callback gets it. An
  empty message (a deleted retained placement) carries no signature and no ``seq``: it is
  logged and ignored, the current placement stays until the planner sends a signed one.
- After a restart, the broker's retained message is the truth; when none is accepted within
  ``retained_wait_s``, the file of the last run (verified again) is handed to the callback, or
  ``None`` when there is none, so the launcher adopts or stops what still runs.
- The file is written atomically (hulk.atomic: temporary file, fsync, rename, fsync of the
  folder), so a crash leaves either the old or the new placement, never half of one.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import random
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from agent.metrics import NO_EVENTS, AgentEvents
from agent.presence import PlannerWatch
from hulk import errors
from hulk.atomic import sync_dir, write_atomic
from hulk.errors import InputError
from hulk.wire.broker import BrokerAddress, client_tls_kwargs, placement_topic
from hulk.wire.placement import (MAX_CLOCK_AHEAD_MS, MAX_VALIDITY_MS, NodePlacement,
                                 parse_placement)

log = logging.getLogger(__name__)


def refusal(reason: str, exc: InputError) -> InputError:
    """``exc`` tagged with why the placement is refused (the metrics' ``reason`` label)."""
    exc.refusal = reason  # type: ignore[attr-defined]
    return exc


PLACEMENT_FILE = "placement.json"
ACCEPTED_FILE = "placement-accepted.json"

OnChange = Callable[[NodePlacement | None], Awaitable[None] | None]


class PlacementFile:
    """state_dir/placement.json, replaced atomically."""

    def __init__(self, state_dir: Path):
        self.path = Path(state_dir) / PLACEMENT_FILE

    def load(self) -> NodePlacement | None:
        """The stored placement; None when there is none or it cannot be read (logged)."""
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            log.warning("cannot read %s: %s", self.path, exc)
            return None
        try:
            return parse_placement(data, source=str(self.path))
        except InputError as exc:
            log.warning("ignoring stored placement: %s", exc)
            return None

    def save(self, placement: NodePlacement) -> None:
        write_atomic(self.path, placement.to_bytes())

    def clear(self) -> None:
        try:
            self.path.unlink()
        except FileNotFoundError:
            return
        sync_dir(self.path.parent)


def digest(placement: NodePlacement) -> str:
    """sha256 of the placement's canonical bytes: tells the same message from another."""
    return hashlib.sha256(placement.to_bytes()).hexdigest()


class AcceptedMark:
    """The placement accepted last, its ``seq`` and digest, in state_dir/placement-accepted.json:
    a lower ``seq``, or the same with another digest, is a replay, also after a restart. No file:
    nothing accepted yet (-1). A file of the older format (issue time and plan id, no ``seq``)
    reads as ``seq`` 0: anything signed with a ``seq`` is newer."""

    def __init__(self, state_dir: Path):
        self.path = Path(state_dir) / ACCEPTED_FILE
        self.seq, self.digest = -1, ""
        try:
            data = json.loads(self.path.read_text())
        except FileNotFoundError:
            return
        except (OSError, ValueError) as exc:
            log.warning("cannot read %s (%s): only placements with a seq above 0 are accepted",
                        self.path, exc)
            self.seq = 0
            return
        seq = data.get("seq") if isinstance(data, dict) else None
        if isinstance(seq, int) and not isinstance(seq, bool) and seq >= 0:
            self.seq, self.digest = seq, str(data.get("digest", ""))
        else:
            self.seq = 0

    def refusal(self, placement: NodePlacement) -> str | None:
        """Why ``placement`` is a replay (None: it is not)."""
        if placement.seq > self.seq or (placement.seq == self.seq and digest(placement) == self.digest):
            return None
        if placement.seq < self.seq:
            return f"seq {placement.seq} is older than the placement accepted last (seq {self.seq})"
        return f"seq {placement.seq} was accepted last for another message"

    def accept(self, placement: NodePlacement) -> None:
        self.seq, self.digest = placement.seq, digest(placement)
        try:
            write_atomic(self.path, json.dumps({"seq": self.seq, "digest": self.digest}))
        except OSError as exc:
            log.warning("cannot record the accepted placement in %s: %s", self.path, exc)


class PlacementSubscriber:
    """Keeps ``state_dir/placement.json`` equal to this node's retained, verified placement."""

    def __init__(self, broker: BrokerAddress, *, fleet: str, node_id: str, state_dir: Path,
                 verifier: Any = None, on_change: OnChange | None = None,
                 client_factory: Callable[..., Any] | None = None,
                 backoff_initial_s: float = 0.5, backoff_max_s: float = 30.0,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
                 retained_wait_s: float = 3.0,
                 clock_ms: Callable[[], int] = lambda: int(time.time() * 1000),
                 events: AgentEvents = NO_EVENTS, presence: PlannerWatch | None = None,
                 presence_every: Callable[[], float] = lambda: 1.0):
        self.broker = broker
        # serve's presence, read on the same connection (the broker allows one per account)
        self.presence = presence
        self.presence_every = presence_every
        self.events = events          # metrics: refusals by reason (agent/metrics.py)
        self.verifier = verifier      # hulk.wire.signing.Verifier of the pinned keys (None: refuse all)
        self.clock_ms = clock_ms
        self.accepted = AcceptedMark(state_dir)
        self.fleet = fleet
        self.node_id = node_id
        self.topic = placement_topic(fleet, node_id)
        self.file = PlacementFile(state_dir)
        self.on_change = on_change
        self.backoff_initial_s = backoff_initial_s
        self.backoff_max_s = backoff_max_s
        self._client_factory = client_factory
        self._sleep = sleep
        # After a restart the agent acts on what the broker retains (a stale placement may have
        # been re-planned away); the file stands in only when nothing retained is accepted.
        self.current: NodePlacement | None = None
        self.notified = False      # on_change called at least once since start
        self._deleted_logged = False
        self.retained_wait_s = retained_wait_s
        self.connected = asyncio.Event()
        self.connects = 0          # successful connections so far
        self.ignored = 0           # malformed, misaddressed or refused messages ignored

    def _client(self) -> Any:
        factory = self._client_factory
        if factory is None:
            import aiomqtt

            factory = aiomqtt.Client
        return factory(self.broker.host, self.broker.port, identifier=f"hulk-agent-{self.node_id}",
                       username=self.broker.username, password=self.broker.password,
                       keepalive=10, timeout=10, **client_tls_kwargs(self.broker))

    async def run(self) -> None:
        """Subscribe forever; returns only when cancelled."""
        settle = asyncio.create_task(self._settle_start())
        try:
            await self._subscribe_forever()
        finally:
            settle.cancel()

    async def _subscribe_forever(self) -> None:
        import aiomqtt

        delay = self.backoff_initial_s
        certificate_failures = 0
        while True:
            try:
                async with self._client() as client:
                    topics = [(self.topic, 1)]
                    if self.presence is not None:
                        topics.append((self.presence.topic, 1))
                        self.presence.asking()     # its retained message answers this read
                    await client.subscribe(topics)
                    self.connects += 1
                    self.connected.set()
                    delay = self.backoff_initial_s
                    certificate_failures = 0
                    log.info("subscribed to %s on %s:%s", self.topic, self.broker.host, self.broker.port)
                    probe = (asyncio.create_task(self._read_presence(client))
                             if self.presence is not None else None)
                    try:
                        async for message in client.messages:
                            topic = str(message.topic)
                            if self.presence is not None and topic == self.presence.topic:
                                self.presence.handle(message.payload, bool(message.retain))
                            else:
                                await self.handle(topic, message.payload)
                    finally:
                        if probe is not None:
                            probe.cancel()
            except (aiomqtt.MqttError, OSError) as exc:
                if errors.is_certificate_failure(str(exc)):
                    certificate_failures += 1
                    if certificate_failures >= errors.CERTIFICATE_FAILURES_FATAL:
                        raise errors.certificate_config_error(
                            f"the broker {self.broker.host}:{self.broker.port}", self.broker.ca,
                            "?ca= in the broker URL (HULK_MQTT, --mqtt)",
                            errors.CertificateError(str(exc)), certificate_failures) from None
                log.warning("MQTT broker %s:%s: %s; reconnecting in %.1f s", self.broker.host,
                            self.broker.port, exc, delay)
            self.connected.clear()
            if self.presence is not None:
                self.presence.reset()
            await self._sleep(delay * random.uniform(0.8, 1.2))
            delay = min(self.backoff_max_s, delay * 2)

    async def _read_presence(self, client: Any) -> None:
        """While serve is offline, read its retained presence again (subscribing anew makes the
        broker send it) every ``presence_every()`` s; never a second read before the first is
        answered (agent/presence.py)."""
        watch = self.presence
        last = float("-inf")
        while True:
            # Short ticks: the interval follows the lease's terms, which the first heartbeat
            # answer may change, and serve going offline is acted on within a tick.
            await asyncio.sleep(min(0.25, max(0.05, self.presence_every())))
            if (watch.offline and watch.asked_at is None
                    and watch.clock() - last >= self.presence_every()):
                last = watch.asking()
                try:
                    await client.subscribe(watch.topic, qos=1)
                except Exception as exc:  # the connection's own loop sees it end
                    log.debug("cannot read serve's presence: %s", exc)
                    return

    async def _settle_start(self) -> None:
        """Nothing accepted from the broker ``retained_wait_s`` after start (none retained, the
        broker away, or the retained one refused): the launcher gets the file's placement,
        verified again, or None, so it adopts or stops the processes of the last run."""
        await asyncio.sleep(self.retained_wait_s)
        if self.notified:
            return
        placement = self.file.load()
        if placement is not None:
            try:
                self.check(placement, str(self.file.path))
            except InputError as exc:
                log.warning("not acting on the stored placement: %s", exc)
                placement = None
        if placement is None:
            log.info("no placement retained or stored for this node: nothing runs")
            await self._notify(None)
            return
        log.info("no retained placement accepted yet: acting on the stored one (plan %s)",
                 placement.plan_id)
        self.current = placement
        await self._notify(placement)

    async def handle(self, topic: str, payload: Any) -> None:
        """Apply one message from the broker (public for tests of the decision logic)."""
        if topic != self.topic:  # the broker should never send others' topics; never act on them
            self.ignored += 1
            log.warning("ignored a message on %s (this agent reads only %s)", topic, self.topic)
            return
        if payload is None or payload == b"" or payload == "":
            if not self._deleted_logged:
                self._deleted_logged = True
                log.warning("the retained placement was deleted; keeping the current one until "
                            "the planner sends a signed placement")
            return
        if not isinstance(payload, (bytes, bytearray, str)):
            payload = str(payload)
        try:
            placement = parse_placement(payload, source=topic)
            if placement == self.current:
                return  # the retained message again, after a reconnect: already verified
            self.check(placement, topic)
        except InputError as exc:
            self.ignored += 1
            self.events.placement_refused(getattr(exc, "refusal", "malformed"))
            log.warning("refused placement, keeping the previous one: %s", exc)
            return
        except Exception as exc:  # never let one message stop the subscriber (and the job)
            self.ignored += 1
            self.events.placement_refused("malformed")
            log.warning("refused placement, keeping the previous one: %s: %s",
                        type(exc).__name__, str(exc)[:200])
            return
        self.accepted.accept(placement)
        if placement.roles:
            self.file.save(placement)
        else:
            self.file.clear()
        self.current = placement
        self._deleted_logged = False
        log.info("new placement from plan %s (seq %d): %s", placement.plan_id, placement.seq,
                 ", ".join(f"{r.job} stage {r.stage} replica {r.replica} rank {r.rank}/{r.world_size}"
                           for r in placement.roles) or "no roles")
        await self._notify(placement)

    def check(self, placement: NodePlacement, topic: str) -> None:
        """InputError (one line) unless ``placement`` may be acted on (the module docstring)."""
        if self.verifier is None:
            raise refusal("no_key", InputError("no placement_key is configured (HULK_PLACEMENT_KEY): "
                                               "this agent acts on no placement", path=topic))
        try:
            self.verifier.verify(placement.to_json(), source=topic)
        except InputError as exc:
            raise refusal("bad_signature", exc) from None
        if placement.node != self.node_id or placement.fleet != self.fleet:
            raise refusal("misaddressed", InputError(
                f"expected node {self.node_id!r} of fleet {self.fleet!r}, got node "
                f"{placement.node!r} of fleet {placement.fleet!r}", path=topic))
        now = self.clock_ms()
        if placement.expires_at_ms <= now:
            raise refusal("expired", InputError(f"expired: plan {placement.plan_id} was valid until "
                                                f"{placement.expires_at_ms} ms, now is {now} ms",
                                                path=topic))
        if placement.issued_at_ms > now + MAX_CLOCK_AHEAD_MS:
            raise refusal("future", InputError(
                f"issued in the future: plan {placement.plan_id} at {placement.issued_at_ms} ms, "
                f"now is {now} ms (at most {MAX_CLOCK_AHEAD_MS // 1000} s ahead accepted)",
                path=topic))
        if placement.expires_at_ms - placement.issued_at_ms > MAX_VALIDITY_MS:
            raise refusal("validity", InputError(
                f"valid too long: plan {placement.plan_id} for "
                f"{(placement.expires_at_ms - placement.issued_at_ms) // 1000} s, at most "
                f"{MAX_VALIDITY_MS // 1000} s accepted", path=topic))
        why = self.accepted.refusal(placement)
        if why is not None:
            raise refusal("replayed", InputError(f"replayed: plan {placement.plan_id}: {why}",
                                                 path=topic))

    async def _notify(self, placement: NodePlacement | None) -> None:
        self.notified = True
        if self.on_change is None:
            return
        try:
            result = self.on_change(placement)
            if asyncio.iscoroutine(result):
                await result
        except Exception:  # the subscriber must outlive a failing consumer
            log.exception("placement consumer failed")


class PlacementComponent:
    """The agent runtime's component: subscriber -> launcher, launch states -> Heartbeat.

    Runs after the first registration (the planner's answer names the fleet used in the topic).
    """

    name = "placements"

    def __init__(self, broker: BrokerAddress, *, state_dir: Path, node_id: str,
                 launcher_factory: Callable[..., Any] | None = None, fleet: str | None = None,
                 subscriber_kwargs: dict[str, Any] | None = None, config: Any = None):
        self.broker = broker
        self.config = config
        self.state_dir = Path(state_dir)
        self.node_id = node_id
        self.fleet = fleet
        self._launcher_factory = launcher_factory
        self._subscriber_kwargs = subscriber_kwargs or {}
        self.subscriber: PlacementSubscriber | None = None
        self.launcher: Any = None

    @classmethod
    def from_config(cls, config: Any) -> "PlacementComponent":
        from hulk.wire.broker import parse_broker_url

        from hulk.wire.signing import Verifier

        verifier = Verifier.from_text(config.placement_key) if config.placement_key else None
        if verifier is None:
            log.warning("no placement_key configured (HULK_PLACEMENT_KEY): every placement is refused")
        return cls(parse_broker_url(config.mqtt, source="--mqtt/HULK_MQTT"), state_dir=config.state_dir,
                   node_id=config.node_id, config=config, subscriber_kwargs={"verifier": verifier})

    def _make_launcher(self, on_status: Callable[[Any], None], lease: Any = None) -> Any:
        if self._launcher_factory is not None:
            return self._launcher_factory(on_status=on_status)
        from agent.launcher import Launcher, TorchrunCommand

        config = self.config
        return Launcher(command=TorchrunCommand(torchrun=getattr(config, "torchrun", "") or None),
                        jobs_dir=self.state_dir / "jobs", on_status=on_status,
                        allowed_commands=getattr(config, "allowed_commands", ()),
                        pass_env=getattr(config, "pass_env", ()),
                        job_scope=getattr(config, "job_scope", "auto"), lease=lease)

    async def run(self, runtime: Any) -> None:
        registration = await runtime.wait_registered()
        fleet = self.fleet or getattr(registration, "fleet", "") or "default"
        self.launcher = self._make_launcher(runtime.set_launch_status,
                                            getattr(runtime, "lease", None))
        kwargs = {"events": getattr(runtime, "events", NO_EVENTS), **self._subscriber_kwargs}
        lease = getattr(runtime, "lease", None)
        if lease is not None and "presence" not in kwargs:
            kwargs["presence"] = PlannerWatch(fleet, kwargs.get("verifier"),
                                              renew=lease.witnessed, clock=lease.clock)
            kwargs["presence_every"] = lambda: min(10.0, lease.terms.renew_s / 4)
        self.subscriber = PlacementSubscriber(self.broker, fleet=fleet, node_id=self.node_id,
                                              state_dir=self.state_dir, on_change=self.launcher.apply,
                                              **kwargs)
        try:
            await self.subscriber.run()
        except errors.ConfigError as err:  # no retry can fix it: the agent ends (exit 2)
            runtime.fail(err)
        finally:
            # The agent stops (an upgrade, a restart): its training keeps running, and the next
            # agent adopts it or stops it (agent/launcher.py).
            await self.launcher.detach()
