"""A placement's sequence number (hulk.wire.placement ``seq``): rendered, parsed, signed, and
left out at 0 so a message of a planner without sequences still parses and verifies."""

from __future__ import annotations

import json

import pytest

from hulk.errors import InputError
from hulk.wire.placement import MAX_COMMAND_WORDS, MAX_SEQ, NodePlacement, Role, parse_placement
from tests.helpers.signing import SIGNER, T0, VERIFIER

ROLE = Role(plan_id="p1", job="a", phase=0, stage=0, num_stages=1, layer_lo=0, layer_hi=4,
            replica=0, num_replicas=1, rank=0, world_size=1, rendezvous_address="10.0.0.1",
            rendezvous_port=29500, micro_batch=2, command=("python", "train.py"))
BARE = NodePlacement(fleet="lab", node="n0", plan_id="p1", roles=(ROLE,))


@pytest.mark.parametrize("seq", [1, 1_795_305_126_095, MAX_SEQ])
def test_seq_round_trips_and_is_signed(seq):
    signed = BARE.signed(SIGNER, issued_at_ms=T0, expires_at_ms=T0 + 1000, seq=seq)
    doc = json.loads(signed.to_bytes())
    assert doc["seq"] == seq
    back = parse_placement(signed.to_bytes(), verifier=VERIFIER)
    assert back == signed and back.seq == seq
    doc["seq"] = seq - 1                                  # the signature covers it
    with pytest.raises(InputError, match="bad signature"):
        parse_placement(json.dumps(doc), verifier=VERIFIER)


def test_a_message_without_seq_parses_as_seq_0_and_still_verifies():
    old = BARE.signed(SIGNER, issued_at_ms=T0, expires_at_ms=T0 + 1000)  # no seq: an older planner
    doc = json.loads(old.to_bytes())
    assert "seq" not in doc
    back = parse_placement(json.dumps(doc), verifier=VERIFIER)
    assert back.seq == 0 and back == old
    assert BARE.signed(SIGNER, issued_at_ms=T0, expires_at_ms=T0 + 1000, seq=7).signed(
        SIGNER, issued_at_ms=T0, expires_at_ms=T0 + 1000).seq == 7      # None keeps its own


@pytest.mark.parametrize("seq", [-1, MAX_SEQ + 1, "5", 1.5, True, None])
def test_a_seq_out_of_range_or_of_another_type_is_refused_naming_it(seq):
    doc = BARE.to_json()
    doc["seq"] = seq
    with pytest.raises(InputError) as err:
        parse_placement(json.dumps(doc), source="t")
    assert str(err.value).startswith("t: seq: ") and "\n" not in str(err.value)


def test_a_clear_is_a_signed_placement_without_roles():
    clear = NodePlacement(fleet="lab", node="n0", plan_id="cleared").signed(
        SIGNER, issued_at_ms=T0, expires_at_ms=T0 + 1000, seq=T0)
    back = parse_placement(clear.to_bytes(), verifier=VERIFIER)
    assert back.roles == () and back.seq == T0


def test_the_command_word_limit_is_the_parsers():
    doc = BARE.to_json()
    doc["roles"][0]["command"] = ["python"] * MAX_COMMAND_WORDS
    assert len(parse_placement(json.dumps(doc)).roles[0].command) == MAX_COMMAND_WORDS
    doc["roles"][0]["command"].append("x")
    with pytest.raises(InputError, match=f"1-{MAX_COMMAND_WORDS} strings"):
        parse_placement(json.dumps(doc))
