"""Role machine for Python call syntax, as BFCL asks for: ``[func(a=1, b="x"), g()]``.

- an identifier where a call starts (at the top level or inside the outer list) is ``FUNC_NAME``;
- inside a call's parentheses, ``name=`` is a keyword argument: ``REQUIRED_KEY`` if the function's
  spec lists it as required, else ``ARG_KEY``. Its role is certain at the ``=`` (a name followed by
  ``,`` or ``)`` is a positional value instead, ``FREE_TEXT``); until then its tokens carry the role
  that fits the prefix and are revised (see :mod:`.scan`);
- values by Python literal type: strings ``VALUE_STRING`` (quotes ``BOUNDARY``), numbers
  ``VALUE_NUMBER``, ``True``/``False`` ``VALUE_BOOL``, ``None`` ``VALUE_NULL``; ``VALUE_ENUM`` for an
  argument the spec marks as an enum; lists, tuples and dicts nest, their brackets and separators are
  ``BOUNDARY`` and dict keys are ``ARG_KEY``; a name followed by ``(`` inside a value is a nested
  call's ``FUNC_NAME``;
- ``[ ] ( ) { } , = :`` are ``BOUNDARY``, whitespace ``WHITESPACE``.

Two layers, so that a new grammar (every BFCL item has its own regex) starts warm:

- :class:`CallSyntax` knows no function: it tags syntax and reports *events* (bytes of a function
  name or key, a call opening or closing, a key closing, value bytes). Its memo is keyed by (state,
  token bytes) and shared by every call grammar in the process.
- :class:`CallRoleMachine` adds one grammar's function specs: it follows the names through the events
  and turns ``ARG_KEY`` into ``REQUIRED_KEY`` and values into ``VALUE_ENUM`` where the specs say so.
  Its own results are memoised per grammar by :class:`.tracker.RoleGrammar` as usual.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

from .function_docs import FunctionSpec
from .roles import Role
from .scan import Revision, Scan

_TOP, _FNAME, _ARG, _KEY, _EQ, _VALUE, _STR, _STR_ESC, _NUM, _WORD, _AFTER, _DKEY = range(12)
# frame kinds; a frame is (kind, vrole): vrole is the role forced on the elements (-1: by type)
_F_CALLS, _F_CALL, _F_LIST, _F_TUPLE, _F_DICT_K, _F_DICT_V = range(6)
# events: (EV_NAME, start, end, new) bytes of a function name or key; (EV_OPEN, named) a call opens;
# (EV_KEY_END, keyword) a key ends (keyword=False: it was a positional value); (EV_CLOSE,) a call
# closes; (EV_VALUE,) value bytes follow
EV_NAME, EV_OPEN, EV_KEY_END, EV_CLOSE, EV_VALUE = range(5)

_WS = frozenset(b" \t\n\r")
_IDENT_START = frozenset(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ_")
_IDENT = _IDENT_START | frozenset(b"0123456789")
_NUM_START = frozenset(b"0123456789-+.")
_NUM_BYTES = _IDENT | frozenset(b".+-")
_WSR, _BND, _FREE = int(Role.WHITESPACE), int(Role.BOUNDARY), int(Role.FREE_TEXT)
_FUNC, _ARGK, _REQ = int(Role.FUNC_NAME), int(Role.ARG_KEY), int(Role.REQUIRED_KEY)
_STRING, _NUMBER, _ENUM = int(Role.VALUE_STRING), int(Role.VALUE_NUMBER), int(Role.VALUE_ENUM)
_VALUE_ROLES = frozenset(int(r) for r in (Role.VALUE_STRING, Role.VALUE_NUMBER, Role.VALUE_BOOL, Role.VALUE_NULL))
_WORDS = {b"True": int(Role.VALUE_BOOL), b"False": int(Role.VALUE_BOOL), b"None": int(Role.VALUE_NULL)}
_WORD_PREFIX = {w[:k]: r for w, r in _WORDS.items() for k in range(1, len(w) + 1)}
_MEMO_LIMIT = 1 << 20
_NAME_LIMIT = 128

# syntax state: (mode, frames, vrole, buf, pend)
#   vrole  role forced on the value being read (ARG_KEY for dict keys; -1: by type)
#   buf    True/False/None prefix of a word in value position; the quote byte (int) in a string
#   pend   bases of earlier tokens of an open key or word (see scan.py)
#: (state id, role, revision, events, mode of the new state)
SyntaxResult = tuple[int, int, "Revision | None", tuple, int]


class CallSyntax:
    """Spec-free Python call-list tagger with events; one instance serves every call grammar."""

    def __init__(self) -> None:
        self.memo: dict[tuple[int, bytes], SyntaxResult] = {}
        self._ids: dict[Hashable, int] = {}
        self._states: list[tuple] = []
        self.initial = self._intern((_TOP, (), -1, None, ()))

    def _intern(self, state: tuple) -> int:
        sid = self._ids.get(state)
        if sid is None:
            sid = self._ids[state] = len(self._states)
            self._states.append(state)
        return sid

    def result(self, state_id: int, data: bytes) -> SyntaxResult:
        """(state id, role, revision, events, mode) after ``data`` from ``state_id`` (memoised)."""
        key = (state_id, data)
        got = self.memo.get(key)
        if got is None:
            state, role, revision, events = self.step(self._states[state_id], data)
            got = (self._intern(state), role, revision, events, state[0])
            if len(self.memo) >= _MEMO_LIMIT:
                self.memo.clear()
            self.memo[key] = got
        return got

    def step(self, state: tuple, data: bytes) -> tuple[tuple, int, Revision | None, tuple]:
        """Walk one token's bytes; return the new state, the role, a revision and the events."""
        mode, frames, vrole, buf, pend = state
        if mode == _STR and buf not in data and 0x5C not in data:  # inside a string, and stays
            role = vrole if vrole >= 0 else _STRING
            return state, role, None, (((EV_VALUE,),) if role in _VALUE_ROLES else ())
        scan = Scan(pend)
        events: list[tuple] = []
        name_start = -1  # start in data of the name bytes being collected
        name_new = False

        def flush_name(end: int) -> None:
            nonlocal name_start
            if name_start >= 0:
                events.append((EV_NAME, name_start, end, name_new))
                name_start = -1

        def value(role: int) -> None:
            if role in _VALUE_ROLES and (not events or events[-1][0] != EV_VALUE):
                events.append((EV_VALUE,))
            scan.add(role)

        if mode in (_FNAME, _KEY):
            name_start, name_new = 0, False
        for i, b in enumerate(data):
            while True:  # `continue` reads the same byte again in the new mode
                if mode == _STR:
                    if b == buf:
                        scan.add(_BND)
                        mode, buf = (_AFTER if frames else _TOP), None
                    else:
                        value(vrole if vrole >= 0 else _STRING)
                        if b == 0x5C:
                            mode = _STR_ESC
                    break
                if mode == _STR_ESC:
                    value(vrole if vrole >= 0 else _STRING)
                    mode = _STR
                    break
                if mode == _NUM:
                    if b in _NUM_BYTES:
                        value(vrole if vrole >= 0 else _NUMBER)
                        break
                    mode = _AFTER if frames else _TOP
                    continue
                if mode == _FNAME:
                    if b in _IDENT or b == 0x2E:
                        scan.add(_FUNC)
                        break
                    flush_name(i)
                    if b == 0x28:
                        scan.add(_BND)
                        events.append((EV_OPEN, True))
                        frames, mode = frames + ((_F_CALL, -1),), _ARG
                        break
                    mode = _TOP
                    continue
                if mode == _KEY:
                    if b in _IDENT:
                        scan.span(_ARGK)
                        break
                    flush_name(i)
                    mode = _EQ
                    continue
                if mode == _EQ:
                    if b in _WS:
                        scan.add(_WSR)
                        break
                    if b == 0x3D:
                        scan.resolve(_ARGK)
                        scan.add(_BND)
                        events.append((EV_KEY_END, True))
                        mode, vrole = _VALUE, -1
                        break
                    scan.resolve(_FREE)  # a positional name, not a key
                    events.append((EV_KEY_END, False))
                    mode = _AFTER
                    continue
                if mode == _WORD:
                    if b in _IDENT or b == 0x2E:
                        if buf is not None:
                            buf = buf + bytes((b,))
                            if buf not in _WORD_PREFIX:
                                buf = None
                        word = vrole if vrole >= 0 else (_FREE if buf is None else _WORD_PREFIX[buf])
                        if word in _VALUE_ROLES and (not events or events[-1][0] != EV_VALUE):
                            events.append((EV_VALUE,))
                        scan.span(word)
                        break
                    if b == 0x28:  # a nested call
                        scan.resolve(_FUNC)
                        scan.add(_BND)
                        events.append((EV_OPEN, False))
                        frames, mode, buf = frames + ((_F_CALL, -1),), _ARG, None
                        break
                    scan.resolve(vrole if vrole >= 0 else _WORDS.get(buf or b"", _FREE))
                    mode, buf = (_AFTER if frames else _TOP), None
                    continue
                if b in _WS:
                    scan.add(_WSR)
                    break
                if mode == _TOP:
                    if b in _IDENT_START:
                        scan.add(_FUNC)
                        mode, name_start, name_new = _FNAME, i, True
                    elif b == 0x5B:
                        scan.add(_BND)
                        frames = frames + ((_F_CALLS, -1),)
                    elif b == 0x5D and frames and frames[-1][0] == _F_CALLS:
                        scan.add(_BND)
                        frames = frames[:-1]
                    elif b == 0x2C:
                        scan.add(_BND)
                    else:
                        scan.add(_FREE)
                    break
                if mode == _ARG:
                    if b in _IDENT_START:
                        mode, name_start, name_new = _KEY, i, True
                        continue
                    if b == 0x29:
                        mode = _AFTER
                        continue
                    mode, vrole = _VALUE, -1
                    continue
                if mode in (_VALUE, _DKEY):
                    if mode == _DKEY and b == 0x7D:
                        mode = _AFTER
                        continue
                    if b == 0x22 or b == 0x27:
                        scan.add(_BND)
                        mode, buf = _STR, b
                    elif b in _NUM_START:
                        value(vrole if vrole >= 0 else _NUMBER)
                        mode = _NUM
                    elif b in _IDENT_START:
                        mode, buf = _WORD, b""
                        continue
                    elif b == 0x5B or b == 0x28:
                        scan.add(_BND)
                        frames = frames + ((_F_LIST if b == 0x5B else _F_TUPLE, vrole),)
                    elif b == 0x7B:
                        scan.add(_BND)
                        frames = frames + ((_F_DICT_K, vrole),)
                        mode, vrole = _DKEY, _ARGK
                    elif b in b")]":
                        mode = _AFTER  # an empty list / tuple
                        continue
                    else:
                        scan.add(_FREE)
                    break
                # _AFTER: a value ended; expect a separator or a closing bracket
                kind = frames[-1][0] if frames else -1
                if b == 0x2C and frames:
                    scan.add(_BND)
                    if kind == _F_DICT_V:
                        frames = frames[:-1] + ((_F_DICT_K, frames[-1][1]),)
                    if kind == _F_CALLS:
                        mode, vrole = _TOP, -1
                    elif kind == _F_CALL:
                        mode, vrole = _ARG, -1
                    elif kind in (_F_DICT_K, _F_DICT_V):
                        mode, vrole = _DKEY, _ARGK
                    else:
                        mode, vrole = _VALUE, frames[-1][1]
                elif b == 0x3A and kind == _F_DICT_K:
                    scan.add(_BND)
                    frames = frames[:-1] + ((_F_DICT_V, frames[-1][1]),)
                    mode, vrole = _VALUE, frames[-1][1]
                elif (
                    (b == 0x29 and kind in (_F_CALL, _F_TUPLE))
                    or (b == 0x5D and kind in (_F_LIST, _F_CALLS))
                    or (b == 0x7D and kind in (_F_DICT_K, _F_DICT_V))
                ):
                    scan.add(_BND)
                    if kind == _F_CALL:
                        events.append((EV_CLOSE,))
                    frames = frames[:-1]
                    mode, vrole = (_AFTER if frames else _TOP), -1
                    if kind == _F_CALLS:
                        mode = _TOP
                else:
                    scan.add(_FREE)
                break
        flush_name(len(data))
        role, pend = scan.finish(span_open=mode in (_KEY, _EQ, _WORD))
        return (mode, frames, vrole, buf, pend), role, scan.revision, tuple(events)


