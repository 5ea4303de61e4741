"""The vocabulary of structural roles: what the parser knows about each token.

Every token of a request, prompt or generated, gets exactly one :class:`Role`. Values are stable:
they are stored in tensors and in calibrated policy files, so a member is never renumbered or
reused; new roles are appended with new values. In JSON (policy files, HTTP responses) a role is
written as its lowercase name (``Role.ARG_KEY.label == "arg_key"``).

Generated tokens (output of constrained decoding)
-------------------------------------------------
``WHITESPACE``     whitespace between structural elements (JSON indentation, the space after a comma)
``BOUNDARY``       syntax the grammar spells out: braces, brackets, parentheses, commas, colons, ``=``,
                   the quotes around strings, keywords of an EBNF grammar (``SELECT``), and the fixed
                   envelope keys of a function-call object (``"name"``, ``"parameters"``)
``FREE_TEXT``      text the grammar leaves open and no other role describes
``FUNC_NAME``      the name of the called function
``ARG_KEY``        an argument (object) key that the schema does not list as required
``REQUIRED_KEY``   an argument key listed in the schema's ``required``
``VALUE_STRING``   the characters of a string value
``VALUE_NUMBER``   a number value
``VALUE_BOOL``     ``true`` / ``false`` (``True`` / ``False`` in Python call syntax)
``VALUE_NULL``     ``null`` (``None``)
``VALUE_ENUM``     a value constrained by an ``enum`` / ``const``, whatever its JSON type

Prompt tokens
-------------
``TEMPLATE``            chat-template tokens: special tokens and role headers (also a generated stop
                        token)
``SYSTEM_TEXT``         text of a system message outside tool schemas
``USER_QUESTION``       text of a user message
``SCHEMA_FUNC_NAME``    a function name inside a tool schema / function doc
``SCHEMA_PARAM_NAME``   a parameter name (a key of ``properties``)
``SCHEMA_REQUIRED``     an entry of a ``required`` list
``SCHEMA_TYPE``         a type (``"integer"``) or another type constraint (``format``, ``minimum``)
``SCHEMA_ENUM``         an entry of an ``enum`` list (or a ``const``)
``SCHEMA_DESCRIPTION``  description text of a function or parameter
``SCHEMA_EXAMPLE``      a value the schema shows as an example: inside description text, a quoted
                        literal (``'San Francisco, CA'``) or the clause after an example marker
                        (``e.g. San Francisco, CA``); the value of a ``default`` / ``example`` /
                        ``examples`` key. Refines ``SCHEMA_DESCRIPTION`` (see :data:`REFINES`)

JSON punctuation inside a prompt's tool schema is ``BOUNDARY``, its whitespace ``WHITESPACE``, and
schema keywords used as keys (``"properties"``, ``"type"``) are ``BOUNDARY`` too.

Tokens that span several roles
------------------------------
Roles are decided per character (per byte for generated tokens). A token whose characters have
several roles takes the one that comes first in :data:`PRIORITY`: names and keys first, then values,
then prose, then syntax, whitespace last. For example ``{"loc`` is ``ARG_KEY`` (or ``REQUIRED_KEY``),
``",`` is ``BOUNDARY``, ``"San`` is ``VALUE_STRING`` and `` "`` is ``BOUNDARY``. A token whose text is
empty (a special token with no characters) is ``TEMPLATE``.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import IntEnum


class Role(IntEnum):
    """Structural role of one token. Values are stable; see the module docstring."""

    WHITESPACE = 0
    BOUNDARY = 1
    FREE_TEXT = 2
    FUNC_NAME = 3
    ARG_KEY = 4
    REQUIRED_KEY = 5
    VALUE_STRING = 6
    VALUE_NUMBER = 7
    VALUE_BOOL = 8
    VALUE_NULL = 9
    VALUE_ENUM = 10
    TEMPLATE = 11
    SYSTEM_TEXT = 12
    USER_QUESTION = 13
    SCHEMA_FUNC_NAME = 14
    SCHEMA_PARAM_NAME = 15
    SCHEMA_REQUIRED = 16
    SCHEMA_TYPE = 17
    SCHEMA_ENUM = 18
    SCHEMA_DESCRIPTION = 19
    SCHEMA_EXAMPLE = 20

    @property
    def label(self) -> str:
        """Lowercase name used in JSON (``"arg_key"``)."""
        return self.name.lower()

    @classmethod
    def from_label(cls, label: str) -> Role:
        """Role for a lowercase (or uppercase) name.

        Raises
        ------
        ValueError
            If ``label`` names no role.
        """
        try:
            return cls[label.upper()]
        except KeyError:
            raise ValueError(f"unknown role name {label!r}; known: {', '.join(LABELS)}") from None


#: Number of roles (one past the largest value).
NUM_ROLES = len(Role)

#: Lowercase names indexed by role value.
LABELS: tuple[str, ...] = tuple(r.label for r in Role)

GENERATED_ROLES: frozenset[Role] = frozenset(
    {
        Role.WHITESPACE,
        Role.BOUNDARY,
        Role.FREE_TEXT,
        Role.FUNC_NAME,
        Role.ARG_KEY,
        Role.REQUIRED_KEY,
        Role.VALUE_STRING,
        Role.VALUE_NUMBER,
        Role.VALUE_BOOL,
        Role.VALUE_NULL,
        Role.VALUE_ENUM,
        Role.TEMPLATE,
    }
)

#: Which role a multi-role token takes: the earliest in this tuple (see the module docstring).
PRIORITY: tuple[Role, ...] = (
    Role.TEMPLATE,
    Role.FUNC_NAME,
    Role.SCHEMA_FUNC_NAME,
    Role.REQUIRED_KEY,
    Role.SCHEMA_REQUIRED,
    Role.ARG_KEY,
    Role.SCHEMA_PARAM_NAME,
    Role.VALUE_ENUM,
    Role.SCHEMA_ENUM,
    Role.VALUE_STRING,
    Role.VALUE_NUMBER,
    Role.VALUE_BOOL,
    Role.VALUE_NULL,
    Role.SCHEMA_TYPE,
    Role.SCHEMA_EXAMPLE,
    Role.SCHEMA_DESCRIPTION,
    Role.USER_QUESTION,
    Role.SYSTEM_TEXT,
    Role.FREE_TEXT,
    Role.BOUNDARY,
    Role.WHITESPACE,
)
assert sorted(PRIORITY) == list(Role), "PRIORITY must list every role once"

#: Roles split out of an older role: ``REFINES[new] == old``. A policy file written before ``new``
#: existed was calibrated with these tokens counted as ``old``, so ``new`` takes ``old``'s floor there.
REFINES: dict[Role, Role] = {Role.SCHEMA_EXAMPLE: Role.SCHEMA_DESCRIPTION}

#: ``RANK[role]``: larger wins. ``ROLE_OF_RANK[rank]`` inverts it.
RANK: tuple[int, ...] = tuple(len(PRIORITY) - 1 - PRIORITY.index(r) for r in Role)
ROLE_OF_RANK: tuple[int, ...] = tuple(int(r) for r in reversed(PRIORITY))


def combine(a: int, b: int) -> int:
    """The role of a token holding characters of roles ``a`` and ``b`` (see :data:`PRIORITY`)."""
    return a if RANK[a] >= RANK[b] else b


def combine_all(roles: Iterable[int], default: int = Role.TEMPLATE) -> int:
    """:func:`combine` over ``roles``; ``default`` if there are none (an empty token)."""
    best = -1
    for r in roles:
        if RANK[r] > best:
            best = RANK[r]
    return ROLE_OF_RANK[best] if best >= 0 else int(default)


def labels(roles: Iterable[int]) -> list[str]:
    """Lowercase names of ``roles`` (for JSON)."""
    return [LABELS[r] for r in roles]
