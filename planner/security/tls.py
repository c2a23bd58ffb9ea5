"""TLS for the planner's gRPC server: load its certificate, optionally require client certificates,
and create a small private CA (for `hulk-planner enroll --init-ca` and for tests).

A fleet normally runs its own CA: the planner's server certificate is signed by it and agents trust
it through ``ca:`` in their config (``HULK_CA``). Client certificates (mTLS) are optional; node
identity always comes from the enrolment token.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

import grpc

from hulk.errors import ConfigError


def _read(path: str | os.PathLike, what: str, flag: str) -> bytes:
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read the {what}: {exc.strerror or exc}", path=str(path),
                          field=flag) from exc
    if b"-----BEGIN " not in data:
        raise ConfigError(f"expected a PEM {what}", path=str(path), field=flag)
    return data


def server_credentials(cert: str | os.PathLike, key: str | os.PathLike,
                       client_ca: str | os.PathLike | None = None) -> grpc.ServerCredentials:
    """Server TLS from PEM files; with ``client_ca`` every client must present a certificate it
    signed (mTLS)."""
    cert_pem = _read(cert, "server certificate", "--tls-cert")
    key_pem = _read(key, "server private key", "--tls-key")
    ca_pem = _read(client_ca, "client CA certificate", "--client-ca") if client_ca else None
    check_server_files(cert, cert_pem, key, key_pem, client_ca, ca_pem)
    return grpc.ssl_server_credentials([(key_pem, cert_pem)], root_certificates=ca_pem,
                                       require_client_auth=ca_pem is not None)


def check_server_files(cert: str | os.PathLike, cert_pem: bytes, key: str | os.PathLike,
                       key_pem: bytes, client_ca: str | os.PathLike | None = None,
                       ca_pem: bytes | None = None) -> None:
    """ConfigError naming the file unless the certificate, the key and the client CA parse and
    the key is the certificate's: gRPC would only fail to listen, blaming --listen."""
    import ssl
    import tempfile

    x509, _, serialization, _, _, _ = _crypto()
    for path, pem, flag, what in ((cert, cert_pem, "--tls-cert", "server certificate"),
                                  (client_ca, ca_pem, "--client-ca", "client CA certificate")):
        if pem is None:
            continue
        try:
            x509.load_pem_x509_certificates(pem)
        except ValueError as exc:
            raise ConfigError(f"expected a PEM {what}: {exc}", path=str(path), field=flag) from None
    try:
        serialization.load_pem_private_key(key_pem, password=None)
    except (ValueError, TypeError) as exc:   # TypeError: the key is encrypted
        raise ConfigError(f"expected an unencrypted PEM private key: {exc}", path=str(key),
                          field="--tls-key") from None
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    with tempfile.TemporaryDirectory() as tmp:   # load_cert_chain reads files only
        pair = Path(tmp)
        (pair / "c.pem").write_bytes(cert_pem)
        (pair / "k.pem").write_bytes(key_pem)
        try:
            context.load_cert_chain(pair / "c.pem", pair / "k.pem")
        except ssl.SSLError as exc:
            raise ConfigError(f"the key is not the certificate {cert}'s ({exc.reason or exc})",
                              path=str(key), field="--tls-key") from None


def channel_credentials(ca: str | os.PathLike, client_cert: str | os.PathLike | None = None,
                        client_key: str | os.PathLike | None = None) -> grpc.ChannelCredentials:
    """What an agent (or a test) uses to reach the planner."""
    ca_pem = _read(ca, "CA certificate", "ca")
    chain = _read(client_cert, "client certificate", "client_cert") if client_cert else None
    key = _read(client_key, "client private key", "client_key") if client_key else None
    return grpc.ssl_channel_credentials(root_certificates=ca_pem, private_key=key,
                                        certificate_chain=chain)


# --------------------------------------------------------------------- a private CA (cryptography)

@dataclass(frozen=True)
class CertPaths:
    cert: Path
    key: Path


def _crypto():
    try:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
    except ImportError as exc:  # the planner extra installs it
        raise ConfigError("the 'cryptography' package is needed to create certificates "
                          "(pip install 'hulk[planner]'), or create them with openssl") from exc
    return x509, hashes, serialization, ec, NameOID, ExtendedKeyUsageOID


