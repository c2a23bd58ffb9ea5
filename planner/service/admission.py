"""What the planner accepts from an agent, field by field, and how it reads the agent's clock.

Pure: wire records and numbers in, a checked value (or ``InputError`` naming the field) out.

- A registration is refused whole when a field is out of bounds: node ids follow the node-id rule
  (they become MQTT topic levels and file names), addresses are IP addresses or host names,
  texts are bounded and free of control characters, a site name is printable, GPU figures are
  physically possible.
- A heartbeat is never refused for its launch report (that would make a live node look silent):
  over-long texts in it are cut to their bound instead.
- A raw sample or a per-round summary is refused (with its batch) when its figures cannot be
  true: :func:`check_sample`, :func:`check_summary`. Every number is finite and within
  ``WIRE_BOUNDS`` (one table, with units); a timeout is always given, an RTT never exceeds it.
- A batch id is 1-64 letters, digits, '.', '_' or '-' (:func:`check_batch_id`): the store keeps
  it for the raw retention, so its size is the planner's, not the sender's, to choose.
- Sample times are read through the node's clock skew (heartbeats carry the agent's clock), so an
  agent whose clock is a day ahead or behind loses nothing; see :func:`corrected_times`.
"""

from __future__ import annotations

import ipaddress
import math
import re
from dataclasses import replace

from hulk.errors import InputError
from hulk.validate import NAME_EXPECTED, Bound, Invalid, is_name, shown
from hulk.wire.histogram import OVERFLOW, bucket_index
from hulk.wire.placement import MAX_COMMAND_WORDS
from hulk.wire.records import (SITE_MAX_CHARS, LaunchStatus, PeerSummary, ProbeKind,
                               ProbeSample, RegisterRequest)

