"""The quantity parser follows the API server's grammar and never raises."""

from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from webhook.policy.quantity import parse_quantity


@pytest.mark.parametrize(
    "value, expected",
    [
        (1, 1),
        ("1", 1),
        ("00012", 12),
        ("+1", 1),
        ("1.", 1),
        ("1000m", 1),
        ("2e0", 2),
        ("1Ki", 1024),
        ("1k", 1000),
        ("1e-3", Fraction(1, 1000)),
        (".5", Fraction(1, 2)),
        ("0.5", Fraction(1, 2)),
        (0.5, Fraction(1, 2)),
        ("500m", Fraction(1, 2)),
        ("1100m", Fraction(11, 10)),
        ("-1", -1),
        ("99999999999999999999", 99999999999999999999),
        (" 1 ", 1),
        (None, 0),
        ("1e-70", Fraction(1, 10**70)),
    ],
)
def test_accepted_quantities_are_exact(value: object, expected: object) -> None:
    parsed = parse_quantity(value)
    assert parsed == expected
    assert type(parsed) is type(expected), "whole numbers are ints, fractions Fractions"


@pytest.mark.parametrize(
    "value",
    [
        "NaN",
        "Infinity",
        "inf",
        "1 Gi",
        "0x10",
        "1Gb",
        "",
        "-",
        "1e",
        "1.2.3",
        "٣",
        True,
        [1],
        {"a": 1},
        float("nan"),
        float("inf"),
        "1e1001",
    ],
)
def test_what_the_api_server_rejects_is_none(value: object) -> None:
    assert parse_quantity(value) is None


@settings(derandomize=True, max_examples=500)
@given(st.one_of(st.text(max_size=80), st.integers(), st.floats(), st.booleans(), st.none()))
def test_never_raises(value: object) -> None:
    parsed = parse_quantity(value)
    assert parsed is None or parsed == parsed
