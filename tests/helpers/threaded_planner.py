"""The real planner server in this process: PlannerRuntime (grpc.aio over TLS, real SQLite, the
NodeGuard) on its own event-loop thread, so tests can use plain blocking gRPC clients."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import grpc

from hulk.v1 import hulk_pb2
from planner.security.credentials import CredentialStore
from planner.security.guard import CallLimits, NodeGuard, RateLimit
from planner.security.tls import server_credentials
from planner.service.ingest import ServerLimits
from planner.service.runtime import PlannerRuntime


class ThreadedPlanner:
    """PlannerRuntime (the real server) with TLS and the NodeGuard, on 127.0.0.1:<free port>."""

    def __init__(self, db: Path, pki: dict[str, Path], *, rate_limit: RateLimit = RateLimit(),
                 client_ca: Path | None = None, secret_hash=None,
                 call_limits: CallLimits = CallLimits(), limits: ServerLimits | None = None):
        self.db = db
        self.credentials = CredentialStore(db, **({"secret_hash": secret_hash}
                                                  if secret_hash else {}))
        self.guard = NodeGuard(self.credentials, rate_limit=rate_limit, call_limits=call_limits)
        self.runtime = PlannerRuntime(
            str(db), "127.0.0.1:0", fleet="test",
            credentials=server_credentials(pki["server_cert"], pki["server_key"], client_ca),
            interceptors=[self.guard], limits=limits)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.port = self._run(self.runtime.start())
        self.target = f"127.0.0.1:{self.port}"

    def _run(self, coro, timeout: float = 30.0):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def in_store(self, fn, *args):
        return self.runtime.store_executor.submit(fn, *args).result(30)

    def sample_count(self) -> int:
        return self.in_store(self.runtime.store.sample_count)

    def node_ids(self) -> set[str]:
        return set(self.in_store(self.runtime.store.node_refs))

    def stop(self) -> None:
        self._run(self.runtime.stop(grace_s=0))
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.credentials.close()


def channel(target: str, pki: dict[str, Path], *, cert: tuple[Path, Path] | None = None) -> grpc.Channel:
    """A TLS channel that trusts the test CA; ``cert`` = (certificate, key) for mutual TLS."""
    creds = grpc.ssl_channel_credentials(
        root_certificates=pki["ca"].read_bytes(),
        private_key=cert[1].read_bytes() if cert else None,
        certificate_chain=cert[0].read_bytes() if cert else None)
    return grpc.secure_channel(target, creds)


def bearer(token: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),)


def register_request(node_id: str, address: str = "127.0.0.1") -> hulk_pb2.RegisterRequest:
    return hulk_pb2.RegisterRequest(
        node_id=node_id, hostname=f"host-{node_id}", agent_version="test", address=address,
        location=hulk_pb2.Location(city=""),
        inventory=hulk_pb2.GpuInventory(unavailable_reason="test: no GPUs"))


def sample(peer_id: str, rtt_ms: float = 1.0, sent_at_ms: int | None = None) -> hulk_pb2.Sample:
    return hulk_pb2.Sample(peer_id=peer_id, sent_at_ms=sent_at_ms or int(time.time() * 1000),
                           kind=hulk_pb2.PROBE_KIND_ICMP, payload_bytes=56, lost=False,
                           rtt_ms=rtt_ms, timeout_ms=2000.0)
