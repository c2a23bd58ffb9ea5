"""The node lease: how long a node's jobs may run after the planner last acknowledged it.

serve re-places a silent node's jobs no earlier than ``--node-timeout`` after the last heartbeat
it received. Each Heartbeat answer carries ``lease_s`` (:func:`lease_for` of that timeout): the
node holds its placements for ``lease_s`` after *sending* a heartbeat the planner acknowledged,
and every process of its jobs must be gone by then. The agent splits that budget
(:func:`fence_terms`): the job's wrapper (agent/jobproc.py) is told a deadline early enough that
its poll, SIGTERM, the grace before SIGKILL and the reaping all fit before ``lease_s`` ends. The
send time is before serve's receipt, so by construction

    old copy stopped  <=  last acknowledged send + lease_s
                      <=  serve's last heartbeat + node_timeout - margin  <  new copy placed.

Shared by serve and the agent (the agent imports hulk only). docs/JOBS.md states the guarantee.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

DEFAULT_NODE_TIMEOUT_S = 30.0          # serve's --node-timeout default
# What an agent accepts (serve's --node-timeout spans 0.1 s to 7 days); from a planner that sends
# none (0, an older serve) or an unusable value it assumes DEFAULT_LEASE_S.
LEASE_RANGE_S = (0.05, 7 * 86_400.0)


def serve_margin_s(node_timeout_s: float) -> float:
    """What serve keeps back from its node timeout: the time between a kill and the process
    being gone, clock rate differences between hosts, and serve's own scheduling."""
    return min(1.0, 0.1 * node_timeout_s)


def lease_for(node_timeout_s: float) -> float:
    """The lease serve grants with a ``node_timeout_s`` node timeout."""
    return node_timeout_s - serve_margin_s(node_timeout_s)


DEFAULT_LEASE_S = lease_for(DEFAULT_NODE_TIMEOUT_S)


@dataclass(frozen=True)
class FenceTerms:
    """How an agent spends a lease: the wrapper's deadline comes ``renew_s`` after a send, it
    looks every ``poll_s``, and kills ``grace_s`` after SIGTERM; ``slack_s`` is left for the
    kill to take effect. renew_s + poll_s + grace_s + slack_s == lease_s."""

    lease_s: float
    renew_s: float
    poll_s: float
    grace_s: float
    slack_s: float


def fence_terms(lease_s: float) -> FenceTerms:
    poll = min(0.5, lease_s / 20)
    grace = min(3.0, lease_s / 10)
    slack = poll
    return FenceTerms(lease_s, lease_s - poll - grace - slack, poll, grace, slack)


def usable_lease(value: float) -> bool:
    """A lease an agent accepts from the planner (NaN and infinities are not)."""
    return isinstance(value, (int, float)) and math.isfinite(value) \
        and LEASE_RANGE_S[0] <= value <= LEASE_RANGE_S[1]
