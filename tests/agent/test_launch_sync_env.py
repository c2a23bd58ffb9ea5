"""The synchronisation variables a launched job gets (agent/launcher.py sync_env)."""

from __future__ import annotations

from agent.launcher import role_env
from hulk.settings import ENV_VARS
from hulk.wire.placement import Role

SYNC_VARS = ("HULK_SYNC", "HULK_INNER_STEPS", "HULK_OUTER_COMPRESSION", "HULK_STREAMING_FRAGMENTS",
             "HULK_ISLAND", "HULK_NUM_ISLANDS")


def role(**fields) -> Role:
    return Role(plan_id="p1", job="a", phase=0, stage=0, num_stages=1, layer_lo=0, layer_hi=4,
                replica=3, num_replicas=4, rank=3, world_size=4, rendezvous_address="127.0.0.1",
                rendezvous_port=29500, micro_batch=2, **fields)


def test_a_diloco_role_gives_its_islands_and_outer_sync_to_the_job():
    env = role_env(role(sync="diloco", inner_steps=50, outer_compression="int8",
                        streaming_fragments=2, island=1, num_islands=2))
    assert {k: env[k] for k in SYNC_VARS} == {
        "HULK_SYNC": "diloco", "HULK_INNER_STEPS": "50", "HULK_OUTER_COMPRESSION": "int8",
        "HULK_STREAMING_FRAGMENTS": "2", "HULK_ISLAND": "1", "HULK_NUM_ISLANDS": "2"}
    assert all(ENV_VARS[name].used_by == "launched job" for name in SYNC_VARS)


def test_a_step_role_says_every_step_and_one_island():
    env = role_env(role())
    assert {k: env[k] for k in SYNC_VARS} == {
        "HULK_SYNC": "step", "HULK_INNER_STEPS": "1", "HULK_OUTER_COMPRESSION": "none",
        "HULK_STREAMING_FRAGMENTS": "0", "HULK_ISLAND": "0", "HULK_NUM_ISLANDS": "1"}
