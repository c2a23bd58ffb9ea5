"""Backoff schedule, grpc error translation, effective probe settings (pure logic)."""

from __future__ import annotations

import random

import grpc
import pytest

from agent.config import load_config
from agent.reporter import Backoff, translate_rpc_error
from agent.runtime import effective_settings
from hulk import errors
from hulk.wire.records import ProbeSettings


def test_backoff_doubles_up_to_the_cap_with_bounded_jitter():
    backoff = Backoff(initial_s=0.5, factor=2.0, cap_s=8.0, jitter=0.25, rng=random.Random(3))
    ceilings = [backoff.ceiling(n) for n in range(1, 9)]
    assert ceilings == [0.5, 1.0, 2.0, 4.0, 8.0, 8.0, 8.0, 8.0]
    delays = [backoff.next_delay() for _ in range(8)]
    for delay, ceiling in zip(delays, ceilings):
        assert 0.75 * ceiling <= delay <= ceiling
    assert len(set(delays[4:])) == 4        # jittered: capped delays are not all equal
    backoff.reset()
    assert backoff.next_delay() <= 0.5


def test_backoff_survives_a_very_long_outage():
    backoff = Backoff(1.0, 2.0, 60.0, jitter=0.0)
    backoff.attempt = 10_000
    assert backoff.next_delay() == 60.0


def test_backoff_rejects_nonsense():
    with pytest.raises(ValueError):
        Backoff(initial_s=0)
    with pytest.raises(ValueError):
        Backoff(initial_s=10, cap_s=1)


class FakeRpcError(grpc.RpcError):
    def __init__(self, code, details):
        self._code, self._details = code, details

    def code(self):
        return self._code

    def details(self):
        return self._details


@pytest.mark.parametrize("code, kind", [
    (grpc.StatusCode.UNAVAILABLE, errors.UnavailableError),
    (grpc.StatusCode.DEADLINE_EXCEEDED, errors.RequestTimeoutError),   # an UnavailableError
    (grpc.StatusCode.UNAUTHENTICATED, errors.UnauthenticatedError),
    (grpc.StatusCode.PERMISSION_DENIED, errors.PermissionDeniedError),
    (grpc.StatusCode.NOT_FOUND, errors.NotFoundError),
    (grpc.StatusCode.FAILED_PRECONDITION, errors.NotFoundError),
    (grpc.StatusCode.RESOURCE_EXHAUSTED, errors.RateLimitedError),
    (grpc.StatusCode.INVALID_ARGUMENT, errors.InputError),
    (grpc.StatusCode.INTERNAL, errors.HulkError),
])
def test_grpc_errors_become_hulk_errors(code, kind):
    err = translate_rpc_error(FakeRpcError(code, "node n1 is not registered"), "Report")
    assert type(err) is kind
    assert str(err) == "planner Report: node n1 is not registered"


def test_local_settings_win_over_the_planners_only_when_set():
    config = load_config({"planner": "p:1", "node_id": "n", "interval_s": "15"},
                         env_reader=lambda name: None)
    planner = ProbeSettings(interval_s=120, packets_per_round=3, timeout_s=1.0, payload_bytes=0,
                            max_concurrency=16, max_batch=1000)
    settings = effective_settings(config, planner)
    assert settings.interval_s == 15.0           # set by a flag: local wins
    assert settings.packets_per_round == 3       # default locally: the planner's
    assert settings.timeout_s == 1.0 and settings.max_concurrency == 16
    assert settings.payload_bytes == 56          # planner sent 0 ("not set")
    assert settings.max_batch == 1000            # no local setting: the planner's
    assert effective_settings(config, None) == ProbeSettings(interval_s=15.0)


def test_agent_defaults_are_the_settings_the_planner_pushes():
    config = load_config({"planner": "p:1", "node_id": "n"}, env_reader=lambda name: None)
    assert effective_settings(config, None) == ProbeSettings()
    assert effective_settings(config, ProbeSettings()) == ProbeSettings()


def test_the_agents_retries_are_back_within_seconds_of_a_restarted_planner():
    """A planner down for an hour: the agents' next try comes at most 5 s after it is back, well
    inside its 30 s node timeout (it was about a minute, longer than the timeout)."""
    backoff = Backoff(jitter=0.0)
    delays = [backoff.next_delay() for _ in range(3600)]
    assert max(delays) == 5.0 and sum(delays) > 3600 * 4.9
