"""What authentication costs the planner when the caller is hostile: scrypt runs only for a row
without a tag under the current key, never for an unknown id or a wrong secret, never for an
enrolled node after a restart; the scrypt that remains is limited per token id and per address.

scrypt is counted through the store's ``secret_hash`` seam."""

from __future__ import annotations

import asyncio
import random
import sqlite3

import grpc
import pytest

from hulk.errors import RateLimitedError, UnauthenticatedError
from planner.security.credentials import CredentialStore, auth_key_path, hash_secret, split_token
from planner.security.guard import NodeGuard
from planner.service.ingest import ServerLimits
from tests.helpers.threaded_planner import ThreadedPlanner, bearer, channel, register_request

from hulk.v1 import hulk_pb2_grpc

HEX = "0123456789abcdef"
SECRET_CHARS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-"


class CountingHash:
    """hash_secret, counted."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, secret: str, salt: bytes) -> bytes:
        self.calls += 1
        return hash_secret(secret, salt)


def random_token(rng: random.Random) -> str:
    return (f"hulk1.{''.join(rng.choice(HEX) for _ in range(16))}."
            f"{''.join(rng.choice(SECRET_CHARS) for _ in range(43))}")


def other_secret(token: str) -> str:
    token_id, secret = split_token(token)
    return f"hulk1.{token_id}.{('A' if secret[0] != 'A' else 'B') + secret[1:]}"


def refused(store: CredentialStore, token: str) -> str:
    with pytest.raises(UnauthenticatedError) as caught:
        store.verify(token)
    return str(caught.value)


def untag(db, node_id: str) -> None:
    """Make ``node_id``'s row look like one from a store made before tags."""
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE hulk_credentials SET tag=NULL, tag_key=NULL WHERE node_id=?",
                     (node_id,))


@pytest.fixture
def db(tmp_path):
    return tmp_path / "planner.sqlite"


def test_unknown_ids_and_wrong_secrets_cost_no_scrypt(db):
    scrypt = CountingHash()
    store = CredentialStore(db, secret_hash=scrypt)
    token = store.issue("n1").token
    scrypt.calls = 0
    rng = random.Random(28)
    answers = {refused(store, random_token(rng)) for _ in range(200)}
    answers |= {refused(store, other_secret(token)) for _ in range(20)}
    assert scrypt.calls == 0
    assert len(answers) == 1 and "n1" not in answers.pop()
    assert store.verify(token) == "n1" and scrypt.calls == 0
    store.close()


def test_an_enrolled_token_verifies_after_a_restart_without_scrypt(db):
    before = CredentialStore(db)
    token = before.issue("n1").token
    before.close()
    scrypt = CountingHash()
    after = CredentialStore(db, secret_hash=scrypt)          # a new process on the same files
    assert after.verify(token) == "n1"
    assert scrypt.calls == 0
    assert oct(auth_key_path(db).stat().st_mode & 0o777) == "0o600"
    after.close()


def test_a_key_made_by_enroll_while_serve_runs_is_found(db):
    scrypt = CountingHash()
    serving = CredentialStore(db, secret_hash=scrypt)         # serve on a store with no key yet
    assert not auth_key_path(db).exists()
    enrolling = CredentialStore(db)
    token = enrolling.issue("n1").token
    enrolling.close()
    assert serving.verify(token) == "n1" and scrypt.calls == 0
    serving.close()


def test_a_store_made_before_tags_is_checked_by_scrypt_once(db):
    with sqlite3.connect(db) as conn:          # the credential table as it was before tags
        conn.execute("CREATE TABLE hulk_credentials (token_id TEXT PRIMARY KEY, node_id TEXT NOT "
                     "NULL, salt BLOB NOT NULL, token_hash BLOB NOT NULL, created_ms INTEGER NOT "
                     "NULL, revoked_ms INTEGER)")
        conn.execute("INSERT INTO hulk_credentials VALUES (?,?,?,?,?,NULL)",
                     ("0123456789abcdef", "old", b"s" * 16, hash_secret("S" * 43, b"s" * 16), 1))
    token = f"hulk1.0123456789abcdef.{'S' * 43}"
    scrypt = CountingHash()
    store = CredentialStore(db, secret_hash=scrypt)
    assert store.check_tag(token) is None                     # only scrypt can tell
    refused(store, other_secret(token))
    assert scrypt.calls == 1                                  # a wrong secret: no tag written
    assert store.verify(token) == "old" and scrypt.calls == 2
    store.close()
    again = CredentialStore(db, secret_hash=scrypt)
    assert again.verify(token) == "old" and scrypt.calls == 2
    refused(again, other_secret(token))
    assert scrypt.calls == 2
    again.close()


