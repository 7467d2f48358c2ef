"""The MIG profiles a CEL device selector names, for the forms simple enough to read without
evaluating CEL.

Read: ``device.attributes["gpu.nvidia.com"].profile == "1g.10gb"`` (either quote style, either
operand order), ``device.attributes["gpu.nvidia.com"].profile in ["1g.10gb", "2g.20gb"]``, each
in any parentheses, whitespace, newlines and ``//`` comments, and a top-level ``&&``
conjunction holding such terms: its other conjuncts only narrow the devices further, so they
are ignored. Several profile terms intersect.

Left alone (None): ``||``, ``!``, ``!=``, the conditional operator, functions and macros
(``matches``, ``startsWith``, ``has``), escapes and raw or triple-quoted strings in a term,
the ``["profile"]`` index form, and any other mention of ``profile`` in a conjunct. The
answer is then unknown, never guessed. A selector that does not restrict the profile is None
as well.
"""

from __future__ import annotations

import re
from typing import NamedTuple

from webhook.policy.nvidia_dra import GPU_DRIVER

_TOKEN = re.compile(
    r"""
    (?P<space>\s+|//[^\n]*)
    | (?P<string>(?P<prefix>[rRbB]{0,2})(?P<quote>'''|\"\"\"|'|"))
    | (?P<number>0[xX][0-9a-fA-F]+[uU]?|[0-9]+(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?[uU]?
        |\.[0-9]+(?:[eE][+-]?[0-9]+)?)
    | (?P<ident>[A-Za-z_][A-Za-z0-9_]*)
    | (?P<operator>&&|\|\||==|!=|<=|>=|[<>!?:.,()\[\]{}+\-*/%])
    """,
    re.VERBOSE,
)
# The API server's limit on a selector's expression (resource.k8s.io's
# CELSelectorExpressionMaxLength); a custom resource's embedded claim is not held to it.
MAX_EXPRESSION_LENGTH = 10 * 1024
# Brackets nested deeper than this are read as too complex: reading is then bounded (the
# conjuncts are split recursively, and stripping parentheses scans the tokens per level).
MAX_NESTING = 32
_OPENING = {"(": ")", "[": "]", "{": "}"}
_CLOSING = frozenset(_OPENING.values())


class _Token(NamedTuple):
    kind: str  # "string" (value None when it is not a plain literal), "ident", "operator", ...
    text: str
    value: str | None = None


def profiles_named(expression: str) -> tuple[str, ...] | None:
    """The profiles ``expression`` restricts ``device.attributes["gpu.nvidia.com"].profile``
    to, in the order written, or None when it does not restrict it in a form read here."""
    if "profile" not in expression or len(expression) > MAX_EXPRESSION_LENGTH:
        return None  # most selectors name no profile: answered without lexing them
    tokens = _tokens(expression)
    if tokens is None or not _well_nested(tokens):
        return None
    allowed: tuple[str, ...] | None = None
    for conjunct in _conjuncts(tokens):
        named = _profile_term(conjunct)
        if named is None:
            if any(t.text == "profile" or t.value == "profile" for t in conjunct):
                return None
            continue
        allowed = named if allowed is None else tuple(p for p in allowed if p in named)
    return allowed


def _tokens(expression: str) -> list[_Token] | None:
    """CEL's tokens, without whitespace and comments; None for text CEL does not lex."""
    tokens: list[_Token] = []
    position = 0
    while position < len(expression):
        match = _TOKEN.match(expression, position)
        if match is None:
            return None
        position = match.end()
        if match["space"]:
            continue
        if match["string"]:
            end = _string_end(expression, position, match["quote"], "r" in match["prefix"].lower())
            if end is None:
                return None
            text = expression[match.start() : end]
            body = expression[position : end - len(match["quote"])]
            plain = not match["prefix"] and len(match["quote"]) == 1 and "\\" not in body
            kind = "bytes" if "b" in match["prefix"].lower() else "string"
            tokens.append(_Token(kind, text, body if plain else None))
            position = end
            continue
        kind = next(k for k in ("number", "ident", "operator") if match[k])
        tokens.append(_Token(kind, match[kind]))
    return tokens


