"""Pushing placements to the broker (aiomqtt behind a small interface), and the current plan.

Every message is retained with QoS 1, so an agent that (re)connects later gets its placement from
the broker, and a publish returns only once the broker has acknowledged it. A node that no longer
has a role is cleared with a signed placement without roles (an empty retained message would
carry no signature and no sequence number: agents ignore it). aiomqtt/paho errors become
:class:`hulk.errors.UnavailableError`.

Every message is checked against the broker's packet limit (``BROKER_MAX_PACKET_BYTES``, the
shipped max_packet_size) and what its reader accepts before any is published
(:func:`check_sizes`): a plan too large to push fails with one line and publishes nothing. A push
goes in waves (:func:`publish_waves`), a new summary acknowledged before its placements are sent,
so one that fails part-way never leaves placements that the retained summary does not describe.

Every placement and the summary are signed (``hulk.wire.signing.Signer``) and valid for
``VALIDITY_MS`` (7 days) from their issue time; ``serve --mqtt`` re-signs what it retains once
less than ``RESIGN_BEFORE_MS`` (4 days) is left, so an agent that restarts and re-reads its
retained placement always finds it valid while the planner runs (planner/service/recovery.py).
Each placement signed gets its node's next sequence number (``planner.service.placement_seq``),
so agents can refuse a replayed one.

After the signing key is replaced, serve is given the old public key (the signer's ``previous``):
:class:`RetainedPlan` trusts a retained plan that key signed and re-signs it, summary and
placements, with the new key (the roles unchanged, so no job restarts). A summary no key serve
holds signed is logged once, with what to do, and nothing is planned from it.

:class:`InMemoryPublisher` is a broker in memory, shipped beside :class:`MqttPublisher` for tests
and tools that want the planner's pushes without a broker. :class:`RetainedPlan` is the current
plan (``planner.service.seams.CurrentPlan``) as the broker retains it, signed and verified.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import random
import secrets
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any, Protocol

from hulk.errors import InputError, PlanningError, UnavailableError
from hulk.wire.broker import BrokerAddress, client_tls_kwargs, placement_topic, plan_topic
from hulk.wire.placement import (BROKER_MAX_PACKET_BYTES, MAX_PLACEMENT_BYTES, MAX_SUMMARY_BYTES,
                                 VALIDITY_MS, NodePlacement, PlanSummary, parse_placement,
                                 parse_summary, publish_packet_bytes, summary_bytes)
from hulk.wire.signing import SIGNATURE_FIELD, Signer
from planner.core.placements import build_node_placements, build_summary
from planner.service.placement_seq import ClockSequence, PlacementSequence
from planner.service.store import Store

log = logging.getLogger(__name__)

CLEARED_PLAN_ID = "cleared"       # the plan id of a clear sent with no plan
RESIGN_BEFORE_MS = 4 * 24 * 3600 * 1000


class Publisher(Protocol):
    """What the planner needs from a broker: retained publishes and reading one retained topic."""

    async def publish_retained(self, messages: Mapping[str, bytes]) -> None: ...

    async def read_retained(self, topic: str, wait_s: float = 1.0) -> bytes | None: ...


async def read_retained_many(publisher: Publisher, topics: Iterable[str],
                             wait_s: float = 1.0) -> dict[str, bytes]:
    """Topic -> retained payload of each of ``topics`` that has one: in one connection where the
    publisher can (``read_many``), else one topic at a time."""
    topics = list(topics)
    many = getattr(publisher, "read_many", None)
    if many is not None:
        return await many(topics, wait_s)
    out: dict[str, bytes] = {}
    for topic in topics:
        raw = await publisher.read_retained(topic, wait_s)
        if raw:
            out[topic] = raw
    return out


class InMemoryPublisher:
    """A broker's retained topics in memory: ``retained`` (topic -> payload) and every
    ``publish_retained`` call's messages in ``published``. With ``unavailable`` set, every call
    fails as an unreachable broker does; with ``max_packet_bytes``, a call with a larger message
    publishes nothing (:func:`check_sizes`)."""

    def __init__(self, retained: Mapping[str, bytes] | None = None, *,
                 max_packet_bytes: int | None = None):
        self.retained: dict[str, bytes] = dict(retained or {})
        self.published: list[dict[str, bytes]] = []
        self.unavailable = False
        self.max_packet_bytes = max_packet_bytes

    def _check(self) -> None:
        if self.unavailable:
            raise UnavailableError("MQTT broker (in memory): unavailable")

    async def publish_retained(self, messages: Mapping[str, bytes]) -> None:
        self._check()
        check_sizes(messages, self.max_packet_bytes)
        self.published.append(dict(messages))
        for topic, payload in messages.items():
            if payload:
                self.retained[topic] = payload
            else:                       # an empty retained payload deletes the message
                self.retained.pop(topic, None)

    async def read_retained(self, topic: str, wait_s: float = 1.0) -> bytes | None:
        self._check()
        return self.retained.get(topic)

    async def read_many(self, topics: Iterable[str], wait_s: float = 1.0) -> dict[str, bytes]:
        self._check()
        return {t: self.retained[t] for t in topics if self.retained.get(t)}


class MqttPublisher:
    """aiomqtt client per call: connect, publish (QoS 1, retained), wait for acks, disconnect.

    The shipped broker makes an account's name its client id, so the planner's connections
    (serve's recovery, an operator's ``plan --push``) share one: a newer connection ends an older
    one's session. A call whose connection ends that way is tried again (``attempts`` in all,
    after a short random pause): publishing retained messages twice is harmless.
    ``max_packet_bytes``: the broker's max_packet_size."""

    def __init__(self, broker: BrokerAddress, *, identifier: str | None = None, timeout_s: float = 10.0,
                 client_factory: Callable[..., Any] | None = None, attempts: int = 4,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
                 max_packet_bytes: int = BROKER_MAX_PACKET_BYTES):
        self.broker = broker
        self.max_packet_bytes = max_packet_bytes
        self.identifier = identifier
        self.timeout_s = timeout_s
        self.attempts = attempts
        self._client_factory = client_factory
        self._sleep = sleep

    def _client(self) -> Any:
        factory = self._client_factory
        if factory is None:
            import aiomqtt

            factory = aiomqtt.Client
        # Unique per connection where the broker keeps client ids (another broker configuration).
        identifier = self.identifier or f"hulk-planner-{os.getpid()}-{secrets.token_hex(4)}"
        return factory(self.broker.host, self.broker.port, identifier=identifier,
                       username=self.broker.username, password=self.broker.password,
                       timeout=self.timeout_s, **client_tls_kwargs(self.broker))

    async def _retrying(self, call: Callable[[], Awaitable[Any]], what: str) -> Any:
        import aiomqtt

        for attempt in range(1, self.attempts + 1):
            try:
                return await call()
            except (aiomqtt.MqttError, OSError) as exc:
                if attempt == self.attempts:
                    raise UnavailableError(f"MQTT broker {self.broker.host}:{self.broker.port}: "
                                           f"cannot {what} ({exc})") from None
                log.debug("MQTT %s failed (%s); attempt %d of %d", what, exc, attempt + 1,
                          self.attempts)
                await self._sleep(random.uniform(0.05, 0.3) * attempt)

    async def publish_retained(self, messages: Mapping[str, bytes]) -> None:
        check_sizes(messages, self.max_packet_bytes)

        async def publish() -> None:
            async with self._client() as client:
                await publish_on(client, messages)

        await self._retrying(publish, "publish")

    async def read_retained(self, topic: str, wait_s: float = 1.0) -> bytes | None:
        """The retained payload of ``topic`` (None when there is none within ``wait_s``)."""

        async def read() -> bytes | None:
            async with self._client() as client:
                await client.subscribe(topic, qos=1)
                try:
                    async with asyncio.timeout(wait_s):
                        async for message in client.messages:
                            if message.retain and isinstance(message.payload, (bytes, bytearray)):
                                return bytes(message.payload) or None
                except TimeoutError:
                    return None
            return None

        return await self._retrying(read, f"read {topic}")

    async def read_many(self, topics: Iterable[str], wait_s: float = 1.0) -> dict[str, bytes]:
        """The retained payloads of ``topics`` (those that have one), in one connection: the
        broker sends every retained message on subscribing; a topic with none is waited for
        ``wait_s`` once in all."""
        wanted = set(topics)

        async def read() -> dict[str, bytes]:
            out: dict[str, bytes] = {}
            if not wanted:
                return out
            async with self._client() as client:
                await client.subscribe([(t, 1) for t in sorted(wanted)])
                try:
                    async with asyncio.timeout(wait_s):
                        async for message in client.messages:
                            topic = str(message.topic)
                            if (message.retain and topic in wanted
                                    and isinstance(message.payload, (bytes, bytearray))):
                                if message.payload:
                                    out[topic] = bytes(message.payload)
                                if len(out) == len(wanted):
                                    break
                except TimeoutError:
                    pass
            return out

        return await self._retrying(read, f"read {len(wanted)} retained topic(s)")