def _write_private(path: Path, data: bytes, *, replace: bool = True) -> None:
    """Write a private key with mode 0600, also over an existing file with a looser mode.

    ``replace=False`` refuses an existing file (a CA key replaced by accident orphans every
    certificate and node it signed)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    flags = os.O_WRONLY | os.O_CREAT | (os.O_TRUNC if replace else os.O_EXCL)
    try:
        fd = os.open(path, flags, 0o600)
    except FileExistsError:
        raise ConfigError(f"{path} already exists: keeping it (move it away first to make a new "
                          "CA; every certificate it signed must then be issued again)",
                          field="--init-ca") from None
    os.fchmod(fd, 0o600)  # O_CREAT's mode applies only to a new file
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)


def _key_pem(key, serialization) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def create_ca(out_dir: str | os.PathLike, name: str = "Hulk fleet CA",
              days: int = 3650) -> CertPaths:
    """A self-signed CA in ``out_dir/ca.pem`` and ``out_dir/ca.key`` (mode 0600)."""
    x509, hashes, serialization, ec, NameOID, _ = _crypto()
    out = Path(out_dir)
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = dt.datetime.now(dt.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False,
                                         data_encipherment=False, key_agreement=False,
                                         encipher_only=False, decipher_only=False), critical=True)
            .sign(key, hashes.SHA256()))
    paths = CertPaths(out / "ca.pem", out / "ca.key")
    _write_private(paths.key, _key_pem(key, serialization), replace=False)
    paths.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return paths


def issue_cert(ca: CertPaths, out_dir: str | os.PathLike, name: str, *,
               hosts: list[str] | tuple[str, ...] = (), client: bool = False,
               days: int = 825) -> CertPaths:
    """A certificate signed by ``ca``: a server certificate for ``hosts`` (DNS names or IP
    addresses), or with ``client`` a client certificate whose common name is ``name``."""
    x509, hashes, serialization, ec, NameOID, EKU = _crypto()
    try:
        ca_cert = x509.load_pem_x509_certificate(ca.cert.read_bytes())
        ca_key = serialization.load_pem_private_key(ca.key.read_bytes(), password=None)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot load the CA: {exc}", path=str(ca.cert)) from exc
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.timezone.utc)
    builder = (x509.CertificateBuilder()
               .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
               .issuer_name(ca_cert.subject).public_key(key.public_key())
               .serial_number(x509.random_serial_number())
               .not_valid_before(now - dt.timedelta(minutes=5))
               .not_valid_after(now + dt.timedelta(days=days))
               .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
               .add_extension(x509.ExtendedKeyUsage(
                   [EKU.CLIENT_AUTH] if client else [EKU.SERVER_AUTH]), critical=False))
    if hosts:
        alt = []
        for host in hosts:
            try:
                alt.append(x509.IPAddress(ipaddress.ip_address(host)))
            except ValueError:
                alt.append(x509.DNSName(host))
        builder = builder.add_extension(x509.SubjectAlternativeName(alt), critical=False)
    cert = builder.sign(ca_key, hashes.SHA256())
    out = Path(out_dir)
    stem = name.replace("/", "_")
    paths = CertPaths(out / f"{stem}.pem", out / f"{stem}.key")
    _write_private(paths.key, _key_pem(key, serialization))
    paths.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return paths


# The planner host's own names: a browser or tool on that host (the dashboard opened over
# 127.0.0.1, a health check) then verifies serve's certificate like any remote client.
LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1")


def server_hosts(hosts: list[str] | tuple[str, ...]) -> list[str]:
    """The server certificate's names: ``hosts`` in order, then the loopback names not among
    them (an address compared as an address: ``0:0::1`` is ``::1``)."""
    def key(host: str) -> str:
        try:
            return str(ipaddress.ip_address(host))
        except ValueError:
            return host.lower()
    out, seen = [], set()
    for host in [*hosts, *LOOPBACK_HOSTS]:
        if key(host) not in seen:
            seen.add(key(host))
            out.append(host)
    return out


def init_pki(out_dir: str | os.PathLike, hosts: list[str] | tuple[str, ...]) -> dict[str, Path]:
    """CA + a server certificate for ``hosts`` (the planner's and the broker's names/addresses)
    and the loopback names.

    Returns the paths: ``ca``, ``ca_key``, ``server_cert``, ``server_key``."""
    if not hosts:
        raise ConfigError("expected at least one host name or address for the server certificate",
                          field="--host")
    ca = create_ca(out_dir)
    server = issue_cert(ca, out_dir, "server", hosts=server_hosts(hosts))
    return {"ca": ca.cert, "ca_key": ca.key, "server_cert": server.cert,
            "server_key": server.key}
