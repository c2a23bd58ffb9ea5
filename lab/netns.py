"""One network namespace per lab host, each reaching the others only through a TUN device.

Each TUN device is opened here, in the root namespace, and then moved into its host's namespace
(``ip link set ... netns``). The open file descriptor stays valid across the move, so a single
process (:mod:`lab.switch`) holding every fd sees every packet any host sends and decides when it
arrives. Inside a namespace the device is called ``wan0`` and carries the host's address from
``LAB_SUBNET`` (10.77.0.0/24), which exists nowhere but inside these namespaces; the namespace's
default route points at ``wan0``, so a packet for anything else reaches the switch, which drops it:
lab traffic never leaves the lab.

Names: ``hulk-lab-<pid>-<k>-<host>``, where ``pid`` is the process that built the lab. A lab left
behind by a crash is found by that prefix and removed by :func:`cleanup_stale` (called before every
build, and by ``python -m lab.netns --cleanup``): its processes are stopped and the namespace is
deleted. The TUN devices need no cleanup: they vanish when the switch that holds them exits.

CPU quota: a host may get a cgroup v1 ``cpu`` group of the same name (:class:`CpuGroup`,
``cpu.cfs_period_us`` = ``CFS_PERIOD_US``, ``cpu.cfs_quota_us`` = cores x period), which every
process the lab starts in that host joins before it enters the namespace; such groups are removed
with the lab and by :func:`cleanup_stale`.
"""

from __future__ import annotations

import argparse
import fcntl
import itertools
import logging
import os
import shutil
import signal
import socket
import struct
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Protocol, Sequence

from hulk.errors import HulkError
from hulk.plural import count

log = logging.getLogger(__name__)

PREFIX = "hulk-lab-"
LAB_SUBNET = "10.77.0.0/24"
LAB_NET = "10.77.0."
HUB_ADDRESS = LAB_NET + "1"   # the zero-delay host that runs the planner and the broker
FIRST_HOST = 10               # lab host i gets LAB_NET + (FIRST_HOST + i)
MAX_HOSTS = 240
DEVICE = "wan0"
ETC_NETNS = Path("/etc/netns")
# A short period makes a quota hold on the time scale of one micro-batch (tens of ms): with a
# long one, a process that waits part of the period bursts above its quota. The kernel takes
# no quota under 1 ms, so a host gets at least MIN_CORES.
CFS_PERIOD_US = 10_000
MIN_CORES = 1000 / CFS_PERIOD_US
MOUNTS = Path("/proc/mounts")
# A large MTU keeps the switch's packet rate (its real cost) low for bulk TCP such as gloo's
# tensors; link bandwidth exists only where a lab sets a rate (see lab/README.md).
DEFAULT_MTU = 65000

_TUNSETIFF = 0x400454CA
_IFF_TUN = 0x0001
_IFF_NO_PI = 0x1000


class LabError(HulkError):
    """The lab could not be built (not root, no `ip`, a command failed)."""


class Runner(Protocol):
    def __call__(self, argv: Sequence[str]) -> str: ...


def run_command(argv: Sequence[str]) -> str:
    """Run a command, return its stdout; a failure becomes a one-line LabError."""
    proc = subprocess.run(list(argv), capture_output=True, text=True)
    if proc.returncode != 0:
        raise LabError(f"{' '.join(argv)}: {proc.stderr.strip() or f'exit code {proc.returncode}'}")
    return proc.stdout


def host_address(index: int) -> str:
    if not 0 <= index < MAX_HOSTS:
        raise LabError(f"the lab holds at most {MAX_HOSTS} hosts, asked for index {index}")
    return f"{LAB_NET}{FIRST_HOST + index}"


def open_tun(name: str) -> int:
    """Create a TUN device (raw IP packets, no extra header) and return its non-blocking fd."""
    fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        fcntl.ioctl(fd, _TUNSETIFF, struct.pack("16sH", name.encode(), _IFF_TUN | _IFF_NO_PI))
    except OSError:
        os.close(fd)
        raise
    return fd