async def publish_on(client: Any, messages: Mapping[str, bytes]) -> None:
    """``messages`` retained with QoS 1 on an aiomqtt ``client``, in :func:`publish_waves`; returns
    once the broker acknowledged every one (the first failure is raised)."""
    # aiomqtt warns once per publish above 10 waiting for their acks: thousands of lines for
    # one push of a large fleet.
    client.pending_calls_threshold = max(getattr(client, "pending_calls_threshold", 10),
                                         len(messages) + 10)
    for wave in publish_waves(messages):
        # Publish concurrently; each call returns when the broker's PUBACK arrives.
        results = await asyncio.gather(
            *(client.publish(topic, payload, qos=1, retain=True)
              for topic, payload in wave.items()), return_exceptions=True)
        failed = [r for r in results if isinstance(r, BaseException)]
        if failed:
            raise failed[0]


def check_sizes(messages: Mapping[str, bytes], max_packet_bytes: int | None) -> None:
    """PlanningError (one line, nothing published yet) when a message would not fit the broker's
    ``max_packet_bytes`` (None: no limit) or is larger than its reader accepts (an agent, a
    placement up to MAX_PLACEMENT_BYTES; a planner, a summary up to MAX_SUMMARY_BYTES)."""
    for topic, payload in messages.items():
        kind = ("placement" if topic.endswith("/placement") else
                "plan summary" if topic.endswith("/plan") else "message")
        what = f"the {kind} on {topic}"
        limit = MAX_PLACEMENT_BYTES if kind == "placement" else MAX_SUMMARY_BYTES
        packet = publish_packet_bytes(topic, payload)
        if max_packet_bytes is not None and packet > max_packet_bytes:
            raise PlanningError(f"cannot push: {what} is a {packet:,}-byte MQTT packet, above the "
                                f"broker's max_packet_size of {max_packet_bytes:,} "
                                "(deploy/mosquitto/hulk.conf); nothing was published")
        if len(payload) > limit:
            raise PlanningError(f"cannot push: {what} is {len(payload):,} bytes, above the "
                                f"{limit:,} its readers accept; nothing was published")


