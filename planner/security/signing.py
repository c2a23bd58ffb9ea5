"""The planner's placement-signing key: made by ``enroll --init-ca``, loaded by ``plan --push``
and ``serve --mqtt``.

The key is an Ed25519 key of its own (never the TLS key): ``DIR/placement-signing.key`` (PKCS#8
PEM, mode 0600, readable by the planner service only) and ``DIR/placement-signing.pub``. Agents
pin the public key (``placement_key``); the signature format is ``hulk.wire.signing``'s.

A replacement (``enroll --new-signing-key DIR``: :func:`new_signing_key`) is written beside the
key in use, never over it: ``DIR/placement-signing.key.new`` and ``.pub.new``, or a dated name
when those exist. Serve started with it and the old public key as ``--previous-placement-key``
re-signs the retained plan (deploy/INSTALL.md, "Rotating the placement-signing key").
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

from hulk.errors import ConfigError
from hulk.wire.signing import Signer, Verifier, generate_key_files, key_texts

PRIVATE_NAME = "placement-signing.key"
PUBLIC_NAME = "placement-signing.pub"


def init_signing_key(out_dir: str | Path) -> dict[str, object]:
    """Make DIR/placement-signing.key and .pub (an existing key is kept: ConfigError)."""
    out = Path(out_dir)
    signer = generate_key_files(out / PRIVATE_NAME, out / PUBLIC_NAME)
    return {"signing_key": out / PRIVATE_NAME, "signing_pub": out / PUBLIC_NAME,
            "placement_key": signer.public_text()}


def new_signing_key(out_dir: str | Path, *, clock=time.gmtime) -> dict[str, object]:
    """A replacement key beside the one in DIR, which is kept: ``placement-signing.key.new`` (and
    ``.pub.new``), or ``.new-YYYYMMDDTHHMMSS`` when a replacement is already there."""
    out = Path(out_dir)
    suffix = ".new"
    if (out / (PRIVATE_NAME + suffix)).exists():
        suffix = ".new-" + time.strftime("%Y%m%dT%H%M%S", clock())
    private, public = out / (PRIVATE_NAME + suffix), out / (PUBLIC_NAME + suffix)
    signer = generate_key_files(private, public, field="--new-signing-key")
    return {"signing_key": private, "signing_pub": public, "placement_key": signer.public_text()}


def load_signer(path: str | Path | None, field: str,
                previous: Sequence[str] | None = None) -> Signer:
    """The signing key at ``path``, trusting what the ``previous`` public keys signed
    (``--previous-placement-key``); ConfigError when none is given (placements are never unsigned)."""
    if not path:
        raise ConfigError("placements are signed: give the placement-signing key (made by "
                          "`hulk-planner enroll --init-ca DIR`, DIR/placement-signing.key) with "
                          f"{field} FILE or HULK_SIGNING_KEY", field=field)
    signer = Signer.from_file(path, field=field)
    keys = [k for text in previous or () for k in key_texts(text)]
    if not keys:
        return signer
    old = Verifier.from_text(keys, field="--previous-placement-key")
    return signer.replacing(old)
