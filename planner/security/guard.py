"""The planner's gRPC guard: who is calling, may it speak for that node, is it calling too often.

One grpc.aio server interceptor wraps every unary method handler. Before the servicer runs it

1. authenticates the caller from ``authorization: Bearer <token>`` metadata (UnauthenticatedError
   without a valid, unrevoked token),
2. applies the caller's per-node token bucket (RateLimitedError past it; a rejection costs a
   dictionary lookup, so one flooding agent cannot starve the others),
3. compares the verified node id with the ``node_id`` field of the request
   (PermissionDeniedError when they differ) -- the single place this check is made, before
   anything is stored; the servicer can then trust the request's ``node_id``.

Authentication comes before any resource is held: every unary method is served as a
client-streaming handler, which gRPC runs as soon as the call's headers arrive, so the token is
checked before the request body is waited for and a caller without one is refused at once; a
call that holds a slot while its body is on its way is bounded by :class:`CallLimits` (a
deadline for the body, at most so many such calls per node and in all). The public health
methods are bounded the same way, per source and in all, apart from the enrolled nodes' calls,
and ``Health/Watch`` streams per source and in all. So no number of unauthenticated or
half-open calls, from one source or from many, takes the server's concurrent-call slots
(``ServerLimits.max_concurrent_rpcs``) or a waiting place from an enrolled agent. What one
connection holds (streams, handshake, idle time, age) is bounded by the server's options
(planner/service/servicer.py ``connection_options``).

Without a credential store (``serve --insecure``) step 1 is skipped and the claimed node id is
what the bucket is keyed by; the transport warning is logged by ``serve``.
"""

from __future__ import annotations

import asyncio
import logging
import time
import urllib.parse
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import TypeVar

import grpc
from grpc import aio

from hulk.errors import (HulkError, InputError, PermissionDeniedError, RateLimitedError,
                         RequestTimeoutError, UnauthenticatedError, UnavailableError, grpc_status)
from hulk.http_server import source_key
from planner.security.credentials import CredentialStore

log = logging.getLogger(__name__)
T = TypeVar("T")

# Standard health checks stay open: load balancers and `grpc_health_probe` carry no token.
PUBLIC_METHODS = frozenset({"/grpc.health.v1.Health/Check", "/grpc.health.v1.Health/Watch"})
# Request size and batch bounds are the server's (planner/service/ingest.py ServerLimits: 4 MiB per
# message, 10,000 samples per Report), enforced before anything is stored.


class PeerEncodingNoise(logging.Filter):
    """grpcio logs, with a traceback, each request header a peer sent that is not UTF-8 (the call
    is refused all the same: UNAUTHENTICATED), and a refusal it could not send because the core
    had already ended the call (a frame it could not parse: ExecuteBatchError). A client
    without a token could so fill serve's log. Such a record is dropped, or kept as one line
    without the traceback when serve logs at DEBUG; :data:`dropped` counts them."""

    def __init__(self) -> None:
        super().__init__()
        self.dropped = 0

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        if not (text.startswith("Invalid encoding") or "ExecuteBatchError" in text):
            return True
        self.dropped += 1
        record.exc_info, record.exc_text, record.stack_info = None, None, None
        return logging.getLogger().isEnabledFor(logging.DEBUG)


def quiet_peer_encoding_errors() -> PeerEncodingNoise:
    """Install :class:`PeerEncodingNoise` on grpcio's logger (once); returns it."""
    logger = logging.getLogger("grpc._cython.cygrpc")
    for existing in logger.filters:
        if isinstance(existing, PeerEncodingNoise):
            return existing
    noise = PeerEncodingNoise()
    logger.addFilter(noise)
    return noise


@dataclass(frozen=True)
class CallLimits:
    """What a caller may hold before its call is served. ``body_timeout_s``: the request message
    must arrive within this of the call's start (DEADLINE_EXCEEDED); ``pending_*``: calls with no
    verified token (the public health methods; every call without a credential store) waiting
    for their body, per source address (an IPv6 source by its /64) and in all;
    ``enrolled_pending_*``: calls whose token was verified waiting for their body, per node and
    in all -- counted apart, so no number of unauthenticated calls, from an agent's own address
    or from many, takes a place an enrolled agent's call needs; ``watchers_*``: open
    ``Health/Watch`` streams. Past a cap a call is refused at once (RESOURCE_EXHAUSTED).
    Unauthenticated calls hold at most ``pending_total + watchers_total`` (320) of
    ``ServerLimits.max_concurrent_rpcs`` (1024), enrolled ones waiting for their body at most
    ``enrolled_pending_total``; the rest is left to calls that are being served."""

    body_timeout_s: float = 10.0
    pending_per_source: int = 16
    pending_total: int = 256
    enrolled_pending_per_node: int = 16
    enrolled_pending_total: int = 512
    watchers_per_source: int = 4
    watchers_total: int = 64


