"""The server certificate `enroll --init-ca` makes covers the configured names and the planner
host's loopback names, so a browser on that host (the dashboard at 127.0.0.1) verifies it."""

from __future__ import annotations

from cryptography import x509

from planner.security.tls import init_pki, server_hosts


def names(pem: bytes) -> tuple[set[str], set[str]]:
    cert = x509.load_pem_x509_certificate(pem)
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return (set(san.get_values_for_type(x509.DNSName)),
            {str(a) for a in san.get_values_for_type(x509.IPAddress)})


def test_the_server_certificate_covers_the_hosts_and_loopback(tmp_path):
    paths = init_pki(tmp_path, ["planner.example.org", "203.0.113.7"])
    dns, ips = names(paths["server_cert"].read_bytes())
    assert dns == {"planner.example.org", "localhost"}
    assert ips == {"203.0.113.7", "127.0.0.1", "::1"}


def test_loopback_names_already_given_are_not_repeated():
    assert server_hosts(["127.0.0.1", "LOCALHOST", "0:0::1", "10.77.0.1"]) == \
        ["127.0.0.1", "LOCALHOST", "0:0::1", "10.77.0.1"]
    assert server_hosts(["hub"]) == ["hub", "localhost", "127.0.0.1", "::1"]
