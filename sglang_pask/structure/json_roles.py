"""Role machine for JSON generated under a JSON schema (SGLang's ``json_schema``, OpenAI tools).

A byte-level JSON scanner that follows the schema as it goes:

- keys of an object are ``REQUIRED_KEY`` if the schema lists them in ``required``, else ``ARG_KEY``;
  while a key is still open its tokens carry the role that fits the prefix so far, and the key's
  tokens are revised when its closing quote arrives (see :mod:`.scan`);
- in a function-call *envelope* (an object whose schema has ``name`` and ``parameters`` or
  ``arguments``, as SGLang builds for ``tool_choice``), the value of ``name`` is ``FUNC_NAME`` and the
  envelope's own keys are ``BOUNDARY``; keys inside ``parameters`` are argument keys as above;
- values take their role from their first byte (string, number, ``true``/``false``, ``null``), or
  ``VALUE_ENUM`` when every schema alternative restricts them with ``enum`` / ``const``;
- braces, brackets, commas, colons and quotes are ``BOUNDARY``, whitespace between them
  ``WHITESPACE``.

``anyOf`` alternatives of an object are narrowed when a string value with an enum completes (the
function name picks the branch, and with it which arguments are required).
"""

from __future__ import annotations

import re

from .json_schema import ENVELOPE_ARGS, ENVELOPE_NAME, Cands, Schema
from .roles import Role
from .scan import Revision, Scan

# modes
_VALUE, _OBJ_OPEN, _OBJ_KEY, _KEY, _KEY_ESC, _COLON, _STR, _STR_ESC, _NUM, _LIT, _AFTER, _ARR_OPEN, _DONE = range(13)

_WS = frozenset(b" \t\n\r")
_NUM_BYTES = frozenset(b"0123456789+-.eE")
_LETTERS = frozenset(b"abcdefghijklmnopqrstuvwxyz")
_PLAIN_RUN = re.compile(rb'[^"\\]*')  # string / key bytes up to the next quote or backslash
_WSR, _BND, _FREE = int(Role.WHITESPACE), int(Role.BOUNDARY), int(Role.FREE_TEXT)
_ARG, _REQ, _FUNC = int(Role.ARG_KEY), int(Role.REQUIRED_KEY), int(Role.FUNC_NAME)
_STRING, _NUMBER, _BOOL, _NULL, _ENUM = (
    int(Role.VALUE_STRING),
    int(Role.VALUE_NUMBER),
    int(Role.VALUE_BOOL),
    int(Role.VALUE_NULL),
    int(Role.VALUE_ENUM),
)

# A frame is (kind, cands, envelope, key, index): kind b"o" (object) or b"a" (array); key is the last
# completed key of an object if the schema lists it (else None); index counts array elements up to the
# schema's prefixItems length.
Frame = tuple
# The state is (mode, frames, vcands, vrole, buf, pend):
#   vcands  alternatives of the value being read (or of the object whose key is being read)
#   vrole   role forced on the current scalar (FUNC_NAME, VALUE_ENUM) or -1 for "by type"
#   buf     bytes of the current key / enum string while they can still match the schema, else None
#   pend    bases of earlier tokens of an open key (see scan.py)
State = tuple


