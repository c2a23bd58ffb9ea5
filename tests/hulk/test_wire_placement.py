"""The MQTT placement message and plan summary formats (hulk.wire.placement): bytes and parsers."""

from __future__ import annotations

import json

import pytest

from hulk.errors import InputError
from hulk.wire.placement import (PLACEMENT_FORMAT, SUMMARY_FORMAT, NodePlacement, Role,
                                 parse_placement, parse_summary, summary_bytes)

ROLE = Role(plan_id="p1", job="a", phase=0, stage=1, num_stages=2, layer_lo=20, layer_hi=48,
            replica=0, num_replicas=2, rank=2, world_size=4, rendezvous_address="10.0.0.1",
            rendezvous_port=29500, micro_batch=2, command=("python", "train.py", "--steps", "3"))
PLACEMENT = NodePlacement(fleet="lab", node="n2", plan_id="p1", roles=(ROLE,), issued_at_ms=5,
                          expires_at_ms=9)


def test_placement_bytes_are_the_documented_format():
    # The agents in the field parse exactly this (docs/PLACEMENTS.md): sorted keys, no spaces.
    assert PLACEMENT.to_bytes() == (
        b'{"expires_at_ms":9,"fleet":"lab","format":"hulk-placement/2","issued_at_ms":5,"node":"n2",'
        b'"plan_id":"p1","roles":[{'
        b'"command":["python","train.py","--steps","3"],"job":"a","layers":[20,48],"micro_batch":2,'
        b'"nnodes":4,"node_rank":2,"num_replicas":2,"num_stages":2,"phase":0,"plan_id":"p1",'
        b'"rank":2,"rendezvous":{"address":"10.0.0.1","port":29500},"replica":0,"stage":1,'
        b'"world_size":4}]}')
    assert parse_placement(PLACEMENT.to_bytes()) == PLACEMENT
    assert parse_placement(PLACEMENT.to_bytes().decode()) == PLACEMENT
    empty = NodePlacement(fleet="lab", node="n5", plan_id="p1")
    assert parse_placement(empty.to_bytes()) == empty


@pytest.mark.parametrize("mutate, field", [
    (lambda d: d.update(format="hulk-placement/1"), "format"),
    (lambda d: d.pop("expires_at_ms"), "expires_at_ms"),
    (lambda d: d.update(signature=5), "signature"),
    (lambda d: d.pop("node"), "node"),
    (lambda d: d.update(extra=1), "extra"),
    (lambda d: d.update(roles={}), "roles"),
    (lambda d: d["roles"][0].update(rank=3), "roles[0].rank"),
    (lambda d: d["roles"][0].update(world_size=5), "roles[0].world_size"),
    (lambda d: d["roles"][0].update(nnodes=3), "roles[0].nnodes"),
    (lambda d: d["roles"][0].update(node_rank=1), "roles[0].node_rank"),
    (lambda d: d["roles"][0].update(layers=[20]), "roles[0].layers"),
    (lambda d: d["roles"][0].update(layers=[30, 20]), "roles[0].layers"),
    (lambda d: d["roles"][0].update(stage=2), "roles[0].stage"),
    (lambda d: d["roles"][0].update(micro_batch=0), "roles[0].micro_batch"),
    (lambda d: d["roles"][0].update(micro_batch=True), "roles[0].micro_batch"),
    (lambda d: d["roles"][0]["rendezvous"].update(port=70000), "roles[0].rendezvous.port"),
    (lambda d: d["roles"][0]["rendezvous"].update(address=""), "roles[0].rendezvous.address"),
    (lambda d: d["roles"][0].update(command=5), "roles[0].command"),
    (lambda d: d["roles"][0].update(command="python train.py"), "roles[0].command"),
    (lambda d: d["roles"][0].update(command=[]), "roles[0].command"),
    (lambda d: d["roles"][0].update(command=["python", 3]), "roles[0].command"),
    (lambda d: d["roles"][0].update(job="../etc"), "roles[0].job"),
    (lambda d: d["roles"][0].update(job=".."), "roles[0].job"),
    (lambda d: d["roles"][0].update(job="x" * 65), "roles[0].job"),
    (lambda d: d["roles"].append(dict(d["roles"][0])), "roles"),
    (lambda d: d["roles"].insert(0, dict(d["roles"][0], job="b", phase=1)), "roles"),
])
def test_parser_rejects_malformed_documents_naming_the_field(mutate, field):
    doc = PLACEMENT.to_json()
    mutate(doc)
    with pytest.raises(InputError) as err:
        parse_placement(json.dumps(doc).encode(), source="topic/x")
    message = str(err.value)
    assert message.startswith("topic/x: ") and f"{field}: " in message and "\n" not in message


@pytest.mark.parametrize("payload", [b"", b"{", b"\xff\xfe", b"[]", b"null", b'{"format": NaN}'])
def test_parser_rejects_what_is_not_a_json_object(payload):
    with pytest.raises(InputError) as err:
        parse_placement(payload)
    assert "\n" not in str(err.value)


def summary_doc() -> dict:
    return {"format": SUMMARY_FORMAT, "fleet": "lab", "plan_id": "p1", "method": "search",
            "issued_at_ms": 5, "nodes": {"n0": ["a"], "n1": ["a"]},
            "jobs": [{"name": "a", "plan_id": "p0", "phase": 0, "micro_batch": 2,
                      "stages": [{"layers": [0, 20], "nodes": ["n0"]},
                                 {"layers": [20, 48], "nodes": ["n1"]}],
                      "rendezvous": {"address": "10.0.0.1", "port": 29500},
                      "spec": {"params": 1.5e9, "layers": 48}}],
            "unplaced": [{"name": "c", "reason": "does not fit"}]}


def test_summary_is_parsed_into_jobs_with_node_ids():
    summary = parse_summary(summary_bytes(summary_doc()))
    assert (summary.fleet, summary.plan_id, summary.method, summary.issued_at_ms) == \
        ("lab", "p1", "search", 5)
    (job,) = summary.jobs
    assert (job.name, job.plan_id, job.micro_batch) == ("a", "p0", 2)
    assert job.stages == ((0, 20, ("n0",)), (20, 48, ("n1",))) and job.node_ids == ["n0", "n1"]
    assert job.spec == {"params": 1.5e9, "layers": 48}
    assert summary.unplaced == (("c", "does not fit", {}),)
    assert summary_bytes(summary_doc()) == json.dumps(
        summary_doc(), sort_keys=True, separators=(",", ":")).encode()


@pytest.mark.parametrize("mutate, field", [
    (lambda d: d.update(format=PLACEMENT_FORMAT), "format"),
    (lambda d: d["jobs"][0].update(stages=[]), "jobs[0].stages"),
    (lambda d: d["jobs"][0]["stages"][0].update(nodes=[1]), "jobs[0].stages[0]"),
    (lambda d: d["jobs"][0].update(spec=None), "jobs[0].spec"),
    (lambda d: d["jobs"][0].update(micro_batch=0), "jobs[0].micro_batch"),
    (lambda d: d.update(plan_id=""), "plan_id"),
    (lambda d: d["jobs"][0].update(name="a/../b"), "jobs[0].name"),
])
def test_summary_parser_rejects_malformed_documents_naming_the_field(mutate, field):
    doc = summary_doc()
    mutate(doc)
    with pytest.raises(InputError) as err:
        parse_summary(json.dumps(doc), source="hulk/v1/lab/plan")
    assert str(err.value).startswith("hulk/v1/lab/plan: ") and f"{field}: " in str(err.value)
