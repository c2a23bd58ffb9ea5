"""Hostile MQTT messages: the placement and plan-summary parsers answer one line, never raise else."""

from __future__ import annotations

import pytest

from hulk.errors import InputError
from hulk.wire.placement import (MAX_PLACEMENT_BYTES, MAX_SUMMARY_BYTES, parse_placement,
                                 parse_summary)


def one_line_error(parse, payload: bytes) -> str:
    with pytest.raises(InputError) as caught:
        parse(payload, source="hulk/v1/f/nodes/n/placement")
    assert "\n" not in str(caught.value)
    return str(caught.value)


@pytest.mark.parametrize("parse", [parse_placement, parse_summary])
@pytest.mark.parametrize("payload, expected", [
    (b"[" * 50_000 + b"]" * 50_000, "nested too deeply"),
    (b'{"format": ' + b"9" * 5000 + b"}", "digits"),
    (b'{"format": NaN}', "NaN"),
    (b"\xff\xfe{}", "codec"),
])
def test_hostile_messages_are_one_line_input_errors(parse, payload, expected):
    assert expected in one_line_error(parse, payload)


@pytest.mark.parametrize("parse, limit", [(parse_placement, MAX_PLACEMENT_BYTES),
                                          (parse_summary, MAX_SUMMARY_BYTES)])
def test_messages_over_their_bound_are_refused_before_parsing(parse, limit):
    assert f"at most {limit} bytes" in one_line_error(parse, b" " * (limit + 1))
