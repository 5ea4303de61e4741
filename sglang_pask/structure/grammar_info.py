"""What the text of a regex or EBNF grammar tells about the roles of the text it allows.

Regex: the regex's syntax tree as written (:mod:`.regex_syntax`) gives its literal runs:

- a regex whose literals contain ``(`` and ``=`` describes Python call syntax (BFCL's
  ``[func(a=1, b="x")]``); literal ``name(`` runs name the functions and ``key=`` runs their keyword
  arguments. An argument is required unless it sits under an optional construct (``?``, ``*``,
  ``{0,n}``, an empty alternative) that its function's name is not under. An argument whose value is
  a choice between literal strings (``unit=("c"|"f")``, but not ``(True|False)``) has an enum;
- every literal word is a keyword for the fallback lexer (:mod:`.lexer_roles`).

EBNF: the string literals of the grammar. Literals that end in ``name(`` name functions; literals
with ``(`` and ``=`` make the grammar Python call syntax (the BFCL harness's grammar), unless it has
role captures (``rule[capture="role"]``, :mod:`.captures`): then the author named the roles and the
lexer is used. Words in literals are keywords for the lexer.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from .function_docs import FunctionSpec
from .regex_syntax import GROUP, Node, Seq, literal_strings, parse
from .roles import Role

_CALL_RE = re.compile(r"([A-Za-z_][A-Za-z0-9_.]*)\(|([A-Za-z_][A-Za-z0-9_]*)=(?!=)")
_FUNC_LITERAL_RE = re.compile(r"([A-Za-z_][A-Za-z0-9_.]*)\($")
# EBNF lexemes that may hold a double quote: string literals, character classes, comments
_EBNF_LEXEME_RE = re.compile(r'"((?:[^"\\\n]|\\.)*)"|\[(?:[^\]\\]|\\.)*\]|#[^\n]*')
_CAPTURE_RE = re.compile(r'([A-Za-z_][A-Za-z0-9_.-]*)\s*\[\s*capture\s*(?:=\s*"([^"]*)")?\s*\]')
_WORD_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_PY_LITERALS = frozenset({"True", "False", "None"})


@dataclass(frozen=True)
class GrammarInfo:
    """What :func:`analyze_regex` / :func:`analyze_ebnf` found."""

    call_syntax: bool
    functions: tuple[FunctionSpec, ...]
    keywords: frozenset[str]


def _is_enum_value(node: Node) -> bool:
    """True if ``node`` is a group choosing between two or more literal strings other than True/False/None."""
    if not isinstance(node, tuple) or node[0] != GROUP:
        return False
    strings = literal_strings([node])
    return strings is not None and len(set(strings)) >= 2 and not set(strings) <= _PY_LITERALS


class _Collector:
    def __init__(self) -> None:
        self.order: list[str] = []
        self.params: dict[str, set[str]] = {}
        self.required: dict[str, set[str]] = {}
        self.enums: dict[str, set[str]] = {}
        self.current: tuple[str, int] | None = None
        self.words: set[str] = set()
        self.has_paren = False
        self.has_equals = False

    def run(self, text: str, opt: int, following: Node) -> None:
        self.words.update(_WORD_RE.findall(text))
        self.has_paren |= "(" in text
        self.has_equals |= "=" in text
        for m in _CALL_RE.finditer(text):
            if m.group(1):
                name = m.group(1)
                if name not in self.params:
                    self.order.append(name)
                    self.params[name], self.required[name], self.enums[name] = set(), set(), set()
                self.current = (name, opt)
            elif self.current is not None:
                name, fopt = self.current
                arg = m.group(2)
                self.params[name].add(arg)
                if opt == fopt:
                    self.required[name].add(arg)
                if m.end() == len(text) and _is_enum_value(following):
                    self.enums[name].add(arg)

    def walk(self, seq: Seq, opt: int) -> None:
        """Collect the literal runs of ``seq``; ``opt`` counts the optional constructs around it."""
        run: list[str] = []
        for node in seq:
            if isinstance(node, str):
                run.append(node)
                continue
            if run:
                self.run("".join(run), opt, node)
                run = []
            if node is None:
                continue
            if node[0] == GROUP:
                alts = node[1]
                inner = opt + (1 if len(alts) > 1 and not all(alts) else 0)
                for alt in alts:
                    self.walk(alt, inner)
            else:  # REPEAT: (REPEAT, least count, [node])
                self.walk(node[2], opt + (1 if node[1] == 0 else 0))
        if run:
            self.run("".join(run), opt, None)


def analyze_regex(regex: str) -> GrammarInfo:
    """Functions, their required / enum arguments, and literal words of ``regex``.

    Raises
    ------
    ValueError
        If the regex does not parse.
    """
    col = _Collector()
    col.walk(parse(regex), 0)
    functions = tuple(
        FunctionSpec(
            name,
            frozenset(col.params[name]),
            frozenset(col.required[name]),
            frozenset(col.enums[name]),
        )
        for name in col.order
    )
    call_syntax = bool(functions) or (col.has_paren and col.has_equals)
    return GrammarInfo(call_syntax, functions, frozenset(col.words))


def _ebnf_literals(ebnf: str) -> list[str]:
    out = []
    for m in _EBNF_LEXEME_RE.finditer(ebnf):
        body = m.group(1)
        if body is None:
            continue
        try:
            out.append(json.loads(f'"{body}"'))
        except json.JSONDecodeError:  # an escape JSON does not know (\\x41): keep it raw
            out.append(body)
    return out


def analyze_ebnf(ebnf: str) -> GrammarInfo:
    """Functions (names only) and literal words of an EBNF grammar."""
    literals = _ebnf_literals(ebnf)
    names: list[str] = []
    for lit in literals:
        m = _FUNC_LITERAL_RE.search(lit)
        if m and m.group(1) not in names:
            names.append(m.group(1))
    words = {w for lit in literals for w in _WORD_RE.findall(lit)}
    has_paren = any("(" in lit for lit in literals)
    has_equals = any("=" in lit for lit in literals)
    call_syntax = has_paren and has_equals
    return GrammarInfo(call_syntax, tuple(FunctionSpec(n) for n in names), frozenset(words))


def capture_roles(ebnf: str) -> dict[str, int]:
    """Roles named by ``rule[capture="role"]`` annotations (``rule[capture]`` uses the rule's name).

    Capture names that are not role names (:attr:`.roles.Role.label`) are ignored: they may serve
    another purpose.
    """
    out: dict[str, int] = {}
    for rule, name in _CAPTURE_RE.findall(ebnf):
        label = name or rule
        if label.upper() in Role.__members__:
            out[label] = int(Role.from_label(label))
    return out
