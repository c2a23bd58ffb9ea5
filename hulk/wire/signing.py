"""Ed25519 signatures over the placement messages (``hulk-placement/2``, ``hulk-plan-summary/2``).

A signed document is a JSON object with a ``signature`` field: the base64 Ed25519 signature of
the document's canonical bytes, that is the compact, key-sorted JSON of the object *without*
``signature``. The fields signed include fleet, node (placements), plan id, ``issued_at_ms`` and
``expires_at_ms``, so a signature cannot be moved to another node, fleet or time.

Keys: the planner's private key is a PKCS#8 PEM file (mode 0600, ``placement-signing.key``);
the public key an agent pins is written ``ed25519:<base64 of the 32 raw bytes>`` (what
``hulk-planner enroll NODE`` prints), or given as the path of a PEM public key file. A
:class:`Verifier` may hold several keys (a list, or keys separated by commas), and a signature
by any one of them is good: that is how the planner's key is rotated without stopping a job
(deploy/INSTALL.md, "Rotating the placement-signing key").
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
    """Signs documents with the planner's private key. ``previous``: the public keys it replaced
    (rotation): what they signed is still trusted, and serve re-signs it with this key."""

    def __init__(self, private_key: Any, previous: "Verifier | None" = None):
        self._key = private_key
        self.previous = previous

    def replacing(self, previous: "Verifier | None") -> "Signer":
        """This key, trusting what ``previous`` signed until it is re-signed."""
        return Signer(self._key, previous)

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
        """This key's public key only."""
        return Verifier(self._key.public_key())

    def trusted(self) -> "Verifier":
        """This key's public key and the ``previous`` ones."""
        own = self.verifier()
        return own if self.previous is None else Verifier.joined(own, self.previous)

    def sign(self, document: dict[str, Any]) -> dict[str, Any]:
        """``document`` with its ``signature`` set."""
        signature = self._key.sign(canonical_bytes(document))
        return {**document, SIGNATURE_FIELD: base64.b64encode(signature).decode()}


def key_texts(value: Any) -> tuple[str, ...]:
    """Public keys as given: a list of them, or one text with commas between them."""
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)) or not all(isinstance(i, str) for i in items):
        raise ConfigError("expected a public key (ed25519:<base64> or a PEM file), or a list of them")
    return tuple(t for t in (i.strip() for i in items) if t)


class Verifier:
    """Checks signatures with pinned public keys: a signature by any one of them is good."""

    def __init__(self, *public_keys: Any):
        if not public_keys:
            raise ValueError("a Verifier needs at least one public key")
        self._keys = public_keys

    @classmethod
    def from_text(cls, text: str | list[str] | tuple[str, ...], *,
                  field: str | None = "placement_key") -> "Verifier":
        """``ed25519:<base64>`` or the path of a PEM public key file, or several of them (a list,
        or one text with commas between them)."""
        try:
            texts = key_texts(text)
        except ConfigError as exc:
            raise ConfigError(str(exc), field=field) from None
        if not texts:
            raise ConfigError("expected a public key (ed25519:<base64> or a PEM file)", field=field)
        return cls(*(cls._one_key(t, field) for t in texts))

    @classmethod
    def joined(cls, *verifiers: "Verifier") -> "Verifier":
        """One Verifier that accepts what any of ``verifiers`` accepts."""
        return cls(*(key for v in verifiers for key in v._keys))

    @staticmethod
    def _one_key(text: str, field: str | None) -> Any:
        ed25519, serialization = _ed25519()
        if text.startswith(KEY_PREFIX):
            try:
                raw = base64.b64decode(text[len(KEY_PREFIX):], validate=True)
                return ed25519.Ed25519PublicKey.from_public_bytes(raw)
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
        return key

    def verify(self, document: dict[str, Any], *, source: str = "message") -> None:
        """InputError (one line) unless ``document`` carries a good signature of one of the keys."""
        from cryptography.exceptions import InvalidSignature

        signature = document.get(SIGNATURE_FIELD)
        if not isinstance(signature, str) or not signature:
            raise InputError("expected a signature (unsigned message)", path=source,
                             field=SIGNATURE_FIELD)
        try:
            raw = base64.b64decode(signature, validate=True)
        except (binascii.Error, ValueError):
            raw = b""
        body = canonical_bytes(document)
        for key in self._keys:
            try:
                key.verify(raw, body)
                return
            except (ValueError, InvalidSignature):
                continue
        pinned = "the pinned placement key" if len(self._keys) == 1 else \
            f"any of the {len(self._keys)} pinned placement keys"
        raise InputError(f"bad signature (not signed by {pinned})", path=source,
                         field=SIGNATURE_FIELD)


def generate_key_files(private_path: Path, public_path: Path, *, field: str = "--init-ca") -> Signer:
    """A new signing key: ``private_path`` (PEM, 0600, never replaced) and ``public_path`` (PEM)."""
    import os

    signer = Signer.generate()
    private_path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(private_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        raise ConfigError(f"{private_path} already exists: keeping it (to replace a placement-"
                          "signing key, run `hulk-planner enroll --new-signing-key DIR` and follow "
                          "deploy/INSTALL.md, 'Rotating the placement-signing key')",
                          field=field) from None
    os.fchmod(fd, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(signer.private_pem())
    public_path.write_bytes(signer.public_pem())
    return signer
