"""The planner's placement-signing key: made by ``enroll --init-ca``, loaded by ``plan --push``
and ``serve --mqtt``.

The key is an Ed25519 key of its own (never the TLS key): ``DIR/placement-signing.key`` (PKCS#8
PEM, mode 0600, readable by the planner service only) and ``DIR/placement-signing.pub``. Agents
pin the public key (``placement_key``); the signature format is ``hulk.wire.signing``'s.
"""

from __future__ import annotations

from pathlib import Path

from hulk.errors import ConfigError
from hulk.wire.signing import Signer, generate_key_files

PRIVATE_NAME = "placement-signing.key"
PUBLIC_NAME = "placement-signing.pub"


def init_signing_key(out_dir: str | Path) -> dict[str, object]:
    """Make DIR/placement-signing.key and .pub (an existing key is kept: ConfigError)."""
    out = Path(out_dir)
    signer = generate_key_files(out / PRIVATE_NAME, out / PUBLIC_NAME)
    return {"signing_key": out / PRIVATE_NAME, "signing_pub": out / PUBLIC_NAME,
            "placement_key": signer.public_text()}


def load_signer(path: str | Path | None, field: str) -> Signer:
    """The signing key at ``path``; ConfigError when none is given (placements are never unsigned)."""
    if not path:
        raise ConfigError("placements are signed: give the placement-signing key (made by "
                          "`hulk-planner enroll --init-ca DIR`, DIR/placement-signing.key) with "
                          f"{field} FILE or HULK_SIGNING_KEY", field=field)
    return Signer.from_file(path, field=field)
