"""Kubernetes resource quantities, parsed to the API server's grammar.

The grammar (k8s.io/apimachinery/pkg/api/resource) is::

    <quantity>        ::= <signedNumber><suffix>
    <suffix>          ::= <binarySI> | <decimalExponent> | <decimalSI>
    <binarySI>        ::= Ki | Mi | Gi | Ti | Pi | Ei
    <decimalSI>       ::= m | "" | k | M | G | T | P | E
    <decimalExponent> ::= "e" <signedNumber> | "E" <signedNumber>

We parse to an exact ``Fraction`` so that ``1000m`` is exactly one and ``1100m`` is not.
Anything outside the grammar (``NaN``, ``Infinity``, ``1 Gi``, ``0x10``, booleans, lists) is
``None``: callers report it, they never see an exception. The kubernetes client's own
``parse_quantity`` accepts strings the API server rejects and loads the whole generated client.
"""

from __future__ import annotations

import re
from fractions import Fraction

_QUANTITY = re.compile(
    r"(?P<sign>[+-]?)(?P<number>[0-9]+(?:\.[0-9]*)?|\.[0-9]+)"
    r"(?:(?P<binary>Ki|Mi|Gi|Ti|Pi|Ei)|[eE](?P<exponent>[+-]?[0-9]+)|(?P<decimal>[mkMGTPE]?))\Z"
)
_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {"m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
Quantity = Fraction | int

# Bounds the Fraction arithmetic (10**1000 is still cheap); no real quantity comes near it.
_MAX_EXPONENT = 1000


def parse_quantity(value: object) -> Quantity | None:
    """Return the exact value of a quantity, or None when the API server would reject it.

    Whole numbers come back as ``int`` (the common case, and much cheaper than a Fraction,
    which ``int`` compares and adds with exactly); everything else as a ``Fraction``.
    """
    if value is None:
        return 0  # the API server reads a JSON null quantity as zero
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        value = value.strip()  # as the API server's Quantity.UnmarshalJSON does
    if isinstance(value, str) and value.isascii() and value.isdigit() and len(value) <= 19:
        return int(value)
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            return None
        return _simplest(Fraction(repr(value)) if "e" not in repr(value) else Fraction(value))
    if not isinstance(value, str) or len(value) > 64:
        return None
    match = _QUANTITY.match(value)
    if match is None:
        return None
    number = Fraction(match["number"])
    if match["sign"] == "-":
        number = -number
    if match["binary"]:
        return _simplest(number * _BINARY[match["binary"]])
    exponent = (
        int(match["exponent"]) if match["exponent"] is not None else _DECIMAL[match["decimal"]]
    )
    if abs(exponent) > _MAX_EXPONENT:
        return None
    return _simplest(number * Fraction(10) ** exponent)


def _simplest(value: Fraction) -> Quantity:
    return value.numerator if value.denominator == 1 else value
