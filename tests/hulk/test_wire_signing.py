"""Signed placement messages (hulk.wire.signing): what is signed, and what fails verification."""

from __future__ import annotations

import json

import pytest

from hulk.errors import ConfigError, InputError
from hulk.wire.placement import NodePlacement, Role, parse_placement, parse_summary, summary_bytes
from hulk.wire.signing import Signer, Verifier, canonical_bytes, generate_key_files

SIGNER = Signer.generate()
ROLE = Role(plan_id="p1", job="a", phase=0, stage=0, num_stages=1, layer_lo=0, layer_hi=4,
            replica=0, num_replicas=1, rank=0, world_size=1, rendezvous_address="10.0.0.1",
            rendezvous_port=29500, micro_batch=1, command=("python", "train.py"))
PLACEMENT = NodePlacement(fleet="lab", node="n0", plan_id="p1", roles=(ROLE,)).signed(
    SIGNER, issued_at_ms=1000, expires_at_ms=2000)


def test_canonical_bytes_are_the_sorted_compact_json_without_the_signature():
    assert canonical_bytes({"b": 1, "a": [1, "é"], "signature": "x"}) == b'{"a":[1,"\\u00e9"],"b":1}'


def test_a_signed_placement_verifies_with_the_public_key_text_and_file(tmp_path):
    verifier = Verifier.from_text(SIGNER.public_text())
    assert parse_placement(PLACEMENT.to_bytes(), verifier=verifier) == PLACEMENT
    (tmp_path / "k.pub").write_bytes(SIGNER.public_pem())
    assert parse_placement(PLACEMENT.to_bytes(), verifier=Verifier.from_text(str(tmp_path / "k.pub")))


@pytest.mark.parametrize("mutate", [
    lambda d: d.pop("signature"),                       # unsigned
    lambda d: d.update(node="n1"),                       # moved to another node
    lambda d: d.update(fleet="other"),
    lambda d: d.update(plan_id="p2"),
    lambda d: d.update(expires_at_ms=10**12),            # validity stretched
    lambda d: d.update(issued_at_ms=1500),
    lambda d: d["roles"][0].update(command=["sh", "-c", "id"]),
    lambda d: d.update(signature="not base64!"),
])
def test_any_change_to_a_signed_placement_fails_verification(mutate):
    doc = json.loads(PLACEMENT.to_bytes())
    mutate(doc)
    with pytest.raises(InputError) as err:
        parse_placement(json.dumps(doc), source="t", verifier=SIGNER.verifier())
    assert "signature" in str(err.value) and "\n" not in str(err.value)


def test_a_placement_signed_with_another_key_fails():
    other = NodePlacement(fleet="lab", node="n0", plan_id="p1", roles=(ROLE,)).signed(
        Signer.generate(), issued_at_ms=1000, expires_at_ms=2000)
    with pytest.raises(InputError, match="bad signature"):
        parse_placement(other.to_bytes(), verifier=SIGNER.verifier())


def test_summaries_are_signed_too():
    doc = {"format": "hulk-plan-summary/2", "fleet": "lab", "plan_id": "p1", "method": "search",
           "issued_at_ms": 1, "expires_at_ms": 2, "jobs": [], "unplaced": []}
    signed = SIGNER.sign(doc)
    assert parse_summary(summary_bytes(signed), verifier=SIGNER.verifier()).plan_id == "p1"
    with pytest.raises(InputError, match="unsigned"):
        parse_summary(summary_bytes(doc), verifier=SIGNER.verifier())
    with pytest.raises(InputError, match="bad signature"):
        parse_summary(summary_bytes({**signed, "plan_id": "p2"}), verifier=SIGNER.verifier())


def test_key_files_are_private_and_never_replaced(tmp_path):
    signer = generate_key_files(tmp_path / "s.key", tmp_path / "s.pub")
    assert (tmp_path / "s.key").stat().st_mode & 0o777 == 0o600
    assert Signer.from_file(tmp_path / "s.key").public_text() == signer.public_text()
    with pytest.raises(ConfigError, match="already exists"):
        generate_key_files(tmp_path / "s.key", tmp_path / "s.pub")
    assert Signer.from_file(tmp_path / "s.key").public_text() == signer.public_text()


@pytest.mark.parametrize("text", ["ed25519:!!", "ed25519:AAAA", "/no/such/key.pub"])
def test_bad_public_keys_are_one_line_config_errors(text):
    with pytest.raises(ConfigError) as err:
        Verifier.from_text(text)
    assert "\n" not in str(err.value)
