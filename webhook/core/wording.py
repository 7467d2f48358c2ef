"""How messages count and list things: ``3 nodes``, ``a, b and 2 more``, ``it``/``them``,
and a quantity as a plain number. One wording for every layer that writes messages (the
checks, the audits, the command line), so that they say it alike."""

from __future__ import annotations

from collections.abc import Collection, Iterable

from webhook.policy.quantity import Quantity

# How many names a message lists before it says how many more there are.
NAMES_SHOWN = 10


def number(count: int, what: str) -> str:
    """A count and its noun, with an ``s`` for any count but one: ``1 node``, ``0 nodes``."""
    return f"{count} {what}{'' if count == 1 else 's'}"


def count(items: Collection[object], what: str) -> str:
    """How many ``items`` there are, as :func:`number` says it."""
    return number(len(items), what)


def names(items: Iterable[str], shown: int = NAMES_SHOWN) -> str:
    """The first ``shown`` names, comma-separated, then how many more there are:
    ``a, b and 3 more``."""
    listed = list(items)
    text = ", ".join(listed[:shown])
    return text if len(listed) <= shown else f"{text} and {len(listed) - shown} more"


def first(items: list[str], shown: int) -> list[str]:
    """The first ``shown`` items, then, for the rest, one that says how many: ``3 more``."""
    return items if len(items) <= shown else [*items[:shown], f"{len(items) - shown} more"]


def them(items: Collection[object]) -> str:
    """The pronoun for ``items``: ``it`` for one, ``them`` for more."""
    return "it" if len(items) == 1 else "them"


def plain_number(quantity: Quantity) -> int | float:
    """A quantity as a message or JSON shows it: a whole one as an int, others as a float."""
    return int(quantity) if quantity == int(quantity) else float(quantity)
