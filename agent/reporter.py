"""The agent's side of the gRPC contract (hulk.v1.Planner), and the loop that drains the spool.

- PlannerClient is the small interface the runtime uses; GrpcPlannerClient implements it with
  grpc.aio and is the one place where grpc errors become hulk.errors.
- Reporter sends the spool's batches (per-round summaries, throughput test results, and raw
  samples an older agent spooled); a batch leaves the spool only when the planner acknowledged
  it (stored now or already stored: ``duplicate``). A retry reuses the batch id.
- Backoff: exponential with jitter and a cap, for a planner that is down.
"""

from __future__ import annotations

import asyncio
import logging
import random
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import grpc

from agent.clock import Clock, SystemClock
from agent.metrics import NO_EVENTS, AgentEvents
from agent.spool import Spool, SpoolFullError
from hulk import errors
from hulk.plural import count
from hulk.v1 import hulk_pb2_grpc
from hulk.wire.records import (HeartbeatRequest, HeartbeatResult, LaunchStatus, PeerSummary,
                               ProbeSample, RegisterAnswer, RegisterRequest, ReportRequest,
                               ReportResult)
from hulk.wire.throughput import ThroughputResult

log = logging.getLogger(__name__)


# ------------------------------------------------------------------------------------ backoff

AGENT_BACKOFF_CAP_S = 5.0   # back within seconds of a restarted planner (its node timeout is 30 s)


class Backoff:
    """Delays initial * factor**n, capped, each scaled by a random factor in [1 - jitter, 1]."""

    def __init__(self, initial_s: float = 1.0, factor: float = 2.0,
                 cap_s: float = AGENT_BACKOFF_CAP_S,
                 jitter: float = 0.5, rng: random.Random | None = None):
        if not (initial_s > 0 and factor >= 1 and cap_s >= initial_s and 0 <= jitter <= 1):
            raise ValueError("backoff needs initial > 0, factor >= 1, cap >= initial, "
                             "0 <= jitter <= 1")
        self.initial_s, self.factor, self.cap_s, self.jitter = initial_s, factor, cap_s, jitter
        self._rng = rng or random.Random()
        self.attempt = 0

    def ceiling(self, attempt: int) -> float:
        """The un-jittered delay after ``attempt`` failures (attempt >= 1)."""
        exponent = min(attempt - 1, 64)  # no float overflow after a long outage
        return min(self.cap_s, self.initial_s * self.factor ** exponent)

    def next_delay(self) -> float:
        self.attempt += 1
        ceiling = self.ceiling(self.attempt)
        return ceiling * (1 - self.jitter * self._rng.random())

    def reset(self) -> None:
        self.attempt = 0


# -------------------------------------------------------------------------------- errors

def translate_rpc_error(err: grpc.RpcError, method: str) -> errors.HulkError:
    """A grpc error as the matching hulk error, with a one-line message."""
    code = err.code() if hasattr(err, "code") else None
    details = (err.details() if hasattr(err, "details") else None) or str(code)
    return errors.from_grpc(code, f"planner {method}: {details}")


# ------------------------------------------------------------------------------------ clients

class PlannerClient(Protocol):
    async def register(self, request: RegisterRequest) -> RegisterAnswer: ...

    async def report(self, node_id: str, batch_id: str,
                     samples: tuple[ProbeSample | PeerSummary | ThroughputResult, ...],
                     spool_dropped: int) -> ReportResult: ...

    async def heartbeat(self, node_id: str, time_ms: int, spool_depth: int, spool_dropped: int,
                        launch: LaunchStatus) -> HeartbeatResult: ...

    async def close(self) -> None: ...


RECONNECT_BACKOFF_MS = (500, 2_000)   # the channel's first and longest wait before reconnecting


def _read_pem(path: Path | None, what: str) -> bytes | None:
    if path is None:
        return None
    try:
        return path.read_bytes()
    except OSError as err:
        raise errors.ConfigError(f"cannot read the {what}: {err.strerror or err}",
                                 path=str(path)) from None


def make_channel(target: str, *, insecure: bool, ca: Path | None,
                 client_cert: Path | None = None,
                 client_key: Path | None = None) -> grpc.aio.Channel:
    """A channel to the planner: TLS verified with ``ca`` (None: the system's CAs), presenting
    ``client_cert`` and ``client_key`` when given (for a planner run with --client-ca)."""
    options = [("grpc.keepalive_time_ms", 60_000), ("grpc.max_receive_message_length", 16 << 20),
               # gRPC's own reconnect backoff grows to 2 minutes while the planner is down; the
               # agent then reaches a planner that is back only at its channel's next try, which
               # the planner's node timeout may not wait for (a restart after a long outage
               # would call running nodes silent and re-plan their jobs). Retry every 2 s at most.
               ("grpc.initial_reconnect_backoff_ms", RECONNECT_BACKOFF_MS[0]),
               ("grpc.min_reconnect_backoff_ms", RECONNECT_BACKOFF_MS[0]),
               ("grpc.max_reconnect_backoff_ms", RECONNECT_BACKOFF_MS[1])]
    if insecure:
        log.warning("gRPC to %s is plaintext (--insecure): anyone on the path can read and forge "
                    "reports", target)
        return grpc.aio.insecure_channel(target, options=options)
    if (client_cert is None) != (client_key is None):
        raise errors.ConfigError("a client certificate needs its key, and the key its "
                                 "certificate", field="client_cert")
    root = _read_pem(ca, "CA certificate")
    chain = _read_pem(client_cert, "client certificate")
    key = _read_pem(client_key, "client private key")
    credentials = grpc.ssl_channel_credentials(root_certificates=root, private_key=key,
                                               certificate_chain=chain)
    return grpc.aio.secure_channel(target, credentials, options=options)


