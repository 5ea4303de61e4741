"""Per-request role tracks of generated tokens, derived from the request's grammar.

:class:`RoleGrammar` is compiled once per (grammar kind, key string, vocabulary), like xgrammar's
compiled grammar, and shared by every request with that grammar. :class:`RoleTracker` is one
request's track: ``accept`` per generated token (or ``extend`` with several), ``rollback``, ``copy``.

How a role is found
-------------------
A role machine walks a token's bytes; which one depends on the grammar (:meth:`RoleGrammar.compile`):

- ``json``: :mod:`.json_roles`, following the schema (OpenAI tool-call envelopes included);
- ``structural_tag``: :mod:`.tag_roles`, free text and the model's tool-call markup outside tags,
  :mod:`.json_roles` with each tag's schema inside;
- ``regex`` / ``ebnf`` whose literals spell Python call syntax (BFCL): :mod:`.call_roles`; its
  syntax layer is memoised across all such grammars, so a new grammar starts warm;
- ``ebnf`` with ``rule[capture="role"]`` annotations: :mod:`.lexer_roles` plus the captures
  (:mod:`.captures`, read from the matcher when :attr:`RoleTracker.roles` is read);
- other ``regex`` / ``ebnf``, and ``text``: :mod:`.lexer_roles`.

A machine state is a small hashable tuple, interned to an int. The result of (state, token) is
memoised in the grammar under ``state id << 24 | token id``, and the result names the next state by
that key's prefix (``state id << 24``), so after warm-up a token costs one dict lookup, one ``|``
and two list appends in :meth:`RoleTracker.extend`; a miss walks the token's bytes (O(token
length)). Memoising is exact: the machines are deterministic functions of (state, bytes).

What does not depend on the generated text is built before the first token, as xgrammar builds its
tables: per tokenizer, :attr:`.vocab.TokenVocab.walk_bytes`; per grammar, in :meth:`RoleGrammar.compile`,
a JSON schema's navigation tables (:mod:`.json_schema`), a call grammar's name and argument prefix
sets, a lexer's keyword prefixes. The memo itself depends on the text, so the first request of a
grammar walks each of its (state, token) pairs once; a call grammar's spec-free syntax layer is
memoised per process, so its walks are shared across grammars.

Token boundaries
----------------
A token's role is the highest-priority role among its bytes (:data:`.roles.PRIORITY`). Roles that
are certain only at the end of a span (a JSON key's required-ness, a keyword) are given tentatively
and revised when the span ends: a revision changes only the tokens of that span, which are the last
few tokens (see :mod:`.scan`). ``revised_from`` tells a mirror of the track what to re-read.

Rollback and copies
-------------------
The track keeps the machine state after every token, and an undo log of revisions, so
``rollback(k)`` restores exactly the track it had ``k`` tokens ago. ``copy()`` forks the track (state
and history); to start a new request from a cached grammar use :meth:`RoleGrammar.tracker`.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping, Sequence
from typing import Any, Protocol

from .call_roles import CallRoleMachine
from .function_docs import FunctionSpec, function_specs
from .grammar_info import GrammarInfo, analyze_ebnf, analyze_regex, capture_roles
from .json_roles import JsonRoleMachine
from .json_schema import Schema
from .lexer_roles import LexerRoleMachine
from .roles import Role, combine
from .scan import Revision
from .tag_roles import StructuralTagRoleMachine
from .vocab import TokenVocab

#: Grammar kinds, named as SGLang's grammar backends dispatch them (``text``: no grammar).
KINDS = ("json", "regex", "ebnf", "structural_tag", "text")

_SHIFT = 24  # memo key: state << 24 | token id (vocabularies are far below 2**24)
_MEMO_LIMIT = 1 << 19  # entries per grammar before the memo is cleared
_TEMPLATE = int(Role.TEMPLATE)

#: (next state's key prefix ``state id << _SHIFT``, role, revision) for one (state, token) pair
Transition = tuple[int, int, Revision | None]


class RoleMachine(Protocol):
    """A deterministic byte-level role machine over hashable states."""

    initial: Hashable

    def step(self, state: Any, data: bytes) -> tuple[Any, int, Revision | None]: ...


def _merge_specs(found: Sequence[FunctionSpec], given: Sequence[FunctionSpec]) -> tuple[FunctionSpec, ...]:
    by_name = {f.name: f for f in found}
    by_name.update({f.name: f for f in given})
    return tuple(by_name.values())


class RoleGrammar:
    """Role machine of one grammar over one vocabulary, with the memo shared by its trackers.

    Use :meth:`compile`; then :meth:`tracker` per request.
    """

    def __init__(self, machine: RoleMachine, vocab: TokenVocab, captures: Mapping[str, int] | None = None) -> None:
        if len(vocab) >= 1 << _SHIFT:
            raise ValueError(f"vocabulary of {len(vocab)} tokens is too large (limit {1 << _SHIFT})")
        self.machine = machine
        self.vocab = vocab
        self._walk = vocab.walk_bytes
        self.captures: dict[str, int] = dict(captures or {})
        self.memo: dict[int, Transition] = {}
        self._state_ids: dict[Hashable, int] = {}
        self._states: list[Hashable] = []
        self.initial_state = self._intern(machine.initial)

    @classmethod
    def compile(
        cls,
        kind: str,
        key_string: str,
        vocab: TokenVocab,
        *,
        functions: Iterable[Any] | None = None,
    ) -> RoleGrammar:
        """Role grammar for a request's grammar.

        Parameters
        ----------
        kind
            ``"json"`` (``key_string`` is a JSON schema, or ``"$$ANY$$"``), ``"regex"``, ``"ebnf"``,
            ``"structural_tag"`` (``key_string`` is SGLang's structural tag JSON, legacy or with a
            ``format``) or ``"text"`` (no grammar; ``key_string`` is ignored).
        key_string
            The grammar as SGLang receives it.
        vocab
            Token bytes of the model's tokenizer.
        functions
            Optional function docs (OpenAI ``tools`` or BFCL docs) for a regex or EBNF grammar in
            Python call syntax: they say which arguments are required or enums where the grammar
            does not (:func:`.prompt.find_function_docs` reads them from the prompt).

        Raises
        ------
        ValueError
            For an unknown kind, a malformed schema, regex or structural tag, a structural tag format
            that role tagging does not support, or malformed function docs.
        """
        if kind == "json":
            return cls(JsonRoleMachine(Schema.from_json(key_string)), vocab)
        if kind == "structural_tag":
            return cls(StructuralTagRoleMachine.from_json(key_string), vocab)
        if kind == "regex":
            return cls(cls._text_machine(analyze_regex(key_string), functions), vocab)
        if kind == "ebnf":
            info = analyze_ebnf(key_string)
            captures = capture_roles(key_string)
            if captures:  # the author named the roles: lexer plus captures
                return cls(LexerRoleMachine(info.keywords), vocab, captures)
            return cls(cls._text_machine(info, functions), vocab)
        if kind == "text":
            return cls(LexerRoleMachine(), vocab)
        raise ValueError(f"unknown grammar kind {kind!r}; expected one of {', '.join(KINDS)}")

    @staticmethod
    def _text_machine(info: GrammarInfo, functions: Iterable[Any] | None) -> RoleMachine:
        if info.call_syntax:
            return CallRoleMachine(_merge_specs(info.functions, function_specs(functions or ())))
        return LexerRoleMachine(info.keywords)

    def tracker(self, matcher: Any = None) -> RoleTracker:
        """A new, empty track for one request.

        Parameters
        ----------
        matcher
            The request's ``xgrammar.GrammarMatcher``. Needed only for an EBNF grammar with role
            captures, whose roles come from ``matcher.get_captures()``.

        Raises
        ------
        ValueError
            If the grammar has role captures and no matcher is given.
        """
        if not self.captures:
            return RoleTracker(self)
        if matcher is None:
            raise ValueError("this EBNF grammar has role captures: pass its GrammarMatcher to tracker()")
        from .captures import CaptureRoleTracker

        return CaptureRoleTracker(self, matcher)

    def _intern(self, state: Hashable) -> int:
        states = self._states
        sid = self._state_ids.setdefault(state, len(states))  # one hash of the state, not two
        if sid == len(states):
            states.append(state)
        return sid

    def transition(self, state_key: int, token_id: int) -> Transition:
        """Walk ``token_id`` from the state whose key prefix is ``state_key`` (a memo miss) and
        remember the result.

        Raises
        ------
        ValueError
            If the id is outside the vocabulary.
        """
        walk = self._walk
        if not 0 <= token_id < len(walk):
            raise ValueError(f"token id {token_id} outside the vocabulary (size {len(walk)})")
        data = walk[token_id]
        if not data:  # a special or empty token
            result: Transition = (state_key, _TEMPLATE, None)
        else:
            state, role, revision = self.machine.step(self._states[state_key >> _SHIFT], data)
            result = (self._intern(state) << _SHIFT, role, revision)
        if len(self.memo) >= _MEMO_LIMIT:
            self.memo.clear()
        self.memo[state_key | token_id] = result
        return result


class RoleTracker:
    """The role track of one request's generated tokens.

    Call :meth:`accept` after the grammar matcher accepted a token, and :meth:`rollback` after the
    matcher rolled back.
    """

    __slots__ = ("_grammar", "_memo", "_states", "_roles", "_undo", "revised_from")

    def __init__(self, grammar: RoleGrammar) -> None:
        self._grammar = grammar
        self._memo = grammar.memo
        # key prefix (state id << _SHIFT) of the state after each token; [0] is the start
        self._states: list[int] = [grammar.initial_state << _SHIFT]
        self._roles: list[int] = []
        self._undo: list[tuple[int, int, int]] = []  # (token that revised, index, old role)
        #: Smallest index whose role changed after it was appended (by a revision or a rollback that
        #: undid one). A mirror of :attr:`roles` re-reads from here, then may set it to ``len(self)``.
        self.revised_from = 0

    @classmethod
    def for_grammar(
        cls,
        kind: str,
        key_string: str,
        vocab: TokenVocab,
        *,
        matcher: Any = None,
        functions: Iterable[Any] | None = None,
    ) -> RoleTracker:
        """Compile the grammar and return a new track (see :meth:`RoleGrammar.compile`).

        A server should keep the :class:`RoleGrammar` per key string instead, so that its memo is
        shared between requests.
        """
        return RoleGrammar.compile(kind, key_string, vocab, functions=functions).tracker(matcher)

    @property
    def grammar(self) -> RoleGrammar:
        return self._grammar

    @property
    def roles(self) -> Sequence[int]:
        """Role of every accepted token (a live view: do not modify)."""
        return self._roles

    def __len__(self) -> int:
        return len(self._roles)

    def accept(self, token_id: int) -> int:
        """Append the role of a newly accepted token and return it."""
        RoleTracker.extend(self, (token_id,))
        return self._roles[-1]

    def extend(self, token_ids: Iterable[int]) -> None:
        """Append the roles of newly accepted tokens, in order (``accept`` for each, in one loop).

        A server that tags at read time (:mod:`sglang_pask.srt.grammar`) catches up here on the
        tokens accepted since the last read.
        """
        states = self._states
        memo_get = self._memo.get  # .get: raising KeyError would slow every miss
        push_state = states.append
        push_role = self._roles.append
        state = states[-1]
        for token_id in token_ids:
            hit = memo_get(state | token_id)
            if hit is None:
                hit = self._grammar.transition(state, token_id)
            state, role, revision = hit
            push_state(state)
            if revision is not None:
                self._revise(revision)
            push_role(role)

    def _revise(self, revision: Revision) -> None:
        final, bases = revision
        roles = self._roles
        n = len(roles)
        start = n - len(bases)
        for j, base in enumerate(bases):
            i = start + j
            new = combine(base, final)
            if roles[i] != new:
                self._undo.append((n, i, roles[i]))
                roles[i] = new
                if i < self.revised_from:
                    self.revised_from = i

    def rollback(self, k: int) -> None:
        """Forget the last ``k`` tokens, restoring the roles the others had before them.

        Raises
        ------
        ValueError
            If ``k`` is negative or more than the number of tokens.
        """
        roles = self._roles
        if not 0 <= k <= len(roles):
            raise ValueError(f"cannot roll back {k} tokens of a track of {len(roles)}")
        n = len(roles) - k
        del roles[n:]
        del self._states[n + 1 :]
        undo = self._undo
        while undo and undo[-1][0] >= n:
            _, i, old = undo.pop()
            if i < n:
                roles[i] = old
                if i < self.revised_from:
                    self.revised_from = i
        if n < self.revised_from:
            self.revised_from = n

    def copy(self, matcher: Any = None) -> RoleTracker:
        """An independent track in the same state.

        Parameters
        ----------
        matcher
            The forked ``GrammarMatcher`` the copy follows; needed only by capture-based tracks.
        """
        other = RoleTracker(self._grammar)
        self._copy_into(other)
        return other

    def _copy_into(self, other: RoleTracker) -> None:
        other._states = self._states.copy()
        other._roles = self._roles.copy()
        other._undo = self._undo.copy()
        other.revised_from = self.revised_from