def publish_waves(messages: Mapping[str, bytes]) -> list[dict[str, bytes]]:
    """``messages`` in the waves a broker gets them, each acknowledged before the next is sent: a
    new plan summary first, then the placements, a summary's removal last. A push that fails
    part-way so leaves the retained summary describing every placement sent (serve's recovery
    and reconciliation read the plan from it)."""
    summaries = {t: p for t, p in messages.items() if t.endswith("/plan")}
    rest = {t: p for t, p in messages.items() if t not in summaries}
    waves = [{t: p for t, p in summaries.items() if p}, rest,
             {t: p for t, p in summaries.items() if not p}]
    return [wave for wave in waves if wave]


def clears(fleet: str, nodes: Iterable[str], plan_id: str,
           keep: Mapping[str, NodePlacement] | None = None) -> dict[str, NodePlacement]:
    """Placements without roles (unsigned) for ``nodes`` not in ``keep``: what clears them."""
    return {node: NodePlacement(fleet=fleet, node=node, plan_id=plan_id, roles=())
            for node in nodes if node not in (keep or {})}


def sign_plan(node_placements: Mapping[str, NodePlacement], summary: dict[str, Any] | None, *,
              signer: Signer, issued_at_ms: int, validity_ms: int = VALIDITY_MS,
              sequence: PlacementSequence | None = None
              ) -> tuple[dict[str, NodePlacement], dict[str, Any] | None]:
    """Each placement and the summary, signed and valid from ``issued_at_ms`` for ``validity_ms``;
    each placement with its node's next number from ``sequence`` (None: a fresh ClockSequence)."""
    expires = issued_at_ms + validity_ms
    seqs = (sequence or ClockSequence()).next(node_placements, issued_at_ms)
    signed = {node: np_.signed(signer, issued_at_ms=issued_at_ms, expires_at_ms=expires,
                               seq=seqs[node])
              for node, np_ in node_placements.items()}
    if summary is not None:
        summary = signer.sign({**summary, "issued_at_ms": issued_at_ms, "expires_at_ms": expires})
    return signed, summary