class GrpcPlannerClient:
    """PlannerClient over a grpc.aio channel; sends ``authorization: Bearer <token>`` if set."""

    def __init__(self, channel: grpc.aio.Channel, *, token: str = "", call_timeout_s: float = 10.0):
        self._channel = channel
        self._stub = hulk_pb2_grpc.PlannerStub(channel)
        self._metadata = (("authorization", f"Bearer {token}"),) if token else ()
        self.call_timeout_s = call_timeout_s

    @classmethod
    def connect(cls, target: str, *, insecure: bool, ca: Path | None = None, token: str = "",
                call_timeout_s: float = 10.0, client_cert: Path | None = None,
                client_key: Path | None = None) -> GrpcPlannerClient:
        return cls(make_channel(target, insecure=insecure, ca=ca, client_cert=client_cert,
                                client_key=client_key),
                   token=token, call_timeout_s=call_timeout_s)

    async def _call(self, method: str, request):
        try:
            return await getattr(self._stub, method)(request, timeout=self.call_timeout_s,
                                                     metadata=self._metadata)
        except grpc.RpcError as err:
            raise translate_rpc_error(err, method) from None

    async def register(self, request: RegisterRequest) -> RegisterAnswer:
        return RegisterAnswer.from_proto(await self._call("Register", request.to_proto()))

    async def report(self, node_id: str, batch_id: str,
                     samples: tuple[ProbeSample | PeerSummary | ThroughputResult, ...],
                     spool_dropped: int) -> ReportResult:
        """One Report; ``samples`` may mix summaries, throughput results and raw samples (each
        kind goes in its field)."""
        summaries = tuple(s for s in samples if isinstance(s, PeerSummary))
        throughput = tuple(s for s in samples if isinstance(s, ThroughputResult))
        raw = tuple(s for s in samples if isinstance(s, ProbeSample)) \
            if summaries or throughput else samples
        request = ReportRequest(node_id, batch_id, raw, spool_dropped, summaries, throughput)
        return ReportResult.from_proto(await self._call("Report", request.to_proto()))

    async def heartbeat(self, node_id: str, time_ms: int, spool_depth: int, spool_dropped: int,
                        launch: LaunchStatus) -> HeartbeatResult:
        request = HeartbeatRequest(node_id, time_ms, spool_depth, spool_dropped, launch)
        return HeartbeatResult.from_proto(await self._call("Heartbeat", request.to_proto()))

    async def close(self) -> None:
        await self._channel.close()


# ------------------------------------------------------------------------------- the reporter