class _Counts:
    """Open holds per source (or per node: ``whose``) and in all, under caps."""

    def __init__(self, per_source: int, total: int, what: str, whose: str = "from one address"):
        self.per_source, self.total, self.what, self.whose = per_source, total, what, whose
        self.by_source: dict[str, int] = {}
        self.open = 0

    def take(self, source: str) -> None:
        held = self.by_source.get(source, 0)
        if held >= self.per_source:
            raise RateLimitedError(f"{self.what}: at most {self.per_source} at once "
                                   f"{self.whose}; retry later")
        if self.open >= self.total:
            raise RateLimitedError(f"{self.what}: at most {self.total} at once; retry later")
        self.by_source[source] = held + 1
        self.open += 1

    def give(self, source: str) -> None:
        self.open -= 1
        left = self.by_source.get(source, 1) - 1
        if left > 0:
            self.by_source[source] = left
        else:
            self.by_source.pop(source, None)


class TokenBucket:
    """``rate`` tokens a second up to ``burst``; each call takes one."""

    __slots__ = ("rate", "burst", "tokens", "stamp")

    def __init__(self, rate: float, burst: float, now: float):
        self.rate, self.burst, self.tokens, self.stamp = rate, burst, burst, now

    def take(self, now: float) -> bool:
        self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return True
        return False


@dataclass(frozen=True)
class RateLimit:
    """Calls a second per node and the burst allowed above it.

    Default: an agent reports once per probe round batch and heartbeats every few seconds, i.e.
    well under 1 call/s in normal operation; 20/s with a burst of 40 leaves room for catching up
    after an outage (spooled batches) without letting one node monopolise the planner.
    """

    per_second: float = 20.0
    burst: float = 40.0


class RateLimiter:
    """A token bucket per key, least recently used evicted past ``max_keys``."""

    def __init__(self, limit: RateLimit, *, clock: Callable[[], float] = time.monotonic,
                 max_keys: int = 100_000):
        self.limit, self._clock, self._max_keys = limit, clock, max_keys
        self._buckets: OrderedDict[str, TokenBucket] = OrderedDict()
        self.rejected: dict[str, int] = {}

    def allow(self, key: str) -> bool:
        now = self._clock()
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = self._buckets[key] = TokenBucket(self.limit.per_second, self.limit.burst, now)
            if len(self._buckets) > self._max_keys:
                self._buckets.popitem(last=False)
        else:
            self._buckets.move_to_end(key)
        if bucket.take(now):
            return True
        self.rejected[key] = self.rejected.get(key, 0) + 1
        return False

    def exhausted(self, key: str) -> bool:
        """Whether ``key`` has no call left right now (nothing is spent)."""
        bucket = self._buckets.get(key)
        if bucket is None:
            return False
        now = self._clock()
        return min(bucket.burst, bucket.tokens + (now - bucket.stamp) * bucket.rate) < 1.0


def bearer_token(metadata: Iterable[tuple[str, str | bytes]] | None) -> str | None:
    for key, value in metadata or ():
        if key.lower() == "authorization":
            text = value.decode("latin-1") if isinstance(value, bytes) else value
            scheme, _, token = text.strip().partition(" ")
            if scheme.lower() == "bearer" and token.strip():
                return token.strip()
            return ""  # present but not a bearer token
    return None


def _peer_host(context: aio.ServicerContext) -> str:
    peer = context.peer() or ""          # e.g. "ipv4:127.0.0.1:54321", "ipv6:[::1]:5"
    return peer.rsplit(":", 1)[0]


def _source(context: aio.ServicerContext) -> str:
    """The source a per-source cap counts (hulk.http_server.source_key: an IPv6 one by /64)."""
    host = urllib.parse.unquote(_peer_host(context)).partition(":")[2] or _peer_host(context)
    return source_key(host.strip("[]"))