class JsonRoleMachine:
    """Roles of JSON text generated under ``schema``.

    Parameters
    ----------
    schema
        The compiled schema (:class:`.json_schema.Schema`).
    """

    def __init__(self, schema: Schema) -> None:
        self.schema = schema
        self.initial: State = (_VALUE, (), schema.root, -1, None, ())

    # ------------------------------------------------------------------------------------ helpers
    def _key_role(self, frame: Frame, key: bytes | None, final: bool) -> int:
        """Role of a key (``key`` is its bytes so far, or None once it matches no schema key)."""
        if frame[2]:
            return _BND
        if key is None:
            return _ARG
        _, required, _, required_prefixes = self.schema.keys(frame[1])
        return _REQ if key in (required if final else required_prefixes) else _ARG

    def _key_tracked(self, frame: Frame, key: bytes) -> bool:
        """Whether ``key`` can still become a key the schema knows."""
        return key in self.schema.keys(frame[1])[2]

    def _value_context(self, frame: Frame) -> tuple[Cands, int, bytes | None]:
        """(vcands, vrole, buf) for the value after the key recorded in ``frame``."""
        key = frame[3]
        vcands = self.schema.child(frame[1], key)
        if frame[2] and key == ENVELOPE_NAME:
            vrole = _FUNC
        elif self.schema.is_enum(vcands):
            vrole = _ENUM
        else:
            vrole = -1
        buf = b"" if self.schema.enum_strings(vcands) else None
        return vcands, vrole, buf

    def _open_object(self, vcands: Cands, frames: tuple, parent: Frame | None) -> tuple:
        in_envelope_args = parent is not None and parent[2] and parent[3] in ENVELOPE_ARGS
        envelope = self.schema.is_envelope(vcands) and not in_envelope_args
        return frames + ((b"o", vcands, envelope, None, 0),)

    def _element(self, frames: tuple) -> tuple[tuple, Cands, int, bytes | None]:
        """Advance the array frame on top of ``frames``; context of its next element."""
        kind, cands, env, key, index = frames[-1]
        vcands = self.schema.item(cands, index)
        if index < self.schema.max_prefix(cands):
            frames = frames[:-1] + ((kind, cands, env, key, index + 1),)
        vrole = _ENUM if self.schema.is_enum(vcands) else -1
        return frames, vcands, vrole, b"" if self.schema.enum_strings(vcands) else None

    # --------------------------------------------------------------------------------------- step
    def step(self, state: State, data: bytes) -> tuple[State, int, Revision | None]:
        """Walk one token's bytes from ``state``; return the new state, its role and a revision."""
        mode, frames, vcands, vrole, buf, pend = state
        if mode == _STR and buf is None and 0x22 not in data and 0x5C not in data:  # inside a string
            return state, (vrole if vrole >= 0 else _STRING), None
        scan = Scan(pend)
        core, _ = self.walk((mode, frames, vcands, vrole, buf), data, 0, scan, False)
        role, pend = scan.finish(core[0] == _KEY and core[4] is not None)  # span_open(core), inlined
        return core + (pend,), role, scan.revision

    @staticmethod
    def span_open(core: tuple) -> bool:
        """Whether a key whose role is still tentative is open in ``core`` (a state without ``pend``)."""
        return core[0] == _KEY and core[4] is not None

    @staticmethod
    def is_done(core: tuple) -> bool:
        """Whether the top-level value is complete in ``core`` (a state without ``pend``)."""
        return core[0] == _DONE

    def walk(self, core: tuple, data: bytes, i: int, scan: Scan, stop_at_done: bool) -> tuple[tuple, int]:
        """Walk ``data[i:]`` from ``core`` (a state without ``pend``), reporting byte roles to ``scan``.

        Parameters
        ----------
        core
            ``(mode, frames, vcands, vrole, buf)``.
        data, i
            The token's bytes and where to start in them.
        scan
            Receives the role of every byte walked.
        stop_at_done
            Stop as soon as the top-level value is complete, before the first byte after it (a
            structural tag's end follows the value without a separator).

        Returns
        -------
        tuple
            The new ``core`` and the index of the first byte not walked (``len(data)`` unless
            stopped).
        """
        mode, frames, vcands, vrole, buf = core
        n = len(data)
        while i < n:
            if stop_at_done and mode == _DONE:
                break
            b = data[i]
            i += 1
            if mode == _STR:
                if b == 0x22:  # closing quote
                    scan.add(_BND)
                    if buf is not None and frames and frames[-1][0] == b"o" and frames[-1][3] is not None:
                        top = frames[-1]
                        narrowed = self.schema.narrow(top[1], top[3], buf)
                        if narrowed != top[1]:
                            frames = frames[:-1] + ((top[0], narrowed, top[2], top[3], top[4]),)
                    mode, buf = (_AFTER if frames else _DONE), None
                elif b == 0x5C:
                    scan.add(vrole if vrole >= 0 else _STRING)
                    mode = _STR_ESC
                    buf = None
                else:  # the run of plain string bytes up to a quote or backslash, at once
                    j = _PLAIN_RUN.match(data, i).end()
                    scan.add(vrole if vrole >= 0 else _STRING)
                    if buf is not None:  # enum prefixes are prefix-closed: checking the longest suffices
                        buf = buf + data[i - 1 : j]
                        if buf not in self.schema.enum_prefixes(vcands):
                            buf = None
                    i = j
                continue
            if mode == _STR_ESC:
                scan.add(vrole if vrole >= 0 else _STRING)
                mode = _STR
                continue
            if mode == _KEY:
                top = frames[-1]
                if b == 0x22:  # key complete
                    scan.resolve(self._key_role(top, buf, final=True))
                    scan.add(_BND)
                    key = buf if buf is not None and buf in self.schema.keys(top[1])[0] else None
                    frames = frames[:-1] + ((top[0], top[1], top[2], key, top[4]),)
                    mode, buf = _COLON, None
                    continue
                if b == 0x5C:
                    mode = _KEY_ESC
                else:  # a run of plain key bytes that stays a known key's prefix, at once
                    j = _PLAIN_RUN.match(data, i).end()
                    if buf is not None and self._key_tracked(top, buf + data[i - 1 : j]):
                        # the shortest new prefix decides the tentative role (prefix sets are closed)
                        scan.span(self._key_role(top, buf + bytes((b,)), final=False))
                        buf = buf + data[i - 1 : j]
                        i = j
                        continue
                    if buf is None:
                        scan.add(self._key_role(top, None, final=True))
                        i = j
                        continue
                if buf is not None:
                    buf = buf + bytes((b,))
                    if b == 0x5C or not self._key_tracked(top, buf):
                        buf = None
                        scan.resolve(self._key_role(top, None, final=True))
                if buf is None:
                    scan.add(self._key_role(top, None, final=True))
                else:
                    scan.span(self._key_role(top, buf, final=False))
                continue
            if mode == _KEY_ESC:
                scan.add(self._key_role(frames[-1], None, final=True))
                mode = _KEY
                continue
            if mode == _NUM:
                if b in _NUM_BYTES:
                    scan.add(vrole if vrole >= 0 else _NUMBER)
                    continue
                mode = _AFTER if frames else _DONE  # this byte ends the number: read it again below
                if stop_at_done and mode == _DONE:
                    i -= 1
                    break
            elif mode == _LIT:
                if b in _LETTERS:
                    scan.add(vrole if vrole >= 0 else (_NULL if buf == b"n" else _BOOL))
                    continue
                mode, buf = (_AFTER if frames else _DONE), None
                if stop_at_done and mode == _DONE:
                    i -= 1
                    break
            if b in _WS:
                scan.add(_WSR)
                continue
            if mode == _ARR_OPEN:
                if b == 0x5D:
                    scan.add(_BND)
                    frames = frames[:-1]
                    mode = _AFTER if frames else _DONE
                    continue
                frames, vcands, vrole, buf = self._element(frames)
                mode = _VALUE
            if mode == _VALUE:
                if b == 0x22:
                    scan.add(_BND)
                    mode = _STR
                elif b == 0x7B:
                    scan.add(_BND)
                    frames = self._open_object(vcands, frames, frames[-1] if frames else None)
                    mode, buf = _OBJ_OPEN, None
                elif b == 0x5B:
                    scan.add(_BND)
                    frames = frames + ((b"a", vcands, False, None, 0),)
                    mode, buf = _ARR_OPEN, None
                elif b == 0x2D or 0x30 <= b <= 0x39:
                    scan.add(vrole if vrole >= 0 else _NUMBER)
                    mode, buf = _NUM, None
                elif b in _LETTERS:
                    scan.add(vrole if vrole >= 0 else (_NULL if b == 0x6E else _BOOL))
                    mode, buf = _LIT, (b"n" if b == 0x6E else b"b")
                else:
                    scan.add(_FREE)
                continue
            if mode in (_OBJ_OPEN, _OBJ_KEY):
                if b == 0x22:
                    scan.add(_BND)
                    mode, buf = _KEY, b""
                elif b == 0x7D and mode == _OBJ_OPEN:
                    scan.add(_BND)
                    frames = frames[:-1]
                    mode = _AFTER if frames else _DONE
                else:
                    scan.add(_FREE)
                continue
            if mode == _COLON:
                if b == 0x3A:
                    scan.add(_BND)
                    vcands, vrole, buf = self._value_context(frames[-1])
                    mode = _VALUE
                else:
                    scan.add(_FREE)
                continue
            if mode == _AFTER:
                kind = frames[-1][0]
                if b == 0x2C:
                    scan.add(_BND)
                    if kind == b"o":
                        mode = _OBJ_KEY
                    else:
                        frames, vcands, vrole, buf = self._element(frames)
                        mode = _VALUE
                elif (b == 0x7D and kind == b"o") or (b == 0x5D and kind == b"a"):
                    scan.add(_BND)
                    frames = frames[:-1]
                    mode = _AFTER if frames else _DONE
                else:
                    scan.add(_FREE)
                continue
            scan.add(_FREE)  # _DONE: nothing but whitespace may follow
        return (mode, frames, vcands, vrole, buf), i
