"""Node credentials: issue, verify and revoke the bearer tokens agents present to the planner.

A token is ``hulk1.<token_id>.<secret>``: the id finds the row. Each row keeps two checks of the
secret, never the token itself:

- a 16-byte HMAC-SHA256 tag of the token under the planner's auth key (32 random bytes in
  ``<db>.auth-key`` beside the store, owner-only), compared in constant time. It settles almost
  every call in microseconds: an unknown id or a wrong secret is refused without scrypt, so an
  unauthenticated caller cannot make the planner hash, and an enrolled node's first call after a
  restart costs no scrypt either (the tag is on disk, not in memory);
- a salted scrypt hash (per-token salt), the check a copy of the database alone allows: without
  the key file a guess costs one scrypt. It runs only for a row without a tag under the current
  key (a store from before tags, or a lost key file); its success writes the tag.

Every call reads the credential's row, so a revocation made by another process
(`hulk-planner revoke`) rejects the node on its very next call. The credential table lives in
the planner's SQLite file beside the store's own tables.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import re
import secrets
import sqlite3
import threading
import time
from collections.abc import Callable
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path

from hulk.errors import InputError, NotFoundError, StoreError, UnauthenticatedError
from hulk.validate import NAME_EXPECTED, is_name, shown
from planner.service.database import private_file

log = logging.getLogger(__name__)

TOKEN_PREFIX = "hulk1"
INVALID_TOKEN = "invalid token (not issued by this planner, or a wrong secret)"
TAG_BYTES = 16
KEY_BYTES = 32
TOKEN_RE = re.compile(r"^hulk1\.([0-9a-f]{16})\.([A-Za-z0-9_-]{43})$")
# scrypt cost: ~30 ms and 16 MiB per check; only rows without a current tag need it.
SCRYPT_N, SCRYPT_R, SCRYPT_P = 2 ** 14, 8, 1
SCHEMA = """
CREATE TABLE IF NOT EXISTS hulk_credentials (
    token_id    TEXT PRIMARY KEY,
    node_id     TEXT NOT NULL,
    salt        BLOB NOT NULL,
    token_hash  BLOB NOT NULL,
    created_ms  INTEGER NOT NULL,
    revoked_ms  INTEGER,
    tag         BLOB,
    tag_key     BLOB
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
    if not is_name(node_id):
        raise InputError(f"expected {NAME_EXPECTED}, got {shown(node_id)}", field="node id")
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


def auth_key_path(db_path: str | Path) -> Path:
    return Path(f"{db_path}.auth-key")


def _read_key(path: Path) -> bytes | None:
    try:
        key = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise StoreError(f"{path}: cannot read the auth key: {exc.strerror}") from None
    if len(key) != KEY_BYTES:
        raise StoreError(f"{path}: expected a {KEY_BYTES}-byte auth key, found {len(key)} bytes "
                         "(delete it to make a new one; each node is then checked once by scrypt)")
    return key


def _create_key(path: Path) -> bytes:
    """The key at ``path``, made if missing. Written aside and linked into place, so a concurrent
    `hulk-planner enroll` and `serve` end up with the same key, never a half-written one."""
    temp = path.with_name(f"{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as out:
            out.write(secrets.token_bytes(KEY_BYTES))
            out.flush()
            os.fsync(out.fileno())
        try:
            os.link(temp, path)
        except FileExistsError:
            pass
        finally:
            os.unlink(temp)
    except OSError as exc:
        raise StoreError(f"{path}: cannot create the auth key: {exc.strerror}") from None
    key = _read_key(path)
    assert key is not None
    return key


class CredentialStore:
    """Tokens bound to node ids, in the planner's SQLite file.

    ``clock`` returns epoch milliseconds and ``secret_hash`` is the scrypt check (both replaceable
    in tests, e.g. to count how often scrypt runs).
    """

    def __init__(self, db_path: str | Path, *, clock: Callable[[], int] | None = None,
                 secret_hash: Callable[[str, bytes], bytes] = hash_secret):
        self.db_path = str(db_path)
        self._clock = clock or (lambda: int(time.time() * 1000))
        self._hash = secret_hash
        self._lock = threading.Lock()
        self._memory = self.db_path == ":memory:"
        self.key_path = auth_key_path(self.db_path)
        try:
            self._db = sqlite3.connect(self.db_path, timeout=10.0, check_same_thread=False,
                                       isolation_level=None)
            private_file(self.db_path)
            self._db.execute("PRAGMA busy_timeout=10000")
            self._db.executescript(SCHEMA)
            columns = {r[1] for r in self._db.execute("PRAGMA table_info(hulk_credentials)")}
            for column in ("tag", "tag_key"):       # a store made before tags
                if column not in columns:
                    self._db.execute(f"ALTER TABLE hulk_credentials ADD COLUMN {column} BLOB")
        except sqlite3.Error as exc:
            raise StoreError(f"{self.db_path}: cannot open the credential table: {exc}") from exc
        self._key = secrets.token_bytes(KEY_BYTES) if self._memory else _read_key(self.key_path)

    def close(self) -> None:
        self._db.close()

    # --------------------------------------------------------------------------------- the key

    def _current_key(self, create: bool) -> tuple[bytes, bytes] | None:
        """(key, key id) or None when there is no key yet and ``create`` is false. A missing key
        is looked for again each time: `hulk-planner enroll` may make it while serve runs."""
        if self._key is None:
            self._key = _read_key(self.key_path)
        if self._key is None:
            if not create:
                return None
            self._key = _create_key(self.key_path)
        return self._key, hashlib.sha256(b"hulk-auth-key-id" + self._key).digest()[:8]

    @staticmethod
    def _tag(key: bytes, token: str) -> bytes:
        return hmac.new(key, token.encode(), hashlib.sha256).digest()[:TAG_BYTES]

    # -------------------------------------------------------------------------------- issuing

    def issue(self, node_id: str) -> IssuedToken:
        """A new token for ``node_id``; the node's earlier tokens are revoked."""
        check_node_id(node_id)
        token_id = secrets.token_hex(8)
        secret = secrets.token_urlsafe(32)
        salt = secrets.token_bytes(16)
        token = f"{TOKEN_PREFIX}.{token_id}.{secret}"
        key, key_id = self._current_key(create=True)
        token_hash = self._hash(secret, salt)
        now = self._clock()
        with self._lock:
            try:
                self._db.execute("BEGIN IMMEDIATE")
                self._db.execute("UPDATE hulk_credentials SET revoked_ms=? "
                                 "WHERE node_id=? AND revoked_ms IS NULL", (now, node_id))
                self._db.execute("INSERT INTO hulk_credentials (token_id, node_id, salt, "
                                 "token_hash, created_ms, tag, tag_key) VALUES (?,?,?,?,?,?,?)",
                                 (token_id, node_id, salt, token_hash, now,
                                  self._tag(key, token), key_id))
                self._db.execute("COMMIT")
            except sqlite3.Error as exc:
                if self._db.in_transaction:
                    self._db.execute("ROLLBACK")
                raise StoreError(f"{self.db_path}: cannot store the credential: {exc}") from exc
        return IssuedToken(node_id, token, token_id)

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
        node_id = self.check_tag(token)
        return node_id if node_id is not None else self.verify_slowly(token)

    def check_tag(self, token: str) -> str | None:
        """The keyed check, no scrypt: the node id, UnauthenticatedError, or None when only
        :meth:`verify_slowly` can tell (the row has no tag under the current key)."""
        token_id, _ = split_token(token)
        row = self._row(token_id)
        current = self._current_key(create=False)
        # An unknown id and a wrong secret get one answer after the same work (a row read and an
        # HMAC): a caller learns nothing about which token ids exist.
        tag = self._tag(current[0] if current else b"", token)
        if row is None:
            hmac.compare_digest(tag, bytes(TAG_BYTES))
            log.info("token %s: no such token id", token_id)
            raise UnauthenticatedError(INVALID_TOKEN)
        node_id, _, _, revoked_ms, stored_tag, tag_key = row
        if current is None or stored_tag is None or tag_key != current[1]:
            return None
        if not hmac.compare_digest(tag, stored_tag):
            log.info("token %s (node %s): wrong secret", token_id, node_id)
            raise UnauthenticatedError(INVALID_TOKEN)
        return self._live(node_id, revoked_ms)

    def verify_slowly(self, token: str) -> str:
        """The scrypt check, for a row without a current tag; on success the tag is stored, so
        this token's later checks (after restarts too) are :meth:`check_tag`'s."""
        token_id, secret = split_token(token)
        row = self._row(token_id)
        if row is None:
            log.info("token %s: no such token id", token_id)
            raise UnauthenticatedError(INVALID_TOKEN)
        node_id, salt, token_hash, revoked_ms, _, _ = row
        if not hmac.compare_digest(self._hash(secret, salt), token_hash):
            log.info("token %s (node %s): wrong secret", token_id, node_id)
            raise UnauthenticatedError(INVALID_TOKEN)
        node_id = self._live(node_id, revoked_ms)
        key, key_id = self._current_key(create=True)
        self._store_tag(token_id, self._tag(key, token), key_id)
        return node_id

    def _row(self, token_id: str) -> tuple | None:
        try:
            with self._lock:
                return self._db.execute(
                    "SELECT node_id, salt, token_hash, revoked_ms, tag, tag_key "
                    "FROM hulk_credentials WHERE token_id=?", (token_id,)).fetchone()
        except sqlite3.Error as exc:
            raise StoreError(f"{self.db_path}: cannot read credentials: {exc}") from exc

    @staticmethod
    def _live(node_id: str, revoked_ms: int | None) -> str:
        # Only the holder of the secret hears "revoked".
        if revoked_ms is not None:
            raise UnauthenticatedError(f"this token of node {node_id!r} was revoked; enrol the "
                                       "node again with `hulk-planner enroll`")
        return node_id

    def _store_tag(self, token_id: str, tag: bytes, key_id: bytes) -> None:
        """Best effort: without the tag the next check is scrypt again. Its own connection, so a
        busy store never holds the lock the event loop's tag checks take."""
        update = "UPDATE hulk_credentials SET tag=?, tag_key=? WHERE token_id=?"
        try:
            if self._memory:
                with self._lock:
                    self._db.execute(update, (tag, key_id, token_id))
                return
            with closing(sqlite3.connect(self.db_path, timeout=2.0, isolation_level=None)) as db:
                db.execute(update, (tag, key_id, token_id))
        except sqlite3.Error as exc:
            log.warning("%s: cannot store the tag of token %s: %s", self.db_path, token_id, exc)


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
