"""serve's one broker connection: its presence, with a last will, and every publish and read.

The shipped broker makes an account's name its client id, so a second connection of the
planner's account would end the first (and fire its will): serve therefore holds exactly one,
and :class:`BrokerSession` is its :class:`planner.service.publisher.Publisher`.

On each connection it sets the last will ``offline`` for that session and publishes ``online``
(hulk/wire/presence.py, retained, signed with the placement key); :attr:`online_since_ms` is
when the broker acknowledged ``online`` (None while not connected). serve counts a node silent
only a full node timeout after that (planner/service/recovery.py): an agent that read
``offline`` at some moment renews its lease from then (agent/presence.py), and a serve that
came online later cannot re-place its jobs before that lease ends. The keepalive is a third of
the node timeout, so a serve host that dies without closing its connection is declared
offline by the broker (after 1.5 keepalives) before the nodes' leases run out.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from hulk.errors import UnavailableError
from hulk.wire.broker import BrokerAddress, client_tls_kwargs
from hulk.wire.placement import BROKER_MAX_PACKET_BYTES
from hulk.wire.presence import OFFLINE, ONLINE, Presence, presence_bytes, presence_topic
from hulk.wire.signing import Signer
from planner.service.publisher import check_sizes, publish_on
from planner.service.store import now_ms

log = logging.getLogger(__name__)


@dataclass
class _Read:
    wanted: set[str]
    out: dict[str, bytes] = field(default_factory=dict)
    seen: set[str] = field(default_factory=set)
    done: asyncio.Event = field(default_factory=asyncio.Event)


def keepalive_for(node_timeout_s: float) -> int:
    """The session's keepalive: the broker ends a dead session after 1.5 of them, within half
    the node timeout (mosquitto accepts 1 s to the shipped max_keepalive of 300 s)."""
    return int(max(1, min(300, node_timeout_s // 3)))


class BrokerSession:
    """Connects, keeps the presence and reconnects (:meth:`run`, a background task of serve);
    publishes and reads retained messages on that connection."""

    def __init__(self, broker: BrokerAddress, *, fleet: str, signer: Signer, identifier: str,
                 keepalive_s: int = 10, timeout_s: float = 10.0,
                 client_factory: Callable[..., Any] | None = None,
                 clock_ms: Callable[[], int] = now_ms, backoff_s: tuple[float, float] = (0.5, 10.0),
                 max_packet_bytes: int = BROKER_MAX_PACKET_BYTES):
        self.broker = broker
        self.fleet = fleet
        self.topic = presence_topic(fleet)
        self.signer = signer
        self.identifier = identifier
        self.keepalive_s = keepalive_s
        self.timeout_s = timeout_s
        self.max_packet_bytes = max_packet_bytes
        self.clock_ms = clock_ms
        self.backoff_s = backoff_s
        self._client_factory = client_factory
        self.online_since_ms: int | None = None
        self.sessions = 0                 # connections that went online
        self._client: Any = None
        self._up: asyncio.Event | None = None
        self._reads: list[_Read] = []
        self._read_lock: asyncio.Lock | None = None

    def __repr__(self) -> str:
        return f"BrokerSession({self.broker})"

    def _event(self) -> asyncio.Event:
        if self._up is None:
            self._up = asyncio.Event()
        return self._up

    def presence(self, state: str, session_ms: int) -> bytes:
        return presence_bytes(self.signer.sign(Presence(self.fleet, state, session_ms).document()))

    def _client_for(self, session_ms: int) -> Any:
        import aiomqtt

        factory = self._client_factory or aiomqtt.Client
        will = aiomqtt.Will(self.topic, self.presence(OFFLINE, session_ms), qos=1, retain=True)
        return factory(self.broker.host, self.broker.port, identifier=self.identifier,
                       username=self.broker.username, password=self.broker.password,
                       timeout=self.timeout_s, keepalive=self.keepalive_s, will=will,
                       **client_tls_kwargs(self.broker))

    async def run(self) -> None:
        """Forever: connect, go online, hand messages to the reads waiting for them."""
        import aiomqtt

        delay = self.backoff_s[0]
        while True:
            session = self.clock_ms()
            try:
                async with self._client_for(session) as client:
                    await client.publish(self.topic, self.presence(ONLINE, session), qos=1,
                                         retain=True)
                    self._client, self.online_since_ms = client, self.clock_ms()
                    self.sessions += 1
                    self._event().set()
                    delay = self.backoff_s[0]
                    log.info("broker session %d online on %s: nodes are counted silent from "
                             "now", session, self.broker)
                    try:
                        async for message in client.messages:
                            self._dispatch(message)
                    finally:
                        self._down()
                        await self._leave(client, session)
            except (aiomqtt.MqttError, OSError) as exc:
                self._down()
                log.warning("broker session on %s: %s; reconnecting in %.1f s", self.broker, exc,
                            delay)
            await asyncio.sleep(delay * random.uniform(0.8, 1.2))
            delay = min(self.backoff_s[1], delay * 2)

    def _down(self) -> None:
        self._client, self.online_since_ms = None, None
        self._event().clear()

    async def _leave(self, client: Any, session: int) -> None:
        """A clean stop says ``offline`` itself: a normal disconnect suppresses the will."""
        try:
            await asyncio.wait_for(client.publish(self.topic, self.presence(OFFLINE, session),
                                                  qos=1, retain=True), 2.0)
        except Exception as exc:  # the connection is already gone: its will says it
            log.debug("broker session: offline not published (%s)", exc)

    def _dispatch(self, message: Any) -> None:
        if not message.retain:
            return
        topic = str(message.topic)
        payload = message.payload
        for read in self._reads:
            if topic in read.wanted:
                read.seen.add(topic)
                if isinstance(payload, (bytes, bytearray)) and payload:
                    read.out[topic] = bytes(payload)
                if read.seen == read.wanted:
                    read.done.set()

    async def _connected(self, what: str) -> Any:
        try:
            async with asyncio.timeout(self.timeout_s):
                await self._event().wait()
        except TimeoutError:
            raise UnavailableError(f"MQTT broker {self.broker.host}:{self.broker.port}: cannot "
                                   f"{what} (not connected for {self.timeout_s:g} s)") from None
        return self._client

    async def publish_retained(self, messages: Mapping[str, bytes]) -> None:
        import aiomqtt

        check_sizes(messages, self.max_packet_bytes)
        client = await self._connected("publish")
        try:
            await publish_on(client, messages)
        except (aiomqtt.MqttError, OSError) as exc:
            raise UnavailableError(f"MQTT broker {self.broker.host}:{self.broker.port}: cannot "
                                   f"publish ({exc})") from None

    async def read_retained(self, topic: str, wait_s: float = 1.0) -> bytes | None:
        return (await self.read_many([topic], wait_s)).get(topic)

    async def read_many(self, topics: Iterable[str], wait_s: float = 1.0) -> dict[str, bytes]:
        """The retained payloads of ``topics`` that have one: subscribing makes the broker send
        them; a topic with none is waited for ``wait_s`` once in all."""
        import aiomqtt

        wanted = set(topics)
        if not wanted:
            return {}
        if self._read_lock is None:
            self._read_lock = asyncio.Lock()
        async with self._read_lock:
            client = await self._connected(f"read {len(wanted)} retained topic(s)")
            read = _Read(wanted)
            self._reads.append(read)
            try:
                await client.subscribe([(t, 1) for t in sorted(wanted)])
                try:
                    async with asyncio.timeout(wait_s):
                        await read.done.wait()
                except TimeoutError:
                    pass
                await client.unsubscribe(sorted(wanted))
            except (aiomqtt.MqttError, OSError) as exc:
                raise UnavailableError(f"MQTT broker {self.broker.host}:{self.broker.port}: "
                                       f"cannot read retained topics ({exc})") from None
            finally:
                self._reads.remove(read)
            return read.out
