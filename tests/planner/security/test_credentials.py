"""Tokens, their storage and the token bucket (plain values; the SQLite file is real)."""

from __future__ import annotations

import sqlite3

import pytest

from hulk.errors import InputError, NotFoundError, UnauthenticatedError
from planner.security.credentials import CredentialStore, split_token
from planner.security.broker_accounts import BrokerAccounts
from planner.security.guard import RateLimit, RateLimiter, bearer_token


@pytest.fixture
def store(tmp_path):
    s = CredentialStore(tmp_path / "planner.sqlite")
    yield s
    s.close()


def test_issued_token_verifies_to_its_node_and_is_not_stored(store, tmp_path):
    issued = store.issue("tokyo-2")
    assert store.verify(issued.token) == "tokyo-2"
    token_id, secret = split_token(issued.token)
    raw = (tmp_path / "planner.sqlite").read_bytes()
    assert secret.encode() not in raw and issued.token.encode() not in raw
    row = sqlite3.connect(tmp_path / "planner.sqlite").execute(
        "SELECT salt, token_hash FROM hulk_credentials WHERE token_id=?", (token_id,)).fetchone()
    assert len(row[0]) == 16 and len(row[1]) == 32


def test_salts_differ_per_token(store, tmp_path):
    store.issue("a")
    store.issue("b")
    salts = sqlite3.connect(tmp_path / "planner.sqlite").execute(
        "SELECT salt FROM hulk_credentials").fetchall()
    assert len(set(salts)) == 2


@pytest.mark.parametrize("mangle", [
    lambda t: t[:-1] + ("A" if t[-1] != "A" else "B"),    # one character of the secret
    lambda t: t.replace("hulk1.", "hulk2."),
    lambda t: "",
    lambda t: t + "x",
    lambda t: t + "\n",
])
def test_altered_tokens_are_rejected(store, mangle):
    issued = store.issue("n1")
    with pytest.raises(UnauthenticatedError):
        store.verify(mangle(issued.token))


def test_revoke_ends_the_token_even_after_it_was_checked(store, tmp_path):
    issued = store.issue("n1")
    assert store.check_tag(issued.token) == "n1"       # settled by the keyed tag
    # Revoked by another connection (the operator's `hulk-planner revoke` process).
    other = CredentialStore(tmp_path / "planner.sqlite")
    assert other.revoke("n1") == 1
    other.close()
    with pytest.raises(UnauthenticatedError, match="revoked"):
        store.verify(issued.token)
    with pytest.raises(NotFoundError):
        store.revoke("n1")


def test_reissue_revokes_the_previous_token(store):
    first = store.issue("n1")
    second = store.issue("n1")
    assert store.verify(second.token) == "n1"
    with pytest.raises(UnauthenticatedError):
        store.verify(first.token)


@pytest.mark.parametrize("node_id", ["", "a b", "-lead", "n/1", "x" * 129, "n1\n"])
def test_bad_node_ids_are_refused(store, node_id):
    with pytest.raises(InputError, match="node id"):
        store.issue(node_id)


def test_token_bucket_allows_burst_then_rate():
    now = [0.0]
    limiter = RateLimiter(RateLimit(per_second=2.0, burst=3.0), clock=lambda: now[0])
    assert [limiter.allow("n1") for _ in range(4)] == [True, True, True, False]
    assert limiter.allow("n2")                  # another node has its own bucket
    now[0] += 0.5                               # one call's worth refilled
    assert limiter.allow("n1") and not limiter.allow("n1")
    assert limiter.rejected == {"n1": 2}


@pytest.mark.parametrize("metadata, expected", [
    ((), None),
    ((("authorization", "Bearer abc"),), "abc"),
    ((("Authorization", "bearer  abc "),), "abc"),
    ((("authorization", "Basic abc"),), ""),
    ((("authorization", b"Bearer abc"),), "abc"),
    ((("x-other", "Bearer abc"),), None),
])
def test_bearer_token_from_metadata(metadata, expected):
    assert bearer_token(metadata) == expected


def test_broker_accounts_render_a_per_node_acl(tmp_path):
    calls = []

    def runner(argv):
        import subprocess
        calls.append(list(argv))
        return subprocess.CompletedProcess(argv, 0, "", "")

    accounts = BrokerAccounts(tmp_path / "p.sqlite", tmp_path / "passwd", tmp_path / "acl",
                              runner=runner)
    planner = accounts.add("hulk-planner", role="planner")
    n1 = accounts.add("n1")
    assert calls[1] == ["mosquitto_passwd", "-b", str(tmp_path / "passwd"), "n1", n1.password]
    acl = (tmp_path / "acl").read_text()
    assert "user hulk-planner\ntopic readwrite hulk/v1/#" in acl
    assert "user n1\ntopic read hulk/v1/+/nodes/n1/placement" in acl
    assert planner.password != n1.password
    with pytest.raises(InputError, match="already exists as a planner"):
        accounts.add("hulk-planner", role="node")
    accounts.remove("n1")
    assert calls[-1][:2] == ["mosquitto_passwd", "-D"]
    assert "n1" not in (tmp_path / "acl").read_text()
    assert oct((tmp_path / "acl").stat().st_mode & 0o777) == "0o640"
