"""The private CA and keys `hulk-planner enroll --init-ca` writes: never replaced by accident, never loose."""

from __future__ import annotations

import stat
import subprocess
import sys

import pytest

from hulk.errors import ConfigError
from planner.security.tls import init_pki, issue_cert, create_ca


def mode(path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_an_existing_ca_key_is_kept_and_the_error_says_so(tmp_path):
    paths = init_pki(tmp_path, ["127.0.0.1"])
    before = paths["ca_key"].read_bytes(), paths["ca"].read_bytes()
    with pytest.raises(ConfigError, match="ca.key already exists: keeping it"):
        init_pki(tmp_path, ["127.0.0.1"])
    assert (paths["ca_key"].read_bytes(), paths["ca"].read_bytes()) == before


@pytest.mark.process
def test_the_cli_refuses_a_second_init_ca_with_exit_2(tmp_path):
    command = [sys.executable, "-m", "planner.cli", "enroll", "--init-ca", str(tmp_path),
               "--host", "127.0.0.1"]
    first = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert first.returncode == 0, first.stderr
    key = (tmp_path / "ca.key").read_bytes()
    second = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert second.returncode == 2 and "already exists" in second.stderr
    assert "Traceback" not in second.stderr and second.stderr.count("\n") == 1
    assert (tmp_path / "ca.key").read_bytes() == key


def test_keys_are_0600_even_over_a_loose_existing_file(tmp_path):
    ca = create_ca(tmp_path)
    assert mode(ca.key) == 0o600
    loose = tmp_path / "server.key"
    loose.write_text("old")
    loose.chmod(0o644)
    issued = issue_cert(ca, tmp_path, "server", hosts=["127.0.0.1"])
    assert issued.key == loose and mode(loose) == 0o600 and b"PRIVATE KEY" in loose.read_bytes()


def test_serve_blames_the_certificate_or_key_file_not_its_listen_address(tmp_path):
    from planner.security.tls import server_credentials

    paths = init_pki(tmp_path / "a", ["127.0.0.1"])
    other = init_pki(tmp_path / "b", ["127.0.0.1"])
    garbage = tmp_path / "cert.pem"
    garbage.write_bytes(b"-----BEGIN CERTIFICATE-----\nnot base64 at all\n-----END CERTIFICATE-----\n")
    bad_key = tmp_path / "server.key"
    bad_key.write_bytes(b"-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n")
    cases = [((garbage, paths["server_key"], None), str(garbage), "--tls-cert"),
             ((paths["server_cert"], bad_key, None), str(bad_key), "--tls-key"),
             ((paths["server_cert"], other["server_key"], None), str(other["server_key"]),
              "--tls-key"),
             ((paths["server_cert"], paths["server_key"], garbage), str(garbage), "--client-ca")]
    for args, path, flag in cases:
        with pytest.raises(ConfigError) as caught:
            server_credentials(*args)
        assert caught.value.path == path and caught.value.field == flag, (args, caught.value)
        assert "\n" not in str(caught.value)
    server_credentials(paths["server_cert"], paths["server_key"], paths["ca"])   # a good set
