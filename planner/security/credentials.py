"""Node credentials: issue, verify and revoke the bearer tokens agents present to the planner.

A token is ``hulk1.<token_id>.<secret>``: the id finds the row, the secret is checked against a
salted scrypt hash (per-token salt, constant-time compare). Only the hash is stored, never the
token. scrypt is slow on purpose, so a successful verification is remembered in memory keyed by a
SHA-256 digest of the token; every call still reads the credential's row, so a revocation made by
another process (`hulk-planner revoke`) rejects the node on its very next call.

The credential table lives in the planner's SQLite file beside the store's own tables.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import re
import secrets
import sqlite3
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from hulk.errors import InputError, NotFoundError, StoreError, UnauthenticatedError
from planner.service.database import private_file

log = logging.getLogger(__name__)

TOKEN_PREFIX = "hulk1"
INVALID_TOKEN = "invalid token (not issued by this planner, or a wrong secret)"
_DUMMY_SALT = b"hulk-no-such-token-id"   # scrypt for unknown ids too: equal work, equal answer
TOKEN_RE = re.compile(r"^hulk1\.([0-9a-f]{16})\.([A-Za-z0-9_-]{43})$")
NODE_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")  # the agent's rule (agent/config.py)
# scrypt cost: ~30 ms and 16 MiB per verification on these machines; cached after the first.
SCRYPT_N, SCRYPT_R, SCRYPT_P = 2 ** 14, 8, 1
SCHEMA = """
CREATE TABLE IF NOT EXISTS hulk_credentials (
    token_id    TEXT PRIMARY KEY,
    node_id     TEXT NOT NULL,
    salt        BLOB NOT NULL,
    token_hash  BLOB NOT NULL,
    created_ms  INTEGER NOT NULL,
    revoked_ms  INTEGER
);
CREATE INDEX IF NOT EXISTS hulk_credentials_node ON hulk_credentials(node_id);
"""


@dataclass(frozen=True)
class IssuedToken:
    node_id: str
    token: str          # shown once; only its hash is kept
    token_id: str


@dataclass(frozen=True)
class CredentialInfo:
    node_id: str
    token_id: str
    created_ms: int
    revoked_ms: int | None


def check_node_id(node_id: str) -> str:
    if not isinstance(node_id, str) or not NODE_ID_RE.fullmatch(node_id):
        raise InputError("expected 1-128 letters, digits, '.', '_' or '-' starting with a letter "
                         f"or digit, got {node_id!r}", field="node id")
    return node_id


def hash_secret(secret: str, salt: bytes) -> bytes:
    return hashlib.scrypt(secret.encode(), salt=salt, n=SCRYPT_N, r=SCRYPT_R, p=SCRYPT_P,
                          maxmem=64 * 1024 * 1024, dklen=32)


def split_token(token: str) -> tuple[str, str]:
    """(token_id, secret) of a well-formed token; UnauthenticatedError otherwise."""
    match = TOKEN_RE.fullmatch(token or "")
    if not match:
        raise UnauthenticatedError("malformed token (expected hulk1.<id>.<secret> as printed by "
                                   "`hulk-planner enroll`)")
    return match.group(1), match.group(2)


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


class CredentialStore:
    """Tokens bound to node ids, in the planner's SQLite file.

    ``clock`` returns epoch milliseconds (replaceable in tests).
    """

    def __init__(self, db_path: str | Path, *, clock: Callable[[], int] | None = None):
        self.db_path = str(db_path)
        self._clock = clock or (lambda: int(time.time() * 1000))
        self._lock = threading.Lock()
        try:
            self._db = sqlite3.connect(self.db_path, timeout=10.0, check_same_thread=False,
                                       isolation_level=None)
            private_file(self.db_path)
            self._db.execute("PRAGMA busy_timeout=10000")
            self._db.executescript(SCHEMA)
        except sqlite3.Error as exc:
            raise StoreError(f"{self.db_path}: cannot open the credential table: {exc}") from exc
        # sha256(token) -> (token_id, node_id): tokens whose scrypt hash already matched.
        self._verified: dict[bytes, tuple[str, str]] = {}

    def close(self) -> None:
        self._db.close()

    # -------------------------------------------------------------------------------- issuing

    def issue(self, node_id: str) -> IssuedToken:
        """A new token for ``node_id``; the node's earlier tokens are revoked."""
        check_node_id(node_id)
        token_id = secrets.token_hex(8)
        secret = secrets.token_urlsafe(32)
        salt = secrets.token_bytes(16)
        now = self._clock()
        with self._lock:
            try:
                self._db.execute("BEGIN IMMEDIATE")
                self._db.execute("UPDATE hulk_credentials SET revoked_ms=? "
                                 "WHERE node_id=? AND revoked_ms IS NULL", (now, node_id))
                self._db.execute("INSERT INTO hulk_credentials VALUES (?,?,?,?,?,NULL)",
                                 (token_id, node_id, salt, hash_secret(secret, salt), now))
                self._db.execute("COMMIT")
            except sqlite3.Error as exc:
                if self._db.in_transaction:
                    self._db.execute("ROLLBACK")
                raise StoreError(f"{self.db_path}: cannot store the credential: {exc}") from exc
        return IssuedToken(node_id, f"{TOKEN_PREFIX}.{token_id}.{secret}", token_id)

    def revoke(self, node_id: str) -> int:
        """Revoke every live token of ``node_id``; the number revoked (NotFoundError if none)."""
        check_node_id(node_id)
        with self._lock:
            try:
                cur = self._db.execute("UPDATE hulk_credentials SET revoked_ms=? "
                                       "WHERE node_id=? AND revoked_ms IS NULL",
                                       (self._clock(), node_id))
            except sqlite3.Error as exc:
                raise StoreError(f"{self.db_path}: cannot revoke: {exc}") from exc
            self._verified = {k: v for k, v in self._verified.items() if v[1] != node_id}
        if cur.rowcount == 0:
            raise NotFoundError(f"node {node_id!r} has no live credential")
        return cur.rowcount

    def credentials(self) -> list[CredentialInfo]:
        rows = self._db.execute("SELECT node_id, token_id, created_ms, revoked_ms "
                                "FROM hulk_credentials ORDER BY node_id, created_ms").fetchall()
        return [CredentialInfo(*row) for row in rows]

    # ----------------------------------------------------------------------------- verifying

    def verify(self, token: str) -> str:
        """The node id the token is bound to; UnauthenticatedError when it is not valid."""
        token_id, secret = split_token(token)
        try:
            with self._lock:
                row = self._db.execute("SELECT node_id, salt, token_hash, revoked_ms "
                                       "FROM hulk_credentials WHERE token_id=?",
                                       (token_id,)).fetchone()
        except sqlite3.Error as exc:
            raise StoreError(f"{self.db_path}: cannot read credentials: {exc}") from exc
        # One answer for an unknown id and a wrong secret, after the same scrypt work: a caller
        # learns nothing about which token ids exist. Only the holder of the secret hears "revoked".
        if row is None:
            hash_secret(secret, _DUMMY_SALT)
            log.info("token %s: no such token id", token_id)
            raise UnauthenticatedError(INVALID_TOKEN)
        node_id, salt, token_hash, revoked_ms = row
        digest = _digest(token)
        cached = self._verified.get(digest)
        if not (cached is not None and cached[0] == token_id) \
                and not hmac.compare_digest(hash_secret(secret, salt), token_hash):
            log.info("token %s (node %s): wrong secret", token_id, node_id)
            raise UnauthenticatedError(INVALID_TOKEN)
        if revoked_ms is not None:
            self._verified.pop(digest, None)
            raise UnauthenticatedError(f"this token of node {node_id!r} was revoked; enrol the node "
                                       "again with `hulk-planner enroll`")
        if cached is not None and cached[0] == token_id:
            return node_id
        if len(self._verified) > 100_000:  # bounded: a fleet is far smaller
            self._verified.clear()
        self._verified[digest] = (token_id, node_id)
        return node_id

    def is_cached(self, token: str) -> bool:
        """Whether ``token`` was verified before (its next verification costs no scrypt)."""
        return _digest(token) in self._verified


def revoked_node_ids(conn: sqlite3.Connection) -> frozenset[str]:
    """Nodes whose every token was revoked (enrolled, none live now): they may not be planned
    on. Empty for a file without credentials (an insecure fleet never enrols nodes)."""
    try:
        if conn.execute("SELECT 1 FROM sqlite_master WHERE type='table' "
                        "AND name='hulk_credentials'").fetchone() is None:
            return frozenset()
        rows = conn.execute("SELECT node_id FROM hulk_credentials GROUP BY node_id "
                            "HAVING COUNT(revoked_ms) = COUNT(*)").fetchall()
    except sqlite3.Error as exc:
        raise StoreError(f"cannot read revoked nodes: {exc}") from exc
    return frozenset(r[0] for r in rows)