_SYNTAX = CallSyntax()


def _prefixes(names: Sequence[bytes]) -> frozenset[bytes]:
    return frozenset(n[:k] for n in names for k in range(1, len(n) + 1))


class CallRoleMachine:
    """Roles of Python call-list text, with one grammar's function specs.

    Parameters
    ----------
    functions
        Known functions (names, required and enum arguments); may be empty, then every keyword
        argument is ``ARG_KEY``.
    """

    def __init__(self, functions: Sequence[FunctionSpec]) -> None:
        self.functions = tuple(functions)
        names = [f.name.encode() for f in self.functions]
        self._index = {n: i for i, n in enumerate(names)}
        self._name_prefixes = _prefixes(names)
        self._params = [_prefixes([p.encode() for p in f.params]) for f in self.functions]
        self._required = [frozenset(p.encode() for p in f.required) for f in self.functions]
        self._required_prefixes = [_prefixes(list(req)) for req in self._required]
        self._enums = [frozenset(p.encode() for p in f.enums) for f in self.functions]
        self._syntax = _SYNTAX
        # state: (syntax state id, open calls' function indices, name so far or None, enum value)
        self.initial: tuple = (_SYNTAX.initial, (), None, False)

    def step(self, state: tuple, data: bytes) -> tuple[tuple, int, Revision | None]:
        """Walk one token's bytes from ``state``; return the new state, its role and a revision."""
        syn, funcs, name, enum = state
        enum_before = enum
        syn, role, revision, events, mode = self._syntax.result(syn, data)
        key_required = False  # a keyword argument that closed in this token is required
        enum_value = False  # value bytes of an enum argument are in this token
        for ev in events:
            kind = ev[0]
            if kind == EV_NAME:
                _, a, b, new = ev
                name = data[a:b] if new else (name + data[a:b] if name is not None else None)
                if name is not None and len(name) > _NAME_LIMIT:
                    name = None
            elif kind == EV_VALUE:
                enum_value = enum_value or enum
            elif kind == EV_KEY_END:
                func = funcs[-1] if funcs else -1
                if ev[1] and func >= 0 and name is not None:
                    key_required = key_required or name in self._required[func]
                    enum = name in self._enums[func]
                else:
                    enum = False
                name = None
            elif kind == EV_OPEN:
                funcs = funcs + ((self._index.get(name, -1) if ev[1] and name is not None else -1),)
                name, enum = None, False
            else:  # EV_CLOSE
                funcs, enum = funcs[:-1], False
        if name is not None:  # still typing a name: keep it only while it can match a spec
            func = funcs[-1] if funcs else -1
            known = self._name_prefixes if mode == _FNAME else (self._params[func] if func >= 0 else ())
            if name not in known:
                name = None
        if role == _ARGK:
            open_required = mode in (_KEY, _EQ) and name is not None and funcs and funcs[-1] >= 0
            if key_required or (open_required and name in self._required_prefixes[funcs[-1]]):
                role = _REQ
        elif enum_value and role in _VALUE_ROLES:
            role = _ENUM
        if revision is not None:
            final, bases = revision
            if final == _ARGK and key_required:
                revision = (_REQ, bases)
            elif final in _VALUE_ROLES and enum_before:
                revision = (_ENUM, bases)
        return (syn, funcs, name, enum), role, revision
