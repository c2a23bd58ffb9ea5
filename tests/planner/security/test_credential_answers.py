"""What a caller learns from a failed authentication: nothing about which token ids exist."""

from __future__ import annotations

import pytest

from hulk.errors import UnauthenticatedError
from planner.security.credentials import CredentialStore, split_token


@pytest.fixture
def store(tmp_path):
    credentials = CredentialStore(tmp_path / "planner.sqlite")
    yield credentials
    credentials.close()


def answer(store: CredentialStore, token: str) -> str:
    with pytest.raises(UnauthenticatedError) as caught:
        store.verify(token)
    return str(caught.value)


def test_unknown_id_and_wrong_secret_get_the_same_answer(store):
    token = store.issue("node-1").token
    token_id, secret = split_token(token)
    other_secret = ("A" if secret[0] != "A" else "B") + secret[1:]
    unknown_id = "0" * 16 if token_id != "0" * 16 else "1" * 16
    wrong_secret = answer(store, f"hulk1.{token_id}.{other_secret}")
    unknown = answer(store, f"hulk1.{unknown_id}.{secret}")
    assert wrong_secret == unknown
    assert "node-1" not in wrong_secret and token_id not in wrong_secret


def test_a_revoked_token_is_named_only_to_its_holder(store):
    token = store.issue("node-1").token
    assert store.verify(token) == "node-1"          # settled by its tag
    store.revoke("node-1")
    assert "revoked" in answer(store, token)        # the holder learns why
    token_id, secret = split_token(token)
    forged = ("A" if secret[0] != "A" else "B") + secret[1:]
    assert "revoked" not in answer(store, f"hulk1.{token_id}.{forged}")