@dataclass
class Namespace:
    """A lab host's namespace: its name, the fd of its TUN device and its address."""

    host: str        # node id
    netns: str       # namespace name
    address: str     # IPv4 address on wan0
    fd: int = -1     # the TUN fd, held until the switch takes it

    def exec_argv(self, argv: Sequence[str]) -> list[str]:
        """``argv`` run inside this namespace."""
        return ["ip", "netns", "exec", self.netns, *argv]


def list_namespaces(runner: Runner = run_command) -> list[str]:
    out = runner(["ip", "netns", "list"])
    # Lines look like "name" or "name (id: 3)".
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def namespace_pids(netns: str, runner: Runner = run_command) -> list[int]:
    try:
        out = runner(["ip", "netns", "pids", netns])
    except LabError:
        return []
    return [int(tok) for tok in out.split() if tok.isdigit()]


def _owner_pid(netns: str) -> int | None:
    rest = netns[len(PREFIX):]
    head = rest.split("-", 1)[0]
    return int(head) if head.isdigit() else None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stop_processes(pids: list[int], grace_s: float = 3.0) -> None:
    """SIGTERM the given processes (all started by the lab), then SIGKILL what is left."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + grace_s
    left = list(pids)
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = [p for p in left if running(p)]
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _is_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True


def running(pid: int) -> bool:
    """``pid`` exists and has not exited (a zombie not yet reaped has)."""
    return _alive(pid) and not _is_zombie(pid)


def delete_namespace(netns: str, runner: Runner = run_command) -> None:
    """Stop every process inside ``netns`` (they are the lab's), then delete it and its /etc files."""
    stop_processes(namespace_pids(netns, runner))
    try:
        runner(["ip", "netns", "del", netns])
    except LabError as err:
        log.warning("could not delete namespace %s: %s", netns, err)
    remove_etc(netns)


def remove_etc(netns: str) -> None:
    folder = ETC_NETNS / netns
    if folder.is_dir():
        shutil.rmtree(folder, ignore_errors=True)


def write_etc(netns: str, own_address: str, peers: dict[str, str]) -> None:
    """/etc/hosts and /etc/resolv.conf as processes in ``netns`` see them (``ip netns exec``
    bind-mounts /etc/netns/NAME/* over /etc). Lab names resolve to lab addresses, this machine's
    hostname to the host's own address, and DNS fails at once instead of timing out on a server
    the lab cannot reach (gloo and c10d look names up)."""
    folder = ETC_NETNS / netns
    folder.mkdir(parents=True, exist_ok=True)
    lines = ["127.0.0.1 localhost", f"{own_address} {socket.gethostname()}"]
    lines += [f"{addr} {name}" for name, addr in peers.items()]
    (folder / "hosts").write_text("\n".join(lines) + "\n")
    (folder / "resolv.conf").write_text("nameserver 127.0.0.1\noptions timeout:1 attempts:1\n")


def cpu_cgroup_root(mounts: Path = MOUNTS) -> Path | None:
    """Where cgroup v1's ``cpu`` controller is mounted (/sys/fs/cgroup/cpu or .../cpu,cpuacct)."""
    try:
        lines = mounts.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        parts = line.split()
        if len(parts) >= 4 and parts[2] == "cgroup" and "cpu" in parts[3].split(","):
            return Path(parts[1])
    return None


@dataclass
class CpuGroup:
    """A cgroup v1 ``cpu`` group that holds one lab host's processes to ``cores`` CPU cores."""

    path: Path
    cores: float

    @property
    def quota_us(self) -> int:
        return round(self.cores * CFS_PERIOD_US)

    def create(self) -> "CpuGroup":
        if not MIN_CORES <= self.cores <= 1024:
            raise LabError(f"a host's CPU quota must be {MIN_CORES:g} to 1024 cores, got {self.cores}")
        try:
            self.path.mkdir()
            (self.path / "cpu.cfs_period_us").write_text(str(CFS_PERIOD_US))
            (self.path / "cpu.cfs_quota_us").write_text(str(self.quota_us))
        except OSError as err:
            remove_cpu_group(self.path)
            raise LabError(f"cannot set up the CPU quota in {self.path}: {err.strerror}") from None
        return self

    def wrap(self, argv: Sequence[str]) -> list[str]:
        """``argv`` that first moves itself into this group (outside the namespace: ``ip netns
        exec`` mounts a fresh /sys, which hides the cgroup tree), then runs ``argv``."""
        return ["sh", "-c", 'echo $$ > "$0" && exec "$@"', str(self.path / "cgroup.procs"), *argv]


def cpu_group_pids(path: Path) -> list[int]:
    try:
        return [int(tok) for tok in (path / "cgroup.procs").read_text().split()]
    except OSError:
        return []


def remove_cpu_group(path: Path) -> None:
    """Stop what is left in the group (only the lab's processes join it), then remove it."""
    stop_processes(cpu_group_pids(path))
    try:
        path.rmdir()
    except FileNotFoundError:
        pass
    except OSError as err:
        log.warning("could not remove cgroup %s: %s", path, err)


def cleanup_stale(runner: Runner = run_command, everything: bool = False) -> list[str]:
    """Delete lab namespaces and CPU groups whose building process is gone (all of them when
    ``everything``)."""
    removed = []
    for netns in list_namespaces(runner):
        if not netns.startswith(PREFIX):
            continue
        owner = _owner_pid(netns)
        if everything or owner is None or not _alive(owner):
            delete_namespace(netns, runner)
            removed.append(netns)
    if ETC_NETNS.is_dir():
        for folder in ETC_NETNS.glob(PREFIX + "*"):
            owner = _owner_pid(folder.name)
            if everything or owner is None or not _alive(owner):
                remove_etc(folder.name)
    root = cpu_cgroup_root()
    if root is not None and root.is_dir():
        for group in root.glob(PREFIX + "*"):
            owner = _owner_pid(group.name)
            if everything or owner is None or not _alive(owner):
                remove_cpu_group(group)
                removed.append(group.name)
    if removed:
        log.info("removed %s", count(len(removed), "stale lab namespace"))
    return removed


_lab_counter = itertools.count()


@dataclass
class Namespaces:
    """The namespaces of one lab. ``create()`` builds them; ``destroy()`` removes every trace.

    ``hosts`` are node ids; with ``hub=True`` one more namespace, ``hub``, gets ``HUB_ADDRESS``
    (the planner and the broker run there; the switch gives it zero delay to everyone).
    """

    hosts: list[str]
    hub: bool = False
    mtu: int = DEFAULT_MTU
    runner: Runner = run_command
    tun_opener: Callable[[str], int] = open_tun
    members: list[Namespace] = field(default_factory=list)
    lab_id: str = ""
    cpu_cores: dict[str, float] = field(default_factory=dict)  # host -> CPU quota (cores)
    cpu_groups: dict[str, CpuGroup] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if len(self.hosts) > MAX_HOSTS:
            raise LabError(f"the lab holds at most {MAX_HOSTS} hosts, got {len(self.hosts)}")
        if len(set(self.hosts)) != len(self.hosts):
            raise LabError("lab host names must be unique")
        if not self.lab_id:
            self.lab_id = f"{os.getpid()}-{next(_lab_counter)}"
        unknown = sorted(set(self.cpu_cores) - set(self.hosts))
        if unknown:
            raise LabError(f"CPU quota for hosts not in the lab: {', '.join(unknown)}")

    @property
    def prefix(self) -> str:
        return f"{PREFIX}{self.lab_id}-"

    def exec_argv(self, host: str, argv: Sequence[str]) -> list[str]:
        """``argv`` run inside ``host``'s namespace, and in its CPU group when it has a quota."""
        inside = self.by_host(host).exec_argv(argv)
        group = self.cpu_groups.get(host)
        return group.wrap(inside) if group else inside

    def by_host(self, host: str) -> Namespace:
        for m in self.members:
            if m.host == host:
                return m
        raise KeyError(host)

    def create(self) -> list[Namespace]:
        require_root()
        cleanup_stale(self.runner)
        plan = [(h, host_address(i)) for i, h in enumerate(self.hosts)]
        if self.hub:
            plan.append(("hub", HUB_ADDRESS))
        peers = dict(plan)
        root = cpu_cgroup_root() if self.cpu_cores else None
        if self.cpu_cores and (root is None or not root.is_dir()):
            raise LabError("a CPU quota needs cgroup v1's cpu controller (no cgroup 'cpu' mount)")
        try:
            for host, address in plan:
                self.members.append(self._create_one(host, address))
                write_etc(self.members[-1].netns, address, peers)
                if host in self.cpu_cores:
                    self.cpu_groups[host] = CpuGroup(root / self.members[-1].netns,
                                                     float(self.cpu_cores[host])).create()
        except BaseException:
            self.destroy()
            raise
        return self.members

    def _create_one(self, host: str, address: str) -> Namespace:
        # Safe as a file name under /run/netns; the host name is kept for people reading `ip netns`.
        slug = "".join(c if c.isalnum() or c in "-_." else "_" for c in host)[:40]
        ns = Namespace(host=host, netns=f"{self.prefix}{slug}", address=address)
        tun = f"t{os.getpid():x}.{next(_lab_counter):x}"[:15]
        r = self.runner
        r(["ip", "netns", "add", ns.netns])
        try:
            ns.fd = self.tun_opener(tun)
        except OSError as err:
            delete_namespace(ns.netns, self.runner)
            raise LabError(f"cannot create TUN device {tun}: {err.strerror}") from None
        try:
            r(["ip", "link", "set", tun, "netns", ns.netns])
            inside = ["ip", "netns", "exec", ns.netns]
            # No IPv6 inside: router solicitations would be noise the switch has to drop.
            r(inside + ["sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1",
                        "net.ipv6.conf.default.disable_ipv6=1"])
            # Unprivileged ICMP sockets for anyone, so icmplib works as in production either way.
            r(inside + ["sysctl", "-qw", "net.ipv4.ping_group_range=0 2147483647"])
            r(["ip", "-n", ns.netns, "link", "set", "lo", "up"])
            r(["ip", "-n", ns.netns, "link", "set", tun, "name", DEVICE])
            r(["ip", "-n", ns.netns, "link", "set", DEVICE, "mtu", str(self.mtu), "up"])
            r(["ip", "-n", ns.netns, "addr", "add", f"{address}/24", "dev", DEVICE])
            r(["ip", "-n", ns.netns, "route", "add", "default", "dev", DEVICE])
        except BaseException:
            os.close(ns.fd)
            ns.fd = -1
            delete_namespace(ns.netns, self.runner)
            raise
        return ns

    def close_fds(self) -> None:
        for m in self.members:
            if m.fd >= 0:
                os.close(m.fd)
                m.fd = -1

    def destroy(self) -> None:
        self.close_fds()
        for m in self.members:
            delete_namespace(m.netns, self.runner)
        # Anything of ours a half-finished create() left behind.
        for netns in list_namespaces(self.runner):
            if netns.startswith(self.prefix):
                delete_namespace(netns, self.runner)
        for group in self.cpu_groups.values():
            remove_cpu_group(group.path)
        self.cpu_groups.clear()
        self.members.clear()


def require_root() -> None:
    """Raise LabError with the reason when this process cannot build a lab."""
    if os.geteuid() != 0:
        raise LabError("the WAN lab needs root (network namespaces and TUN devices)")
    if not os.path.exists("/dev/net/tun"):
        raise LabError("the WAN lab needs /dev/net/tun")
    if subprocess.run(["sh", "-c", "command -v ip"], capture_output=True).returncode != 0:
        raise LabError("the WAN lab needs the `ip` command (iproute2)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab.netns",
                                     description="List or remove WAN lab namespaces.")
    parser.add_argument("--cleanup", action="store_true",
                        help="remove lab namespaces whose building process is gone")
    parser.add_argument("--all", action="store_true", help="with --cleanup: remove every lab namespace")
    args = parser.parse_args(argv)
    try:
        if args.cleanup:
            for name in cleanup_stale(everything=args.all):
                print(f"removed {name}")
        else:
            for name in list_namespaces():
                if name.startswith(PREFIX):
                    print(name)
    except HulkError as err:
        print(err)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
