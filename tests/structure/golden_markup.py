"""Golden markup for the structure tests.

Golden cases are written by hand as markup: ``⟦X|text⟧`` gives every character of ``text`` the role
coded ``X`` (see ``CODES``); unmarked characters are ``WHITESPACE`` if blank, else ``BOUNDARY``.
The expected role of a token follows from its characters by the documented priority rule, so the
goldens hold for any tokenization; the tests compare them token by token.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from sglang_pask.structure.roles import Role, combine_all

CODES = {
    "W": Role.WHITESPACE,
    "B": Role.BOUNDARY,
    "T": Role.FREE_TEXT,
    "F": Role.FUNC_NAME,
    "A": Role.ARG_KEY,
    "R": Role.REQUIRED_KEY,
    "S": Role.VALUE_STRING,
    "N": Role.VALUE_NUMBER,
    "L": Role.VALUE_BOOL,
    "Z": Role.VALUE_NULL,
    "E": Role.VALUE_ENUM,
    "P": Role.TEMPLATE,
    "Y": Role.SYSTEM_TEXT,
    "U": Role.USER_QUESTION,
    "f": Role.SCHEMA_FUNC_NAME,
    "p": Role.SCHEMA_PARAM_NAME,
    "r": Role.SCHEMA_REQUIRED,
    "t": Role.SCHEMA_TYPE,
    "e": Role.SCHEMA_ENUM,
    "d": Role.SCHEMA_DESCRIPTION,
    "x": Role.SCHEMA_EXAMPLE,
}
_MARK_RE = re.compile(r"⟦(\w)\|(.*?)⟧", re.DOTALL)


def parse_markup(src: str) -> tuple[str, list[int]]:
    """Text and per-character roles of a golden written in markup."""
    text: list[str] = []
    roles: list[int] = []
    pos = 0
    for m in _MARK_RE.finditer(src):
        for c in src[pos : m.start()]:
            text.append(c)
            roles.append(Role.WHITESPACE if c.isspace() else Role.BOUNDARY)
        body = m.group(2)
        text.append(body)
        roles.extend([CODES[m.group(1)]] * len(body))
        pos = m.end()
    for c in src[pos:]:
        text.append(c)
        roles.append(Role.WHITESPACE if c.isspace() else Role.BOUNDARY)
    return "".join(text), roles


def expected_token_roles(char_roles: Sequence[int], offsets: Sequence[tuple[int, int]]) -> list[int]:
    """Token roles implied by character roles (the priority rule)."""
    return [combine_all(char_roles[s:e]) for s, e in offsets]
