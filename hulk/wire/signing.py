"""Ed25519 signatures over the placement messages (``hulk-placement/2``, ``hulk-plan-summary/2``).

A signed document is a JSON object with a ``signature`` field: the base64 Ed25519 signature of
the document's canonical bytes, that is the compact, key-sorted JSON of the object *without*
``signature``. The fields signed include fleet, node (placements), plan id, ``issued_at_ms`` and
``expires_at_ms``, so a signature cannot be moved to another node, fleet or time.

Keys: the planner's private key is a PKCS#8 PEM file (mode 0600, ``placement-signing.key``);
the public key an agent pins is written ``ed25519:<base64 of the 32 raw bytes>`` (what
``hulk-planner enroll NODE`` prints), or given as the path of a PEM public key file.
"""

from __future__ import annotations

import base64
import binascii
import json
from pathlib import Path
from typing import Any

from hulk.errors import ConfigError, InputError

KEY_PREFIX = "ed25519:"
SIGNATURE_FIELD = "signature"


def _ed25519():
    try:
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import ed25519
    except ImportError as exc:
        raise ConfigError("the 'cryptography' package is needed to sign or verify placements "
                          "(pip install cryptography)") from exc
    return ed25519, serialization


def canonical_bytes(document: dict[str, Any]) -> bytes:
    """What is signed: the compact sorted JSON of ``document`` without its signature."""
    body = {k: v for k, v in document.items() if k != SIGNATURE_FIELD}
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


class Signer:
    """Signs documents with the planner's private key."""

    def __init__(self, private_key: Any):
        self._key = private_key

    @classmethod
    def generate(cls) -> "Signer":
        ed25519, _ = _ed25519()
        return cls(ed25519.Ed25519PrivateKey.generate())

    @classmethod
    def from_file(cls, path: str | Path, *, field: str = "--signing-key") -> "Signer":
        ed25519, serialization = _ed25519()
        try:
            key = serialization.load_pem_private_key(Path(path).read_bytes(), password=None)
        except OSError as exc:
            raise ConfigError(f"cannot read the placement-signing key: {exc.strerror or exc}",
                              path=str(path), field=field) from None
        except (ValueError, TypeError):
            raise ConfigError("expected a PEM Ed25519 private key", path=str(path), field=field) from None
        if not isinstance(key, ed25519.Ed25519PrivateKey):
            raise ConfigError("expected an Ed25519 private key", path=str(path), field=field)
        return cls(key)

    def private_pem(self) -> bytes:
        _, serialization = _ed25519()
        return self._key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption())

    def public_pem(self) -> bytes:
        _, serialization = _ed25519()
        return self._key.public_key().public_bytes(serialization.Encoding.PEM,
                                                   serialization.PublicFormat.SubjectPublicKeyInfo)

    def public_text(self) -> str:
        """``ed25519:<base64>``: the form an agent's ``placement_key`` takes."""
        _, serialization = _ed25519()
        raw = self._key.public_key().public_bytes(serialization.Encoding.Raw,
                                                  serialization.PublicFormat.Raw)
        return KEY_PREFIX + base64.b64encode(raw).decode()

    def verifier(self) -> "Verifier":
        return Verifier(self._key.public_key())

    def sign(self, document: dict[str, Any]) -> dict[str, Any]:
        """``document`` with its ``signature`` set."""
        signature = self._key.sign(canonical_bytes(document))
        return {**document, SIGNATURE_FIELD: base64.b64encode(signature).decode()}


class Verifier:
    """Checks signatures with a pinned public key."""

    def __init__(self, public_key: Any):
        self._key = public_key

    @classmethod
    def from_text(cls, text: str, *, field: str | None = "placement_key") -> "Verifier":
        """``ed25519:<base64>`` or the path of a PEM public key file."""
        ed25519, serialization = _ed25519()
        text = text.strip()
        if text.startswith(KEY_PREFIX):
            try:
                raw = base64.b64decode(text[len(KEY_PREFIX):], validate=True)
                return cls(ed25519.Ed25519PublicKey.from_public_bytes(raw))
            except (binascii.Error, ValueError):
                raise ConfigError("expected ed25519:<base64 of 32 bytes>", field=field) from None
        try:
            key = serialization.load_pem_public_key(Path(text).expanduser().read_bytes())
        except OSError as exc:
            raise ConfigError(f"expected ed25519:<base64> or a PEM public key file, cannot read "
                              f"{text!r}: {exc.strerror or exc}", field=field) from None
        except (ValueError, TypeError):
            raise ConfigError(f"expected a PEM Ed25519 public key in {text!r}", field=field) from None
        if not isinstance(key, ed25519.Ed25519PublicKey):
            raise ConfigError(f"expected an Ed25519 public key in {text!r}", field=field)
        return cls(key)

    def verify(self, document: dict[str, Any], *, source: str = "message") -> None:
        """InputError (one line) unless ``document`` carries a good signature of this key."""
        from cryptography.exceptions import InvalidSignature

        signature = document.get(SIGNATURE_FIELD)
        if not isinstance(signature, str) or not signature:
            raise InputError("expected a signature (unsigned message)", path=source,
                             field=SIGNATURE_FIELD)
        try:
            self._key.verify(base64.b64decode(signature, validate=True), canonical_bytes(document))
        except (binascii.Error, ValueError, InvalidSignature):
            raise InputError("bad signature (not signed by the pinned placement key)", path=source,
                             field=SIGNATURE_FIELD) from None


def generate_key_files(private_path: Path, public_path: Path) -> Signer:
    """A new signing key: ``private_path`` (PEM, 0600, never replaced) and ``public_path`` (PEM)."""
    import os

    signer = Signer.generate()
    private_path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(private_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        raise ConfigError(f"{private_path} already exists: keeping it (move it away first to make a "
                          "new placement-signing key; every agent must then pin the new public key)",
                          field="--init-ca") from None
    os.fchmod(fd, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(signer.private_pem())
    public_path.write_bytes(signer.public_pem())
    return signer