HOST_NAME_RE = re.compile(r"(?=.{1,253}$)([A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?\.)*"
                          r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?\.?")
CONTROL_RE = re.compile(r"[\x00-\x1f\x7f]")

TEXT_LIMITS = {"hostname": 255, "city": 100, "site": SITE_MAX_CHARS, "agent_version": 64,
               "inventory.driver_version": 64, "inventory.unavailable_reason": 1024, "gpu.name": 128, "gpu.uuid": 128}
MAX_GPUS = 64
MAX_GPU_MEMORY_BYTES = 1 << 44          # 16 TiB on one GPU: anything above is a lie or a bug
MAX_COMPUTE_CAPABILITY = 100.0
LAUNCH_TEXT_LIMITS = {"plan_id": 128, "job": 128, "detail": 4096}
KNOWN_KINDS = frozenset(int(k) for k in ProbeKind)
MAX_PAYLOAD_BYTES = 65_507              # the largest ICMP echo payload over IPv4
MIN_TIMEOUT_MS = 1.0                    # agents wait 10 ms to 60 s for an answer (agent/config.py)
MAX_TIMEOUT_MS = 60_000.0
MAX_ROUND_PACKETS = 100                 # agents send 1-100 packets a round (agent/config.py)
SKEW_IGNORED_MS = 60_000                # clocks this close are left alone (NTP keeps them closer)
BATCH_ID_RE = re.compile(r"[0-9A-Za-z._-]{1,64}")     # agents send 32 hex digits

# Every number of a raw sample or a summary, with its unit. Beyond these: an RTT never exceeds
# its probe's timeout, nor lost packets the count, and the sums must fit the count, min and max.
# So one summary adds at most MAX_ROUND_PACKETS packets of MAX_TIMEOUT_MS to any rollup.
WIRE_BOUNDS = {
    "payload_bytes": Bound(0, MAX_PAYLOAD_BYTES, "bytes", integer=True),
    "timeout_ms": Bound(MIN_TIMEOUT_MS, MAX_TIMEOUT_MS, "milliseconds"),   # 0 too is refused
    "rtt_ms": Bound(0.0, MAX_TIMEOUT_MS, "milliseconds"),
    "count": Bound(1, MAX_ROUND_PACKETS, "packets", integer=True),
    "lost": Bound(0, MAX_ROUND_PACKETS, "packets", integer=True),
    "rtt_sum_ms": Bound(0.0, MAX_ROUND_PACKETS * MAX_TIMEOUT_MS, "milliseconds"),
    "rtt_sum_sq_ms2": Bound(0.0, MAX_ROUND_PACKETS * MAX_TIMEOUT_MS ** 2, "square milliseconds"),
    "rtt_min_ms": Bound(0.0, MAX_TIMEOUT_MS, "milliseconds"),
    "rtt_max_ms": Bound(0.0, MAX_TIMEOUT_MS, "milliseconds"),
}


def check_text(value: str, field: str, limit: int) -> str:
    if len(value) > limit:
        raise InputError(f"expected at most {limit} characters, got {len(value)}", field=field)
    if CONTROL_RE.search(value):
        raise InputError("expected text without control characters (NUL, newline, ...)",
                         field=field)
    return value


def check_site(site: str, field: str = "location.site") -> str:
    """"" (the node's city is its site) or a site name: at most SITE_MAX_CHARS printable
    characters (it keys the store's sites, fleet files and tables: no control, format or
    line-separator characters)."""
    check_text(site, field, TEXT_LIMITS["site"])
    if not site.isprintable():
        bad = next(c for c in site if not c.isprintable())
        raise InputError(f"expected printable text, got the character U+{ord(bad):04X}",
                         field=field)
    return site


def check_node_id(node_id: str, field: str = "node_id") -> str:
    if not is_name(node_id):
        raise InputError(f"expected {NAME_EXPECTED}, got {shown(node_id)}", field=field)
    return node_id


def check_address(address: str, field: str = "address") -> str:
    """"" (none: peers use the node id as its host name), an IP address or a DNS host name."""
    if not address:
        return address
    if len(address) <= 253:
        try:
            ipaddress.ip_address(address)
            return address
        except ValueError:
            if HOST_NAME_RE.fullmatch(address):
                return address
    shown = address if len(address) <= 40 else address[:37] + "..."
    raise InputError(f"expected an IP address or a host name, got {shown!r}", field=field)


MAX_ALLOWED_COMMANDS = 64      # argv prefixes an agent reports
MAX_PREFIX_CHARS = 4096         # all the words of one prefix


def check_allowed_commands(prefixes: tuple[tuple[str, ...], ...] | None) -> None:
    """An agent's allowed_commands as it reports them: bounded, words of printable text."""
    if prefixes is None:
        return
    if len(prefixes) > MAX_ALLOWED_COMMANDS:
        raise InputError(f"expected at most {MAX_ALLOWED_COMMANDS} command prefixes, got "
                         f"{len(prefixes)}", field="allowed_commands")
    for i, prefix in enumerate(prefixes):
        if (not 1 <= len(prefix) <= MAX_COMMAND_WORDS or sum(map(len, prefix)) > MAX_PREFIX_CHARS
                or not all(word and word.isprintable() for word in prefix)):
            raise InputError(f"expected 1-{MAX_COMMAND_WORDS} printable words of at most "
                             f"{MAX_PREFIX_CHARS} characters in all", field=f"allowed_commands[{i}]")


def check_registration(request: RegisterRequest) -> RegisterRequest:
    """``request`` when every field is within bounds; InputError naming the first that is not."""
    check_node_id(request.node_id)
    check_text(request.hostname, "hostname", TEXT_LIMITS["hostname"])
    check_text(request.agent_version, "agent_version", TEXT_LIMITS["agent_version"])
    check_text(request.location.city, "location.city", TEXT_LIMITS["city"])
    check_site(request.location.site)
    check_address(request.address)
    if not 0 <= request.probe_port <= 65535:
        raise InputError(f"expected a TCP port 0-65535, got {request.probe_port}",
                         field="probe_port")
    if not 0 <= request.throughput_port <= 65535:
        raise InputError(f"expected a TCP port 0-65535, got {request.throughput_port}",
                         field="throughput_port")
    check_allowed_commands(request.allowed_commands)
    if request.location.coordinates is not None:
        latitude, longitude = request.location.coordinates
        if not (-90 <= latitude <= 90 and -180 <= longitude <= 180):
            raise InputError(f"expected latitude in [-90, 90] and longitude in [-180, 180], got "
                             f"{latitude}, {longitude}", field="location")
    inventory = request.inventory
    check_text(inventory.driver_version, "inventory.driver_version",
               TEXT_LIMITS["inventory.driver_version"])
    check_text(inventory.unavailable_reason, "inventory.unavailable_reason",
               TEXT_LIMITS["inventory.unavailable_reason"])
    if inventory.count > MAX_GPUS:
        raise InputError(f"expected at most {MAX_GPUS} GPUs on one server, got {inventory.count}",
                         field="inventory.gpus")
    for i, gpu in enumerate(inventory.gpus):
        where = f"inventory.gpus[{i}]"
        check_text(gpu.name, f"{where}.name", TEXT_LIMITS["gpu.name"])
        check_text(gpu.uuid, f"{where}.uuid", TEXT_LIMITS["gpu.uuid"])
        if not 0 <= gpu.memory_bytes <= MAX_GPU_MEMORY_BYTES:
            raise InputError(f"expected 0 to 2**44 bytes of GPU memory, got {gpu.memory_bytes}",
                             field=f"{where}.memory_bytes")
        cc = gpu.compute_capability
        if not (math.isfinite(cc) and 0 <= cc <= MAX_COMPUTE_CAPABILITY):
            raise InputError(f"expected a compute capability between 0 and 100, got {cc}",
                             field=f"{where}.compute_capability")
    return request


def bounded_launch(launch: LaunchStatus | None) -> LaunchStatus | None:
    """The launch report with each text cut to its bound (a heartbeat is never refused for it)."""
    if launch is None:
        return None
    cut = {name: getattr(launch, name)[:limit] for name, limit in LAUNCH_TEXT_LIMITS.items()
           if len(getattr(launch, name)) > limit}
    return replace(launch, **cut) if cut else launch


def corrected_times(sent_ms: list[int], now_ms: int, skew_ms: int, future_tolerance_ms: int
                    ) -> tuple[list[int], int]:
    """Sample times on the planner's clock, and the shift applied to them.

    ``skew_ms`` is the agent's clock minus the planner's, measured by heartbeats; under
    SKEW_IGNORED_MS it is left alone. When the batch still reaches past ``now_ms`` by more than
    ``future_tolerance_ms`` (a skew not measured yet), the batch is moved back so that its newest
    sample is ``now_ms``: no sample is ever taken after it reached the planner.
    """
    shift = skew_ms if abs(skew_ms) >= SKEW_IGNORED_MS else 0
    newest = max(sent_ms, default=0) - shift
    if newest > now_ms + future_tolerance_ms:
        shift += newest - now_ms
    if shift == 0:
        return sent_ms, 0
    return [t - shift for t in sent_ms], shift


_REL = 1e-9                             # float slack of sums checked against min and max


def _bounded(record: ProbeSample | PeerSummary, name: str, where: str) -> float:
    """The record's field ``name``, within WIRE_BOUNDS[name]; else InputError naming it."""
    try:
        return WIRE_BOUNDS[name].check(getattr(record, name))
    except Invalid as bad:
        raise bad.error(field=f"{where}.{name}") from None


def _check_kind(kind: int, where: str) -> None:
    if kind not in KNOWN_KINDS:
        raise InputError(f"expected a probe kind in {sorted(KNOWN_KINDS)}, got {kind}",
                         field=f"{where}.kind")


def check_batch_id(batch_id: str) -> str:
    if not BATCH_ID_RE.fullmatch(batch_id):
        raise InputError("expected 1-64 letters, digits, '.', '_' or '-' (agents send 32 hex "
                         f"digits), got {len(batch_id)} characters: {shown(batch_id)}",
                         field="batch_id")
    return batch_id


def check_sample(s: ProbeSample, where: str) -> None:
    """InputError naming ``where``'s field when a raw sample cannot be true: an unknown kind, a
    number outside WIRE_BOUNDS, or an RTT above the probe's timeout (a lost packet's too)."""
    _check_kind(s.kind, where)
    _bounded(s, "payload_bytes", where)
    timeout = _bounded(s, "timeout_ms", where)
    if _bounded(s, "rtt_ms", where) > timeout:
        raise InputError(f"RTT {s.rtt_ms} ms is above the probe's timeout of {timeout} ms",
                         field=f"{where}.rtt_ms")


def check_summary(s: PeerSummary, where: str) -> None:
    """InputError naming ``where``'s field when a per-round summary cannot be true: a number
    outside WIRE_BOUNDS, more lost than sent, RTT figures above the probe's timeout or
    inconsistent (min > max, a sum outside [n*min, n*max], a sum of squares below sum**2/n), or
    a histogram that is unordered, out of range or does not add up to the received packets.
    Which peer, and whether it is plausible for the two cities, is ingest's."""
    _check_kind(s.kind, where)
    for name in ("payload_bytes", "count", "lost"):
        _bounded(s, name, where)
    if s.lost > s.count:
        raise InputError(f"expected 0 to count ({s.count}) lost packets, got {s.lost}",
                         field=f"{where}.lost")
    timeout = _bounded(s, "timeout_ms", where)
    n = s.count - s.lost
    for name in ("rtt_sum_ms", "rtt_sum_sq_ms2", "rtt_min_ms", "rtt_max_ms"):
        value = _bounded(s, name, where)
        if n == 0 and value != 0.0:
            raise InputError(f"expected 0 with every packet lost, got {value}",
                             field=f"{where}.{name}")
    if n == 0:
        if s.buckets:
            raise InputError("expected an empty histogram with every packet lost",
                             field=f"{where}.histogram_counts")
        return
    lo, hi = s.rtt_min_ms, s.rtt_max_ms
    if lo > hi:
        raise InputError(f"expected min <= max, got {lo} > {hi}", field=f"{where}.rtt_min_ms")
    if hi > timeout:
        raise InputError(f"RTT {hi} ms is above the probe's timeout of {timeout} ms",
                         field=f"{where}.rtt_max_ms")
    if not n * lo * (1 - _REL) - _REL <= s.rtt_sum_ms <= n * hi * (1 + _REL) + _REL:
        raise InputError(f"expected a sum of {n} RTTs between {n} x min and {n} x max, got "
                         f"{s.rtt_sum_ms}", field=f"{where}.rtt_sum_ms")
    sq = s.rtt_sum_sq_ms2
    if not (s.rtt_sum_ms ** 2 / n * (1 - 1e-6) - _REL <= sq <= n * hi * hi * (1 + _REL) + _REL
            and sq >= n * lo * lo * (1 - _REL) - _REL):
        raise InputError(f"expected a sum of squares consistent with the sum, min and max of "
                         f"{n} RTTs, got {sq}", field=f"{where}.rtt_sum_sq_ms2")
    total, previous = 0, -1
    for j, (k, c) in enumerate(s.buckets):
        if not previous < k <= OVERFLOW:
            raise InputError(f"expected increasing bucket numbers up to {OVERFLOW}, got {k}",
                             field=f"{where}.histogram_buckets[{j}]")
        if c < 1:
            raise InputError(f"expected a count >= 1 (list non-empty buckets only), got {c}",
                             field=f"{where}.histogram_counts[{j}]")
        total += c
        previous = k
    if total != n:
        raise InputError(f"expected histogram counts adding up to the {n} received packets, "
                         f"got {total}", field=f"{where}.histogram_counts")
    if s.buckets[0][0] != bucket_index(lo) or s.buckets[-1][0] != bucket_index(hi):
        raise InputError("expected the histogram's first and last buckets to hold min and max",
                         field=f"{where}.histogram_buckets")