class NodeGuard(aio.ServerInterceptor):
    """Authenticate, rate-limit and bind every call to the node its credential names.

    ``credentials`` None means no authentication (insecure development mode).

    The token is checked from the call's metadata before its message is parsed: a caller without
    a valid token never gets a request deserialised. Almost every token is settled by the
    credential store's keyed tag (a row read and an HMAC, no scrypt), whoever sends it, so a bad
    token costs the planner no more than that and an enrolled node is never queued behind one.
    Only a token whose row has no current tag needs scrypt; those checks are bounded
    three times: at most ``max_verifying`` at once, and ``failed_auth_limit`` failures per token id
    and per source address, past either of which scrypt is refused. The tag check is never
    limited, so a hostile caller behind the same NAT, or one that spends a known token id's
    allowance, does not lock out an enrolled node.

    The checks raise :class:`hulk.errors.HulkError` subclasses; :meth:`_enforce` is the one place
    a refusal becomes a gRPC status (``hulk.errors.grpc_status``) and is counted.
    """

    def __init__(self, credentials: CredentialStore | None, *,
                 rate_limit: RateLimit = RateLimit(),
                 failed_auth_limit: RateLimit = RateLimit(per_second=0.2, burst=5.0),
                 max_verifying: int = 2,
                 public_methods: frozenset[str] = PUBLIC_METHODS,
                 call_limits: CallLimits = CallLimits(),
                 clock: Callable[[], float] = time.monotonic):
        self.credentials = credentials
        self.node_limiter = RateLimiter(rate_limit, clock=clock)
        self.auth_failures = RateLimiter(failed_auth_limit, clock=clock)
        self.peer_failures = RateLimiter(failed_auth_limit, clock=clock)
        self.max_verifying = max_verifying
        self._verifying: asyncio.Semaphore | None = None   # made on the server's loop
        self.public_methods = public_methods
        self.call_limits = call_limits
        self.pending = _Counts(call_limits.pending_per_source, call_limits.pending_total,
                               "calls waiting for their request")
        self.enrolled_pending = _Counts(call_limits.enrolled_pending_per_node,
                                        call_limits.enrolled_pending_total,
                                        "calls waiting for their request",
                                        whose="of one node")
        self.watchers = _Counts(call_limits.watchers_per_source, call_limits.watchers_total,
                                "Health/Watch streams")
        self.counts = {"ok": 0, "unauthenticated": 0, "permission_denied": 0,
                       "resource_exhausted": 0, "unavailable": 0}

    async def intercept_service(
            self, continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
            details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        if handler is None:
            return handler
        metadata = tuple(details.invocation_metadata or ())
        parse = handler.request_deserializer or (lambda data: data)
        public = details.method in self.public_methods

        async def checked(requests, context: aio.ServicerContext):
            """The parsed request: the token checked first (from the headers, before the body is
            waited for), then the body within its deadline, then the node bound to the call."""
            verified: str | None = None
            if self.credentials is not None and not public:
                verified = await self._enforce(
                    context, self._authenticate(metadata, details.method, _peer_host(context)))
            # A verified call waits among its node's calls, any other among its source's.
            counts, key = ((self.pending, _source(context)) if verified is None
                           else (self.enrolled_pending, verified))
            data = await self._enforce(context, self._body(requests, counts, key))
            request = parse(data)
            if not public:
                await self._enforce(context, self._admit(request, verified, context))
            return request

        if handler.unary_unary is not None:
            inner = handler.unary_unary

            async def guarded(requests, context):
                return await inner(await checked(requests, context), context)

            return grpc.stream_unary_rpc_method_handler(
                guarded, request_deserializer=None,
                response_serializer=handler.response_serializer)
        if handler.unary_stream is not None:
            inner_stream = handler.unary_stream

            async def guarded_stream(requests, context):
                source = _source(context)
                if public:
                    await self._enforce(context, self._hold(self.watchers, source))
                try:
                    result = inner_stream(await checked(requests, context), context)
                    if hasattr(result, "__aiter__"):
                        async for item in result:
                            await context.write(item)
                    else:                    # a servicer that writes to the context itself
                        await result
                finally:
                    if public:
                        self.watchers.give(source)

            return grpc.stream_stream_rpc_method_handler(
                guarded_stream, request_deserializer=None,
                response_serializer=handler.response_serializer)
        if public:
            return handler
        return self._refusal(handler, PermissionDeniedError(
            # Client-streaming methods carry the node id only inside messages; none exist in
            # the contract, so refuse rather than let one through unchecked.
            f"{details.method}: streaming requests are not accepted"))

    async def _hold(self, counts: _Counts, source: str) -> None:
        counts.take(source)

    async def _body(self, requests, counts: _Counts, key: str) -> bytes:
        """The call's one request message, within ``body_timeout_s``; while it is awaited the
        call counts against ``counts``'s caps (for ``key``: its source or its node)."""
        counts.take(key)
        try:
            async with asyncio.timeout(self.call_limits.body_timeout_s):
                async for data in requests:
                    return data
        except TimeoutError:
            raise RequestTimeoutError(f"no request message within "
                                      f"{self.call_limits.body_timeout_s:g} s") from None
        finally:
            counts.give(key)
        raise InputError("the call ended without a request message", field="request")

    def _refusal(self, handler: grpc.RpcMethodHandler, exc: HulkError) -> grpc.RpcMethodHandler:
        """A handler that ends the call with ``exc`` and never parses the request's bytes."""

        async def refuse(request, context):
            async def fail() -> None:
                raise exc
            await self._enforce(context, fail())

        if handler.unary_stream is not None:
            async def refuse_stream(request, context):
                await refuse(request, context)
                yield  # pragma: no cover - refuse always aborts

            return grpc.unary_stream_rpc_method_handler(
                refuse_stream, request_deserializer=_discard,
                response_serializer=handler.response_serializer)
        return grpc.unary_unary_rpc_method_handler(
            refuse, request_deserializer=_discard, response_serializer=handler.response_serializer)

    async def _enforce(self, context: aio.ServicerContext, check: Awaitable[T]) -> T:
        """Run ``check`` and return its value; a HulkError it raises ends the call with that
        error's status."""
        try:
            return await check
        except HulkError as exc:
            code = grpc_status(exc)
            key = code.name.lower()
            self.counts[key] = self.counts.get(key, 0) + 1
            # Where the core ended the call first (a malformed frame), abort fails with
            # ExecuteBatchError: PeerEncodingNoise keeps its traceback out of the log.
            await context.abort(code, str(exc))
            raise  # pragma: no cover - abort raises

    async def _admit(self, request, verified: str | None, context: aio.ServicerContext) -> None:
        claimed = getattr(request, "node_id", None)
        node_id = verified if verified is not None else (claimed or _peer_host(context))
        if not self.node_limiter.allow(node_id):
            limit = self.node_limiter.limit.per_second
            raise RateLimitedError(f"node {node_id!r} exceeded {limit:g} calls/s; retry with backoff")
        if verified is not None and claimed is not None and claimed != verified:
            log.warning("node %r (peer %s) sent a request as node %r: denied",
                        verified, context.peer(), claimed)
            raise PermissionDeniedError(f"the credential is for node {verified!r}, the request "
                                        f"claims node {claimed!r}")
        self.counts["ok"] += 1

    async def _authenticate(self, metadata, method: str, peer: str) -> str:
        token = bearer_token(metadata)
        if not token:
            raise UnauthenticatedError("missing 'authorization: Bearer <token>' metadata (enrol "
                                       "the node with `hulk-planner enroll NODE_ID`)")
        token_id = token.split(".")[1] if token.count(".") == 2 else "malformed"
        try:
            return await self._verify(token, token_id, peer)
        except UnauthenticatedError as exc:
            # Spend one of the token id's and the address's failure allowances.
            self.auth_failures.allow(token_id)
            self.peer_failures.allow(peer)
            log.info("unauthenticated call to %s from %s: %s", method, peer, exc)
            raise
        except RateLimitedError:
            raise
        except HulkError as exc:                 # the store's trouble stays in the planner's log
            log.error("credential check failed: %s", exc)
            raise UnavailableError("credential store unavailable") from None

    async def _verify(self, token: str, token_id: str, peer: str) -> str:
        store = self.credentials
        assert store is not None
        node_id = store.check_tag(token)         # a row read and an HMAC, no scrypt
        if node_id is not None:
            return node_id
        if self.auth_failures.exhausted(token_id):
            raise RateLimitedError("too many failed authentications with this token; retry later")
        if self.peer_failures.exhausted(peer):
            raise RateLimitedError("too many failed authentications from this address; retry later")
        if self._verifying is None:
            self._verifying = asyncio.Semaphore(self.max_verifying)
        async with self._verifying:
            # scrypt off the event loop, a bounded number at once: other nodes' calls keep
            # flowing, and untagged tokens cost at most max_verifying cores.
            return await asyncio.to_thread(store.verify_slowly, token)


def _discard(data: bytes) -> None:
    """The request deserializer of a refused call: its bytes are never parsed."""
    return None
