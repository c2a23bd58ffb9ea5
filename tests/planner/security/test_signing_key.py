"""The placement-signing key `hulk-planner enroll --init-ca` makes, and the public key `enroll NODE`
prints for the agent to pin."""

from __future__ import annotations

import json
import stat
import subprocess
import sys

import pytest

from hulk.wire.signing import Signer, Verifier

pytestmark = pytest.mark.process


def enroll(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "planner.cli", "enroll", *args],
                          capture_output=True, text=True, timeout=60)


def test_init_ca_makes_a_private_signing_key_apart_from_tls_and_never_replaces_it(tmp_path):
    first = enroll("--init-ca", str(tmp_path), "--host", "127.0.0.1", "--json")
    assert first.returncode == 0, first.stderr
    out = json.loads(first.stdout)
    key, pub = tmp_path / "placement-signing.key", tmp_path / "placement-signing.pub"
    assert out["signing_key"] == str(key) and out["signing_pub"] == str(pub)
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    signer = Signer.from_file(key)
    assert out["placement_key"] == signer.public_text()
    assert key.read_bytes() not in {(tmp_path / "ca.key").read_bytes(), (tmp_path / "server.key").read_bytes()}
    assert Verifier.from_text(str(pub))                       # the .pub file pins the same key
    before = key.read_bytes()
    (tmp_path / "ca.key").unlink()                            # even without a CA to protect
    second = enroll("--init-ca", str(tmp_path), "--host", "127.0.0.1")
    assert second.returncode == 2 and "placement-signing.key already exists" in second.stderr
    assert second.stderr.count("\n") == 1 and key.read_bytes() == before


def test_enroll_node_prints_the_public_key_the_agent_pins(tmp_path):
    assert enroll("--init-ca", str(tmp_path), "--host", "127.0.0.1").returncode == 0
    key = tmp_path / "placement-signing.key"
    done = enroll("n1", "--db", str(tmp_path / "p.db"), "--signing-key", str(key), "--json")
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["placement_key"] == Signer.from_file(key).public_text()
    assert out["placement_key"].startswith("ed25519:") and "PRIVATE" not in done.stdout


def test_new_signing_key_is_made_beside_the_old_one_which_is_kept(tmp_path):
    assert enroll("--init-ca", str(tmp_path), "--host", "127.0.0.1").returncode == 0
    old = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    names = []
    for _ in range(2):                       # a second one never replaces the first either
        done = enroll("--new-signing-key", str(tmp_path), "--json")
        assert done.returncode == 0, done.stderr
        out = json.loads(done.stdout)
        key = tmp_path / out["signing_key"]
        assert stat.S_IMODE(key.stat().st_mode) == 0o600
        assert out["placement_key"] == Signer.from_file(key).public_text()
        assert Verifier.from_text(out["signing_pub"])
        names.append(key.name)
    assert names[0] == "placement-signing.key.new" and names[1].startswith("placement-signing.key.new-")
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.name in old} == old
    plain = enroll("--new-signing-key", str(tmp_path / "other"))
    assert plain.returncode == 0 and "placement_key: ed25519:" in plain.stdout
    assert "Rotating the placement-signing key" in plain.stderr


def test_serve_refuses_a_bad_previous_placement_key_in_one_line(tmp_path):
    assert enroll("--init-ca", str(tmp_path), "--host", "127.0.0.1").returncode == 0
    for bad in ("ed25519:nope", str(tmp_path / "missing.pub")):
        done = subprocess.run([sys.executable, "-m", "planner.cli", "serve", "--db",
                               str(tmp_path / "p.db"), "--mqtt", "mqtt://127.0.0.1:1",
                               "--signing-key", str(tmp_path / "placement-signing.key"),
                               "--previous-placement-key", bad],
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
        assert "--previous-placement-key" in done.stderr and not (tmp_path / "p.db").exists()