def plan_messages(fleet: str, node_placements: Mapping[str, NodePlacement], summary: dict[str, Any] | None,
                  *, clear: Iterable[str] = ()) -> dict[str, bytes]:
    """Topic -> payload for a push: each (signed) node placement and the (signed) summary. The
    ``clear`` nodes must be among the placements (signed ones without roles: :func:`clears`)."""
    unsigned = [node for node in clear if node not in node_placements]
    if unsigned:
        raise ValueError(f"no signed clear for node {unsigned[0]!r}")
    messages = {placement_topic(fleet, node): np_.to_bytes() for node, np_ in node_placements.items()}
    if summary is not None:
        messages[plan_topic(fleet)] = summary_bytes(summary)
    return messages


async def push_plan(publisher: Publisher, fleet: str, node_placements: Mapping[str, NodePlacement],
                    summary: dict[str, Any] | None, *, signer: Signer, issued_at_ms: int,
                    validity_ms: int = VALIDITY_MS, clear: Iterable[str] = (),
                    sequence: PlacementSequence | None = None
                    ) -> tuple[int, dict[str, NodePlacement]]:
    """Sign and publish a plan, the ``clear`` nodes without a placement cleared (signed, under the
    summary's plan id); returns the number of messages the broker acknowledged and the signed
    placements (clears included)."""
    plan_id = str((summary or {}).get("plan_id") or CLEARED_PLAN_ID)
    cleared = clears(fleet, clear, plan_id, node_placements)
    signed, summary = sign_plan({**node_placements, **cleared}, summary, signer=signer,
                                issued_at_ms=issued_at_ms, validity_ms=validity_ms,
                                sequence=sequence)
    messages = plan_messages(fleet, signed, summary)
    await publisher.publish_retained(messages)
    log.info("pushed %d placement(s), cleared %d node(s) on fleet %s", len(node_placements),
             len(cleared), fleet)
    return len(messages), signed


def new_plan_id(now_ms: int) -> str:
    """Plan ids sort by time and differ between plans made in the same millisecond."""
    return f"{now_ms:013d}-{os.urandom(3).hex()}"


async def push_new_plan(publisher: Publisher, plan: Any, net: Any, *, fleet: str, plan_id: str,
                        issued_at_ms: int, signer: Signer, addresses: Mapping[str, str] | None = None,
                        jobs: list[Any] | None = None, sequence: PlacementSequence | None = None
                        ) -> dict[str, NodePlacement]:
    """Push a whole plan: every node of ``net`` with a role gets its placement, every other node
    of ``net`` is cleared, and the summary is replaced. Returns the (signed) placements of the
    nodes with a role."""
    placements = build_node_placements(plan, net, fleet=fleet, plan_id=plan_id, addresses=addresses)
    summary = build_summary(plan, net, fleet=fleet, plan_id=plan_id, issued_at_ms=issued_at_ms,
                            node_placements=placements, jobs=jobs)
    _, signed = await push_plan(publisher, fleet, placements, summary, signer=signer,
                                issued_at_ms=issued_at_ms, clear=net.ids, sequence=sequence)
    return {node: signed[node] for node in placements}


class UntrustedSummary(InputError):
    """The retained summary is signed by no key serve holds (already logged, once)."""