class Reporter:
    """Drains the spool into Report calls, oldest first, one batch at a time.

    A batch the planner refuses as invalid is dropped at once (counted). One it fails on
    (INTERNAL, UNKNOWN: a planner bug, perhaps a value it cannot store) is retried with backoff,
    and set aside as dropped after ``give_up_after`` failures in a row, so one bad batch cannot
    block the spool. A planner that is down, rate-limits or refuses the token says nothing
    about the batch: that is retried for as long as it takes.
    """

    GIVE_UP_AFTER = 8     # failures of one batch in a row (about 2 minutes of backoff)

    def __init__(self, node_id: str, spool: Spool, client: PlannerClient, *,
                 max_batch: int = 500, backoff: Backoff | None = None,
                 clock: Clock | None = None, linger_s: float = 5.0,
                 on_unregistered: Callable[[], None] | None = None,
                 give_up_after: int = GIVE_UP_AFTER, events: AgentEvents = NO_EVENTS):
        self.node_id = node_id
        self.spool = spool
        self.client = client
        self.max_batch = max_batch
        self.backoff = backoff or Backoff()
        self._clock = clock or SystemClock()
        # A partial batch waits up to linger_s for more samples: one Report per round would
        # cost more CPU than all the probing.
        self.linger_s = linger_s
        self._on_unregistered = on_unregistered
        self.give_up_after = give_up_after
        self.events = events   # metrics (agent/metrics.py)
        self._batch_id: str | None = None     # the batch of the last Report sent
        self._failing: tuple[str | None, int] = (None, 0)   # (batch, failures in a row)
        self._wake = asyncio.Event()
        self.sent_batches = 0
        self.sent_samples = 0

    def wake(self) -> None:
        """New samples are in the spool (called by the prober's sink)."""
        self._wake.set()

    async def send_one(self) -> int | None:
        """Send the next batch; returns how many samples the planner acknowledged, None when
        the spool is empty. Raises HulkError (the batch stays spooled under the same id)."""
        batch = self.spool.take_batch(self.max_batch)
        if batch is None:
            return None
        self._batch_id = batch.batch_id
        result = await self.client.report(self.node_id, batch.batch_id, batch.samples,
                                          self.spool.dropped)
        self.spool.ack(batch.batch_id)
        self.sent_batches += 1
        self.sent_samples += len(batch.samples)
        self.events.reported(len(batch.samples), result.rejected, result.duplicate)
        if result.duplicate:
            log.info("batch %s was already stored by the planner", batch.batch_id)
        if result.rejected:
            log.info("planner rejected %d of %s in batch %s", result.rejected,
                     count(len(batch.samples), "sample"), batch.batch_id)
        return len(batch.samples)

    async def run(self) -> None:
        while True:
            try:
                sent = await self.send_one()
            except errors.UnavailableError as err:
                await self._back_off(err)
                continue
            except errors.NotFoundError as err:
                log.warning("%s; registering again", err)
                if self._on_unregistered is not None:
                    self._on_unregistered()
                await self._back_off(err)
                continue
            except errors.InputError as err:
                # The planner refuses this batch for good: retrying would block the spool.
                self.events.report_failed(err)
                batch = self.spool.take_batch(self.max_batch)
                if batch is not None:
                    dropped = self.spool.discard(batch.batch_id)
                    log.error("%s; dropped batch %s (%s)", err, batch.batch_id, count(dropped, "sample"))
                continue
            except SpoolFullError as err:
                await self._back_off(err)  # an ack needs a little room: it comes back
                continue
            except errors.StoreError:
                raise  # the spool is broken: the runtime decides
            except errors.HulkError as err:
                if type(err) is errors.HulkError and self._set_aside(err):
                    continue  # INTERNAL and such: the planner failed on this batch
                await self._back_off(err)
                continue
            self._failing = (None, 0)
            self.backoff.reset()
            if sent is None or sent < self.max_batch:
                await self._linger()

    def _set_aside(self, err: errors.HulkError) -> bool:
        """Count a failure of the current batch; past the bound, drop it (counted, logged
        once). Returns whether it was dropped."""
        batch_id, failures = self._failing
        failures = failures + 1 if batch_id == self._batch_id else 1
        self._failing = (self._batch_id, failures)
        if self._batch_id is None or failures < self.give_up_after:
            return False
        dropped = self.spool.discard(self._batch_id)
        log.error("%s: the planner failed on batch %s %s in a row; set its %s "
                  "aside as dropped so later ones can flow", err, self._batch_id,
                  count(failures, "time"), count(dropped, "sample"))
        self._failing = (None, 0)
        self.backoff.reset()
        return True

    async def _linger(self) -> None:
        """Wait until a full batch is spooled or linger_s has passed."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.linger_s
        while self.spool.stored < self.max_batch:
            remaining = deadline - loop.time()
            if remaining <= 0:
                return
            self._wake.clear()
            # asyncio.timeout, not wait_for: in 3.11 wait_for swallows a cancel that comes as
            # the event is set, and the agent's stop would then wait for this loop forever.
            try:
                async with asyncio.timeout(remaining):
                    await self._wake.wait()
            except TimeoutError:
                return

    async def _back_off(self, err: errors.HulkError) -> None:
        self.events.report_failed(err)
        delay = self.backoff.next_delay()
        log.warning("report failed (%s); retrying in %.1f s (spool holds %s)",
                    err, delay, count(self.spool.depth, "sample"))
        await self._clock.sleep(delay)

    async def flush(self, deadline_s: float) -> int:
        """On shutdown: send what can be sent within ``deadline_s``, what memory holds included
        (saved first; sent as it is if the disk has no room even then). Returns batches sent."""
        sent = 0
        try:
            async with asyncio.timeout(deadline_s):
                while True:
                    self.spool.save()  # acknowledged batches leave room for what memory holds
                    if not await self.send_one():
                        break
                    sent += 1
                while self.spool.held:
                    await self._send_held()
                    sent += 1
        except (TimeoutError, errors.HulkError) as err:
            log.info("flush stopped after %s (%s); %s spooled", count(sent, "batch", "batches"),
                     str(err) or "deadline", count(self.spool.depth, "sample"))
        return sent

    async def _send_held(self) -> None:
        samples = self.spool.held_batch(self.max_batch)
        batch_id = uuid.uuid4().hex
        await self.client.report(self.node_id, batch_id, samples, self.spool.dropped)
        self.spool.forget_held(len(samples))
        self.sent_batches += 1
        self.sent_samples += len(samples)
        log.info("sent %s the disk had no room for as batch %s", count(len(samples), "sample"),
                 batch_id)
