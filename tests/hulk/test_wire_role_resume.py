"""A role's resume fields in hulk-placement/2: micro-batch count, checkpoint folder, restart count."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from hulk.errors import InputError
from hulk.wire.placement import NodePlacement, Role, parse_placement

ROLE = Role(plan_id="p1", job="a", phase=0, stage=1, num_stages=2, layer_lo=20, layer_hi=48,
            replica=0, num_replicas=2, rank=2, world_size=4, rendezvous_address="10.0.0.1",
            rendezvous_port=29500, micro_batch=2, command=("python", "train.py"),
            micro_batches=16, checkpoint_dir="/data/ckpt/a", restart_count=2)


def placement(role: Role) -> NodePlacement:
    return NodePlacement(fleet="lab", node="n2", plan_id="p1", roles=(role,), issued_at_ms=5,
                         expires_at_ms=9)


def test_the_resume_fields_round_trip():
    doc = json.loads(placement(ROLE).to_bytes())
    assert {k: doc["roles"][0][k] for k in ("micro_batches", "checkpoint_dir", "restart_count")} == \
        {"micro_batches": 16, "checkpoint_dir": "/data/ckpt/a", "restart_count": 2}
    back = parse_placement(placement(ROLE).to_bytes())
    assert back.roles[0] == ROLE
    relative = replace(ROLE, checkpoint_dir="ckpt", restart_count=0)
    assert parse_placement(placement(relative).to_bytes()).roles[0] == relative


def test_at_their_defaults_they_are_left_out_and_read_back_as_defaults():
    plain = replace(ROLE, micro_batches=1, checkpoint_dir=None, restart_count=0)
    doc = json.loads(placement(plain).to_bytes())
    assert not {"micro_batches", "checkpoint_dir", "restart_count"} & set(doc["roles"][0])
    assert parse_placement(placement(plain).to_bytes()).roles[0] == plain


@pytest.mark.parametrize("mutate, field", [
    (lambda r: r.update(micro_batches=0), "roles[0].micro_batches"),
    (lambda r: r.update(micro_batches="4"), "roles[0].micro_batches"),
    (lambda r: r.update(micro_batches=True), "roles[0].micro_batches"),
    (lambda r: r.update(restart_count=-1), "roles[0].restart_count"),
    (lambda r: r.update(checkpoint_dir=""), "roles[0].checkpoint_dir"),
    (lambda r: r.update(checkpoint_dir=["/x"]), "roles[0].checkpoint_dir"),
    (lambda r: r.update(checkpoint_dir="/x\0y"), "roles[0].checkpoint_dir"),
    (lambda r: r.update(checkpoint_dir="/" + "x" * 5000), "roles[0].checkpoint_dir"),
    (lambda r: r.update(checkpoint_path="/x"), "roles[0].checkpoint_path"),   # still strict
])
def test_bad_resume_fields_are_refused_naming_the_field(mutate, field):
    doc = json.loads(placement(ROLE).to_bytes())
    mutate(doc["roles"][0])
    with pytest.raises(InputError) as err:
        parse_placement(json.dumps(doc))
    assert err.value.field == field