class RetainedPlan:
    """The current plan as ``publisher`` retains it for ``fleet``: read back and verified with
    ``signer``'s key or one it replaced (``signer.previous``; what they signed is re-signed on
    reading, with times from ``clock_ms``), retained messages waited for up to ``read_wait_s``;
    replaced signed, each placement with its node's next number from ``sequence`` (None: a
    ClockSequence)."""

    def __init__(self, publisher: Publisher, *, fleet: str, signer: Signer,
                 read_wait_s: float = 0.3, sequence: PlacementSequence | None = None,
                 clock_ms: Callable[[], int] = lambda: int(time.time() * 1000)):
        self.publisher, self.fleet, self.signer = publisher, fleet, signer
        self.own, self.verifier = signer.verifier(), signer.trusted()
        self.read_wait_s = read_wait_s
        self.sequence = sequence if sequence is not None else ClockSequence()
        self.clock_ms = clock_ms
        self._untrusted: str | None = None       # digest of the untrusted summary logged last

    async def summary(self) -> PlanSummary | None:
        """The verified summary (None: there is none). One signed by a previous key is re-signed
        with the current key first, with every placement of it; one that verifies with no key
        raises :class:`UntrustedSummary`, logged once per message."""
        topic = plan_topic(self.fleet)
        raw = await self.publisher.read_retained(topic, self.read_wait_s)
        if not raw:
            return None
        try:
            return parse_summary(raw, source=topic, verifier=self.own)
        except InputError as exc:
            own_error = exc
        try:
            if self.signer.previous is None:
                raise own_error
            summary = parse_summary(raw, source=topic, verifier=self.signer.previous)
        except InputError as exc:
            self._report_untrusted(raw, exc)
            raise UntrustedSummary(str(exc)) from None
        await self._adopt(summary)
        return summary

    def _report_untrusted(self, raw: bytes, exc: InputError) -> None:
        digest = hashlib.sha256(raw).hexdigest()
        if digest == self._untrusted:
            return
        self._untrusted = digest
        known = "its key or a previous one" if self.signer.previous is not None else "its key"
        log.error("the retained plan summary does not verify with %s (%s): serve places, "
                  "restarts and retires no job until it does; nodes and running jobs are left "
                  "as they are. If the placement-signing key was replaced, restart serve with "
                  "--previous-placement-key OLD.pub (deploy/INSTALL.md, \"Rotating the "
                  "placement-signing key\")", known, exc)

    async def _adopt(self, summary: PlanSummary) -> None:
        """Re-sign a summary a previous key signed, and every placement of its nodes that
        verifies, with the current key: same roles, so agents keep their processes."""
        nodes = sorted({n for job in summary.jobs for n in job.node_ids})
        placements = await self.placements(nodes)
        body = {k: v for k, v in summary.document.items() if k != SIGNATURE_FIELD}
        count = await self.replace(placements, body, issued_at_ms=self.clock_ms())
        log.warning("plan %s was signed by a previous placement-signing key: re-signed its "
                    "summary and %d placement(s) with the current key (%d message(s))",
                    summary.plan_id, len(placements), count)

    async def placements(self, nodes: Iterable[str]) -> dict[str, NodePlacement]:
        out: dict[str, NodePlacement] = {}
        for node in nodes:
            topic = placement_topic(self.fleet, node)
            raw = await self.publisher.read_retained(topic, self.read_wait_s)
            if not raw:
                continue
            try:
                placement = parse_placement(raw, source=topic, verifier=self.verifier)
                if placement.node != node or placement.fleet != self.fleet:
                    raise InputError(f"expected node {node!r} of fleet {self.fleet!r}", path=topic)
            except InputError as exc:
                log.error("current plan: leaving %s alone, it does not verify: %s", topic, exc)
                continue
            out[node] = placement
        return out

    async def absent(self, nodes: Iterable[str]) -> set[str]:
        """The ``nodes`` that have no retained placement at all (deleted, or lost by the
        broker), read in one connection."""
        topics = {placement_topic(self.fleet, node): node for node in nodes}
        held = await read_retained_many(self.publisher, topics, self.read_wait_s)
        return {node for topic, node in topics.items() if topic not in held}

    async def replace(self, placements: Mapping[str, NodePlacement],
                      summary: Mapping[str, Any] | None, *, issued_at_ms: int,
                      clear: Iterable[str] = ()) -> int:
        if summary is not None:
            count, _ = await push_plan(self.publisher, self.fleet, placements, dict(summary),
                                       signer=self.signer, issued_at_ms=issued_at_ms, clear=clear,
                                       sequence=self.sequence)
            return count
        signed, _ = sign_plan({**placements, **clears(self.fleet, clear, CLEARED_PLAN_ID, placements)},
                              None, signer=self.signer, issued_at_ms=issued_at_ms,
                              sequence=self.sequence)
        # No plan any more: the summary goes (only planners read it; it needs no sequence).
        messages = {**plan_messages(self.fleet, signed, None), plan_topic(self.fleet): b""}
        await self.publisher.publish_retained(messages)
        return len(messages)

    async def resend(self, placements: Mapping[str, NodePlacement], *, issued_at_ms: int) -> int:
        """Re-sign ``placements`` (new sequence numbers, fresh times) and retain them; one without
        roles clears its node. The summary is untouched. Returns the number of messages sent."""
        for node, placement in placements.items():
            if placement.node != node or placement.fleet != self.fleet:
                raise ValueError(f"placement of node {placement.node!r} of fleet "
                                 f"{placement.fleet!r} given for node {node!r}")
        signed, _ = sign_plan(placements, None, signer=self.signer, issued_at_ms=issued_at_ms,
                              sequence=self.sequence)
        messages = plan_messages(self.fleet, signed, None)
        await self.publisher.publish_retained(messages)
        return len(messages)


def registered_addresses(db_path: str | None) -> dict[str, str]:
    """node id -> address its agent registered (rendezvous addresses); empty without a store."""
    if not db_path:
        return {}
    with Store(db_path) as store:
        return {r.id: r.address for r in store.node_records() if r.address}
