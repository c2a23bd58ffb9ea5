"""The validation kit: bounded numbers, the text parsers, and complaints that become the
project's located one-line errors."""

from __future__ import annotations

import math
import random

import pytest

from hulk import validate
from hulk.errors import ConfigError, InputError
from hulk.validate import Bound, Invalid, located

SECONDS = Bound(0.5, 60.0, "seconds")
PEERS = Bound(2, 10_000, "peers", integer=True)


@pytest.mark.parametrize("value, number", [
    (2, 2), (2.0, 2), ("17", 17), (" 10000 ", 10_000), ("+3", 3),
])
def test_a_whole_number_in_bounds(value, number):
    assert PEERS.check(value) == number and type(PEERS.check(value)) is int


@pytest.mark.parametrize("value, shown", [
    (1, "got 1"), (10_001, "got 10001"), (2.5, "got 2.5"), ("2.5", "got '2.5'"), (True, "got True"),
    (math.nan, "got nan"), (math.inf, "got inf"), ("many", "got 'many'"), (None, "got None"),
    ([3], "got [3]"), (10 ** 400, "got an integer of 401 digits"), (-(10 ** 400), "of 401 digits"),
])
def test_a_whole_number_out_of_bounds_or_of_another_kind(value, shown):
    with pytest.raises(Invalid) as bad:
        PEERS.check(value)
    assert bad.value.expected.startswith("expected a whole number of peers between 2 and 10,000")
    assert bad.value.expected.endswith(shown)


@pytest.mark.parametrize("value", [0.0, 0.49, 60.01, -1, 1e-300, 1e300, math.inf, -math.inf,
                                   math.nan, "nan", "inf", "1e999", 10 ** 400, False, "soon"])
def test_a_number_out_of_bounds_or_not_a_number(value):
    with pytest.raises(Invalid, match=r"^expected seconds between 0.5 and 60, got "):
        SECONDS.check(value)


def test_numbers_in_bounds_are_floats():
    assert SECONDS.check("1.5") == 1.5 and SECONDS.check(60) == 60.0
    assert type(SECONDS.check(60)) is float


def test_random_numbers_are_accepted_exactly_within_bounds():
    rng = random.Random(25)
    for _ in range(2000):
        value = rng.choice((-1, 1)) * 10 ** rng.uniform(-5, 6)
        inside = 0.5 <= value <= 60.0
        try:
            assert SECONDS.check(value) == value and inside
        except Invalid:
            assert not inside


def test_a_complaint_becomes_a_located_error_of_the_tree():
    with pytest.raises(ConfigError) as err:
        with located(ConfigError, path="agent.yaml", line=4, field="timeout_s"):
            SECONDS.check("soon")
    assert str(err.value) == ("agent.yaml:4: timeout_s: expected seconds between 0.5 and 60, "
                              "got 'soon'")
    assert err.value.exit_code == 2 and err.value.field == "timeout_s"


def test_a_complaint_that_knows_its_field_keeps_it():
    error = Invalid("expected x", field="jobs[2].params").error(path="jobs.yaml", field="jobs")
    assert type(error) is InputError and str(error) == "jobs.yaml: jobs[2].params: expected x"


@pytest.mark.parametrize("text, ok", [
    ("planner.example.org:50051", True), ("[::1]:50051", True), ("10.0.0.1:1", True),
    ("50051", False), (":50051", False), ("host:", False), ("host:0", False), ("host:65536", False),
    ("host:-1", False),
])
def test_host_port(text, ok):
    if ok:
        assert validate.host_port(text, "h:1") == text
    else:
        with pytest.raises(Invalid, match=r"expected HOST:PORT \(e.g. h:1\)"):
            validate.host_port(text, "h:1")


def test_a_listening_address_may_take_any_free_port():
    assert validate.host_port("0.0.0.0:0", "h:1", port_zero=True) == "0.0.0.0:0"


@pytest.mark.parametrize("value, expected", [
    (True, True), ("yes", True), (" ON ", True), ("1", True), (False, False), ("off", False),
    ("0", False), ("No", False),
])
def test_booleans(value, expected):
    assert validate.boolean(value) is expected


@pytest.mark.parametrize("parse, value, message", [
    (validate.boolean, "maybe", "expected true/false (1/0, yes/no, on/off), got 'maybe'"),
    (lambda v: validate.choice(v, ("DEBUG", "INFO")), "loud", "expected one of DEBUG, INFO"),
    (validate.name, "a/b", "expected 1-128 letters"),
    (validate.name, "x" * 129, "expected 1-128 letters"),
    (validate.ip_address, "not-an-ip", "expected an IP address"),
    (lambda v: validate.printable(v, 3, "a site name"), "long", "at most 3 characters, got 4"),
    (lambda v: validate.printable(v, 9, "a site name"), "a\u200bb", "of printable characters"),
    (validate.identifiers, "A,1B", "expected variable names, got '1B'"),
    (validate.single, {"a": 1}, "expected a single value"),
])
def test_text_parsers_say_what_was_expected(parse, value, message):
    with pytest.raises(Invalid, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse(value)


def test_text_parsers_return_the_value():
    assert validate.choice("info", ("DEBUG", "INFO")) == "INFO"
    assert validate.name(" node-1 ") == "node-1"
    assert validate.identifiers("A, B_2,") == ("A", "B_2")
    assert validate.ip_address("") == "" and validate.ip_address("::1") == "::1"


def test_a_check_that_raises_its_own_error_becomes_a_complaint():
    def refuse(text):
        raise ConfigError("bad key", field="HULK_PLACEMENT_KEY")

    with pytest.raises(Invalid, match="HULK_PLACEMENT_KEY: bad key"):
        validate.from_error(refuse)("ed25519:zz")
    assert validate.from_error(refuse)(" ") == ""
