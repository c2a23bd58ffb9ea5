"""Namespace building with a fake `ip` runner: the commands it issues and what a failure undoes."""

from __future__ import annotations

import os

import pytest

from lab import netns


class FakeIp:
    """Records commands; `ip netns list` answers from what was added; fails on one command."""

    def __init__(self, fail_on: tuple[str, ...] = ()):
        self.calls: list[list[str]] = []
        self.namespaces: list[str] = []
        self.fail_on = fail_on

    def __call__(self, argv):
        argv = list(argv)
        self.calls.append(argv)
        if self.fail_on and all(tok in argv for tok in self.fail_on):
            raise netns.LabError(f"{' '.join(argv)}: RTNETLINK answers: File exists")
        if argv[:3] == ["ip", "netns", "add"]:
            self.namespaces.append(argv[3])
        elif argv[:3] == ["ip", "netns", "del"]:
            self.namespaces.remove(argv[3])
        elif argv[:3] == ["ip", "netns", "list"]:
            return "\n".join(self.namespaces)
        return ""


def null_tun(name: str) -> int:
    return os.open(os.devnull, os.O_RDWR)


@pytest.fixture
def root_only():
    try:
        netns.require_root()
    except netns.LabError as err:
        pytest.skip(str(err))


def test_each_host_gets_its_device_address_and_default_route(root_only):
    ip = FakeIp()
    spaces = netns.Namespaces(["a", "b"], hub=True, runner=ip, tun_opener=null_tun)
    members = list(spaces.create())
    try:
        assert [(m.host, m.address) for m in members] == [
            ("a", "10.77.0.10"), ("b", "10.77.0.11"), ("hub", netns.HUB_ADDRESS)]
        ns = members[0].netns
        assert ns.startswith(f"{netns.PREFIX}{os.getpid()}-")
        assert ["ip", "-n", ns, "addr", "add", "10.77.0.10/24", "dev", "wan0"] in ip.calls
        assert ["ip", "-n", ns, "route", "add", "default", "dev", "wan0"] in ip.calls
        hosts = (netns.ETC_NETNS / ns / "hosts").read_text()
        assert "10.77.0.11 b" in hosts and f"{netns.HUB_ADDRESS} hub" in hosts
    finally:
        spaces.destroy()
    assert ip.namespaces == []
    assert not (netns.ETC_NETNS / members[0].netns).exists()


def test_a_failure_half_way_removes_what_was_built_and_closes_the_devices(root_only):
    ip = FakeIp(fail_on=("addr", "10.77.0.11/24"))
    opened: list[int] = []

    def tracking_tun(name):
        fd = null_tun(name)
        opened.append(fd)
        return fd

    spaces = netns.Namespaces(["a", "b", "c"], runner=ip, tun_opener=tracking_tun)
    with pytest.raises(netns.LabError, match="File exists"):
        spaces.create()
    assert ip.namespaces == []                 # "a" (built) and "b" (half built) are gone
    assert len(opened) == 2                    # "c" was never started
    for fd in opened:
        with pytest.raises(OSError):
            os.fstat(fd)                       # closed
    assert not list(netns.ETC_NETNS.glob(spaces.prefix + "*"))
