"""What the hostile round's classes share (bench/hostile_round.py): an outcome, the CLI run in a
subprocess and the rule for a clean refusal, and a real `hulk-planner serve` over TLS with
enrolled nodes (optionally its dashboard and /metrics), with the enrolled agent's check."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = ROOT = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

CLI = [sys.executable, "-m", "planner.cli"]
FLEET = ROOT / "examples" / "fleets" / "lab-5.json"
JOBS = ROOT / "examples" / "jobs.yaml"
LIMIT_S = 60.0
ENROLLED_S = 1.0                 # an enrolled agent's Register/Heartbeat must answer within this


@dataclass
class Outcome:
    probe: str
    held: bool
    code: int | str | None
    seconds: float
    detail: str
    expected: str = ""
    where: str = ""              # the file/line suspected, for a failure


def run_cli(args: list[str], limit_s: float = LIMIT_S, env: dict | None = None,
            ) -> tuple[int | None, str, float]:
    """(exit code, stderr+stdout, seconds); code None when it ran past the limit."""
    start = time.monotonic()
    try:
        done = subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=limit_s,
                              cwd=ROOT, env={**os.environ, **(env or {})})
    except subprocess.TimeoutExpired:
        return None, "ran past the limit", time.monotonic() - start
    return done.returncode, (done.stderr + done.stdout), time.monotonic() - start


def refused_cleanly(code: int | None, out: str, names: str, *, may_accept: bool = False,
                    codes: tuple[int, ...] = (2,)) -> tuple[bool, str]:
    """An exit code of ``codes``, no traceback, and an error line that names ``names`` (a
    file's name); with ``may_accept`` a success holds too (the value is within its bounds)."""
    if code is None:
        return False, "hang"
    if "Traceback" in out:
        return False, "traceback"
    if may_accept and code == 0:
        return True, "accepted: within its bounds"
    lines = [ln for ln in out.strip().splitlines() if ln.strip()]
    if code not in codes:
        return False, f"exit {code}: {lines[-1][:200] if lines else ''}"
    if any("internal error" in ln for ln in lines):
        return False, f"an internal error, not a clear one: {lines[-1][:200]}"
    if not lines or names not in lines[-1]:
        return False, f"last line does not name {names}: {lines[-1:]!r}"
    return True, lines[-1][:200]


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else "absent"


# ------------------------------------------------------------------------------ a real serve

@dataclass
class Serve:
    """`hulk-planner serve` over TLS on 127.0.0.1 with nodes n1, n2 enrolled (tokens issued
    before it starts); with ``http`` also its dashboard (a token) and /metrics."""

    work: Path
    http: bool = False
    extra: list[str] = field(default_factory=list)
    nodes: tuple[str, ...] = ("n1", "n2")

    def __post_init__(self) -> None:
        from planner.security.credentials import CredentialStore
        from planner.security.tls import init_pki

        self.work.mkdir(parents=True, exist_ok=True)
        self.pki = init_pki(self.work / "pki", ["127.0.0.1", "localhost"])
        self.ca = self.pki["ca"].read_bytes()
        self.db = self.work / "planner.sqlite"
        store = CredentialStore(self.db)
        self.tokens = {n: store.issue(n).token for n in self.nodes}
        store.close()
        self.dashboard_token = "hostile-round-operator-" + os.urandom(8).hex()
        self.proc = None
        self.log = self.work / "serve.log"

    def args(self) -> list[str]:
        from bench.planner_process import free_port

        out = ["--tls-cert", str(self.pki["server_cert"]), "--tls-key", str(self.pki["server_key"]),
               *self.extra]
        if self.http:
            token = self.work / "dashboard.token"
            token.write_text(self.dashboard_token + "\n")
            token.chmod(0o600)
            self.dashboard_port, self.metrics_port = free_port(), free_port()
            out += ["--dashboard", f"127.0.0.1:{self.dashboard_port}", "--dashboard-token",
                    str(token), "--metrics", f"127.0.0.1:{self.metrics_port}"]
        return out

    def start(self) -> Serve:
        from bench.planner_process import start_planner

        self.proc, self.target = start_planner(self.db, self.log, self.args(), start_timeout_s=60)
        self.log_offset = 0
        return self

    def stop(self) -> None:
        from bench.planner_process import stop_planner

        if self.proc is not None:
            stop_planner(self.proc, timeout_s=20)
            self.proc = None

    def new_log(self) -> str:
        """What serve logged since the last call."""
        text = self.log.read_text(errors="replace")
        new, self.log_offset = text[self.log_offset:], len(text)
        return new

    def channel(self):
        import grpc

        return grpc.secure_channel(self.target, grpc.ssl_channel_credentials(self.ca))

    def bearer(self, node: str = "n1") -> tuple[tuple[str, str], ...]:
        return (("authorization", f"Bearer {self.tokens[node]}"),)

    def rss_mib(self) -> float:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return float("nan")


def register_request(node: str, address: str = "127.0.0.1", **extra):
    from hulk.v1 import hulk_pb2

    fields = dict(node_id=node, hostname=f"host-{node}", agent_version="hostile-round",
                  address=address, location=hulk_pb2.Location(city=""),
                  inventory=hulk_pb2.GpuInventory(unavailable_reason="hostile round: no GPUs"))
    return hulk_pb2.RegisterRequest(**{**fields, **extra})


def enrolled_answers(serve: Serve, stub=None, node: str = "n1", fresh: bool = True,
                     ) -> tuple[bool, str]:
    """An enrolled agent's Register and Heartbeat, each answered within ENROLLED_S (over a new
    connection when ``fresh``: an agent that reconnects must get in too)."""
    import grpc

    from hulk.v1 import hulk_pb2, hulk_pb2_grpc

    channel = serve.channel() if fresh or stub is None else None
    if channel is not None:
        stub = hulk_pb2_grpc.PlannerStub(channel)
    worst, why = 0.0, ""
    try:
        for call, request in ((stub.Register, register_request(node)),
                              (stub.Heartbeat, hulk_pb2.HeartbeatRequest(
                                  node_id=node, time_ms=int(time.time() * 1000)))):
            start = time.monotonic()
            try:
                call(request, metadata=serve.bearer(node), timeout=ENROLLED_S)
            except grpc.RpcError as err:
                why = why or f"{type(request).__name__[:-7]}: {err.code().name}: {err.details()}"
            worst = max(worst, time.monotonic() - start)
    finally:
        if channel is not None:
            channel.close()
    if why:
        return False, f"the enrolled agent was refused ({why})"
    if worst > ENROLLED_S:
        return False, f"the enrolled agent waited {worst:.2f} s"
    return True, f"enrolled answered in {worst * 1000:.0f} ms"
