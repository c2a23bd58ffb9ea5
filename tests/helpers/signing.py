"""One placement-signing key for the test session, and issue times agents accept (not expired)."""

from __future__ import annotations

import time

from hulk.wire.signing import Signer

SIGNER = Signer.generate()
VERIFIER = SIGNER.verifier()
PUBLIC_KEY = SIGNER.public_text()
T0 = int(time.time() * 1000)       # an issue time: placements issued at T0 + k are valid 7 days


def write_signing_key(path) -> str:
    """SIGNER's private key as a PEM file (for `--signing-key` of planner processes)."""
    path.write_bytes(SIGNER.private_pem())
    path.chmod(0o600)
    return str(path)