def test_a_lost_key_file_costs_each_token_one_scrypt(db):
    first = CredentialStore(db)
    token = first.issue("n1").token
    first.close()
    auth_key_path(db).unlink()
    scrypt = CountingHash()
    second = CredentialStore(db, secret_hash=scrypt)
    assert second.verify(token) == "n1" and scrypt.calls == 1
    assert second.verify(token) == "n1" and scrypt.calls == 1
    second.close()


def test_a_revoked_token_is_refused_by_its_tag(db):
    scrypt = CountingHash()
    store = CredentialStore(db, secret_hash=scrypt)
    token = store.issue("n1").token
    store.revoke("n1")
    assert "revoked" in refused(store, token)
    assert "revoked" not in refused(store, other_secret(token))
    assert scrypt.calls == 1                                   # the issue's own hash
    store.close()


def _authenticate(guard: NodeGuard, token: str, peer: str):
    """The node id, or the HulkError class the guard refuses the call with."""
    try:
        return asyncio.run(guard._authenticate(bearer(token), "/hulk.v1.Planner/Register", peer))
    except (UnauthenticatedError, RateLimitedError) as exc:
        return type(exc)


def test_failures_limit_scrypt_per_address_not_the_tag_check(db):
    scrypt = CountingHash()
    store = CredentialStore(db, secret_hash=scrypt)
    legacy = [store.issue(f"old-{i}").token for i in range(12)]
    for i in range(12):
        untag(db, f"old-{i}")
    tagged = store.issue("n1").token
    now = [0.0]
    guard = NodeGuard(store, clock=lambda: now[0])
    scrypt.calls = 0
    hostile, other = "ipv4:192.0.2.1", "ipv4:192.0.2.2"
    # A different real (untagged) token id each time: the per-id allowance never runs out.
    answers = [_authenticate(guard, other_secret(t), hostile) for t in legacy[:10]]
    assert answers[:5] == [UnauthenticatedError] * 5
    assert answers[5:] == [RateLimitedError] * 5
    assert scrypt.calls == 5
    # Another address's untagged node still gets its scrypt check; the hostile address's
    # tagged node (agents behind one NAT) is settled by the tag.
    assert _authenticate(guard, legacy[10], other) == "old-10"
    assert _authenticate(guard, tagged, hostile) == "n1"
    assert _authenticate(guard, legacy[11], hostile) is RateLimitedError
    assert scrypt.calls == 6
    now[0] += 60.0                                             # the allowance refills
    assert _authenticate(guard, legacy[11], hostile) == "old-11"
    store.close()


def test_a_spent_token_id_allowance_does_not_lock_out_its_holder(db):
    scrypt = CountingHash()
    store = CredentialStore(db, secret_hash=scrypt)
    token = store.issue("n1").token
    guard = NodeGuard(store, clock=lambda: 0.0)
    for k in range(20):                                        # the id is known, the secret not
        assert _authenticate(guard, other_secret(token), f"ipv4:198.51.100.{k}") \
            is UnauthenticatedError
    assert guard.auth_failures.exhausted(split_token(token)[0])
    assert _authenticate(guard, token, "ipv4:198.51.100.1") == "n1"
    assert scrypt.calls == 1
    store.close()


@pytest.mark.slow
def test_a_flood_of_bad_tokens_leaves_an_enrolled_nodes_first_call_after_a_restart_alone(
        tmp_path, pki):
    db = tmp_path / "planner.sqlite"
    enrolling = CredentialStore(db)                    # `hulk-planner enroll`, before the restart
    token = enrolling.issue("n1").token
    enrolling.close()
    scrypt = CountingHash()
    # 600 calls at once on one connection: the connection's stream cap lifted, so the guard
    # refuses every one (the cap itself: tests/planner/security/test_call_slots.py).
    planner = ThreadedPlanner(db, pki, secret_hash=scrypt,
                              limits=ServerLimits(max_streams_per_connection=1000))
    rng = random.Random(3)
    try:
        with channel(planner.target, pki) as hostile, channel(planner.target, pki) as agent:
            stub = hulk_pb2_grpc.PlannerStub(hostile)
            flood = [stub.Register.future(register_request("x"), timeout=60,
                                          metadata=bearer(random_token(rng)))
                     for _ in range(600)]
            reply = hulk_pb2_grpc.PlannerStub(agent).Register(
                register_request("n1"), metadata=bearer(token), timeout=10)
            codes = [f.exception().code() for f in flood]
        assert reply.fleet == "test" and "n1" in planner.node_ids()
        assert set(codes) == {grpc.StatusCode.UNAUTHENTICATED}
        assert scrypt.calls == 0
        assert planner.guard.counts["unauthenticated"] == 600
    finally:
        planner.stop()