def _string_end(expression: str, start: int, quote: str, raw: bool) -> int | None:
    """Where the literal opened by ``quote`` just before ``start`` ends (past its quote)."""
    position = start
    while position < len(expression):
        if expression.startswith(quote, position):
            return position + len(quote)
        if expression[position] == "\n" and len(quote) == 1:
            return None
        position += 2 if expression[position] == "\\" and not raw else 1
    return None


def _well_nested(tokens: list[_Token]) -> bool:
    """Brackets that close in order, at most ``MAX_NESTING`` deep."""
    stack: list[str] = []
    for token in tokens:
        if token.text in _OPENING:
            stack.append(_OPENING[token.text])
            if len(stack) > MAX_NESTING:
                return False
        elif token.text in _CLOSING and (not stack or stack.pop() != token.text):
            return False
    return not stack


def _unwrapped(tokens: list[_Token]) -> list[_Token]:
    """``tokens`` without the parentheses that enclose all of them (not ``(a) && (b)``'s)."""
    while tokens and tokens[0].text == "(" and _closing(tokens) == len(tokens) - 1:
        tokens = tokens[1:-1]
    return tokens


def _closing(tokens: list[_Token]) -> int:
    """The index of the bracket that closes the first token's."""
    depth = 0
    for index, token in enumerate(tokens):
        depth += (token.text in _OPENING) - (token.text in _CLOSING)
        if depth == 0:
            return index
    return len(tokens)


def _conjuncts(tokens: list[_Token]) -> list[list[_Token]]:
    """The operands of a top-level ``&&`` chain, nested chains flattened; the whole
    expression as one when ``||`` or the conditional operator binds it more loosely."""
    parts: list[list[_Token]] = [[]]
    depth = 0
    for token in _unwrapped(tokens):
        if depth == 0 and token.text in ("||", "?", ":"):
            return [tokens]
        depth += (token.text in _OPENING) - (token.text in _CLOSING)
        if depth == 0 and token.text == "&&":
            parts.append([])
        else:
            parts[-1].append(token)
    if len(parts) == 1:
        return parts
    return [conjunct for part in parts for conjunct in _conjuncts(part)]


def _profile_term(tokens: list[_Token]) -> tuple[str, ...] | None:
    """The profiles of ``<profile> == "p"``, ``"p" == <profile>`` or ``<profile> in [...]``."""
    tokens = _unwrapped(tokens)
    if len(tokens) == 10 and _is_profile(tokens[:8]) and tokens[8].text == "==":
        return _literals(tokens[9:])
    if len(tokens) == 10 and tokens[1].text == "==" and _is_profile(tokens[2:]):
        return _literals(tokens[:1])
    if (
        len(tokens) >= 11
        and _is_profile(tokens[:8])
        and [t.text for t in tokens[8:10]] == ["in", "["]
        and tokens[-1].text == "]"
    ):
        items = tokens[10:-1]
        if items and items[-1].text == ",":
            items = items[:-1]  # CEL allows a trailing comma
        if any(t.text != "," for t in items[1::2]) or len(items) % 2 == 0 and items:
            return None
        return _literals(items[::2])
    return None


def _is_profile(tokens: list[_Token]) -> bool:
    """``device.attributes["gpu.nvidia.com"].profile``, as eight tokens."""
    return (
        [t.text for t in tokens[:4]] == ["device", ".", "attributes", "["]
        and tokens[4].kind == "string"
        and tokens[4].value == GPU_DRIVER
        and [t.text for t in tokens[5:]] == ["]", ".", "profile"]
    )


def _literals(tokens: list[_Token]) -> tuple[str, ...] | None:
    """The values of plain string literals, each once; None if any token is something else."""
    values = [t.value for t in tokens if t.kind == "string" and t.value is not None]
    if len(values) != len(tokens):
        return None
    return tuple(dict.fromkeys(values))
