"""Navigation of a JSON schema for role tagging: which keys exist, which are required, where enums are.

Only what roles need is read: ``properties``, ``required``, ``additionalProperties``, ``items`` /
``prefixItems``, ``enum`` / ``const``, ``$ref`` (local pointers), ``allOf`` (merged), ``anyOf`` /
``oneOf`` (kept as alternatives, narrowed by enum values seen in the output). Types and numeric or
string constraints do not change roles, so they are ignored.

The navigation tables (alternatives under each key and array index, key and enum prefix sets,
narrowing by enum values) are built when the schema is compiled, for every candidate set reachable
from the root, like xgrammar's per-grammar tables: tagging a request then only looks them up. Nodes
are created on first reach (keyed by the schema object), which makes recursive schemas (``$ref``
cycles) finite. A schema with more than :data:`TABLE_LIMIT` reachable candidate sets keeps the rest
for first use.

A *candidate set* is a tuple of node ids: the alternatives a value may still match. Node 0 is the
unconstrained schema.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, NamedTuple

Cands = tuple[int, ...]
ANY: Cands = (0,)
#: (known keys, required keys, prefixes of known keys, prefixes of required keys)
KeySets = tuple[frozenset[bytes], frozenset[bytes], frozenset[bytes], frozenset[bytes]]
#: How an object's alternatives narrow when a string value under one key completes: the
#: alternatives kept per enum member, and those kept for any other value.
Narrowing = tuple[dict[bytes, Cands], Cands]
#: (every alternative is a function-call envelope, every alternative is an enum, length of the
#: longest ``prefixItems``)
Flags = tuple[bool, bool, int]

#: Candidate sets whose tables are built at compile time (the rest on first use).
TABLE_LIMIT = 1024

#: Keys whose object is a function-call envelope: the value of ``name`` is the function name and the
#: keys inside ``parameters`` / ``arguments`` are the call's argument keys.
ENVELOPE_NAME = b"name"
ENVELOPE_ARGS = (b"parameters", b"arguments")
_COMPOSITE = frozenset({"$ref", "allOf", "anyOf", "oneOf"})


class Node(NamedTuple):
    """One resolved object/array/scalar alternative of a schema (a tuple: cheap to build)."""

    props: Mapping[bytes, Any]
    required: frozenset[bytes]
    extra: Any  # schema of properties not listed (True: anything)
    items: Any
    prefix_items: tuple[Any, ...]
    enum_strings: frozenset[bytes] | None  # string members of enum/const as they appear in JSON
    is_enum: bool
    envelope: bool


_ANY_NODE = Node({}, frozenset(), True, True, (), None, False, False)


def _prefixes(names: frozenset[bytes]) -> frozenset[bytes]:
    return frozenset(n[:k] for n in names for k in range(len(n) + 1))


def _enum_bytes(value: str) -> set[bytes]:
    """The ways a string may be spelled between quotes in generated JSON."""
    return {json.dumps(value)[1:-1].encode(), json.dumps(value, ensure_ascii=False)[1:-1].encode()}


class Schema:
    """A JSON schema compiled into :class:`Node` alternatives and navigation tables.

    Parameters
    ----------
    root
        The parsed schema (``True``/``{}`` for any JSON).

    Raises
    ------
    ValueError
        If a reachable part of the schema is not an object/boolean, or a ``$ref`` cannot be
        resolved.
    """

    def __init__(self, root: Any) -> None:
        self._root = root
        self.nodes: list[Node] = [_ANY_NODE]
        self._cands: dict[int, Cands] = {}
        self._keep: list[Any] = []  # merged schemas: their ids are cache keys, so keep them alive
        self._child_cache: dict[tuple[Cands, bytes | None], Cands] = {}
        self._item_cache: dict[tuple[Cands, int], Cands] = {}
        self._keys_cache: dict[Cands, KeySets] = {}
        self._enum_cache: dict[Cands, frozenset[bytes] | None] = {}
        self._enum_prefix_cache: dict[Cands, frozenset[bytes]] = {}
        self._narrow_cache: dict[tuple[Cands, bytes], Narrowing] = {}
        self._flags_cache: dict[Cands, Flags] = {}
        self.root = self.candidates(root)
        self._build_tables(TABLE_LIMIT)

    @classmethod
    def from_json(cls, key_string: str) -> Schema:
        """Parse SGLang's ``json_schema`` string (``"$$ANY$$"`` means any JSON)."""
        if key_string == "$$ANY$$":
            return cls(True)
        try:
            root = json.loads(key_string)
        except json.JSONDecodeError as e:
            raise ValueError(f"json_schema is not valid JSON: {e}") from None
        return cls(root)

    # ----------------------------------------------------------------------------------- building
    def candidates(self, schema: Any) -> Cands:
        """Node ids of the alternatives of ``schema``."""
        if schema is True or schema is False or schema is None:
            return ANY
        if not isinstance(schema, Mapping):
            raise ValueError(f"a JSON schema must be an object or a boolean, got {type(schema).__name__}")
        key = id(schema)
        got = self._cands.get(key)
        if got is None:
            self._cands[key] = ANY  # a cycle that reaches itself without structure is unconstrained
            got = self._build(schema, depth=0)
            self._cands[key] = got
        return got

    def _resolve_ref(self, ref: Any) -> Any:
        if not isinstance(ref, str) or not ref.startswith("#"):
            raise ValueError(f"only local $ref pointers ('#/...') are supported, got {ref!r}")
        node = self._root
        for part in [p for p in ref[1:].split("/") if p]:
            part = part.replace("~1", "/").replace("~0", "~")
            if isinstance(node, Mapping) and part in node:
                node = node[part]
            elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
                node = node[int(part)]
            else:
                raise ValueError(f"$ref {ref!r} does not resolve inside the schema")
        return node

    def _flatten(self, schema: Mapping[str, Any], depth: int) -> list[dict[str, Any]]:
        """Resolve $ref and allOf; expand anyOf/oneOf into a list of plain alternatives."""
        if depth > 64:
            raise ValueError("JSON schema nests $ref/allOf/anyOf more than 64 levels deep")
        if not _COMPOSITE.intersection(schema):  # a plain schema is its own only alternative
            return [schema]
        schema = dict(schema)
        if "$ref" in schema:
            target = self._resolve_ref(schema.pop("$ref"))
            if target is True or target is None:
                target = {}
            if not isinstance(target, Mapping):
                raise ValueError("a $ref must point to a schema object")
            siblings = self._flatten(schema, depth + 1)
            return [self._merge(alt, s) for alt in self._flatten(target, depth + 1) for s in siblings]
        for part in schema.pop("allOf", None) or []:
            if not isinstance(part, Mapping):
                raise ValueError("allOf entries must be schema objects")
            alts = self._flatten(part, depth + 1)
            schema = self._merge(schema, alts[0]) if len(alts) == 1 else {**schema, "anyOf": alts}
        for keyword in ("anyOf", "oneOf"):
            branches = schema.pop(keyword, None)
            if branches is None:
                continue
            if not isinstance(branches, list) or not branches:
                raise ValueError(f"{keyword} must be a non-empty list of schemas")
            out: list[dict[str, Any]] = []
            for branch in branches:
                if branch is True:
                    branch = {}
                if not isinstance(branch, Mapping):
                    raise ValueError(f"{keyword} entries must be schema objects")
                for alt in self._flatten(branch, depth + 1):
                    out.extend(self._flatten(self._merge(schema, alt), depth + 1))
            return out
        return [schema]

    @staticmethod
    def _merge(a: Mapping[str, Any], b: Mapping[str, Any]) -> dict[str, Any]:
        out = {**a, **b}
        if "properties" in a and "properties" in b:
            out["properties"] = {**a["properties"], **b["properties"]}
        if "required" in a and "required" in b:
            out["required"] = list(a["required"]) + [r for r in b["required"] if r not in a["required"]]
        return out

    def _build(self, schema: Mapping[str, Any], depth: int) -> Cands:
        ids = []
        for alt in self._flatten(schema, depth):
            self._keep.append(alt)
            ids.append(len(self.nodes))
            self.nodes.append(self._node(alt))
        return tuple(ids)

    @staticmethod
    def _node(s: Mapping[str, Any]) -> Node:
        props = s.get("properties") or {}
        if not isinstance(props, Mapping):
            raise ValueError("'properties' must be an object")
        required = s.get("required") or []
        if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
            raise ValueError("'required' must be a list of property names")
        enum_values: list[Any] | None = None
        if "enum" in s:
            if not isinstance(s["enum"], list):
                raise ValueError("'enum' must be a list")
            enum_values = list(s["enum"])
        if "const" in s:
            enum_values = [s["const"]]
        enum_strings = None
        if enum_values is not None:
            enum_strings = frozenset(b for v in enum_values if isinstance(v, str) for b in _enum_bytes(v))
        prefix = s.get("prefixItems") or ()
        items = s.get("items", True)
        if isinstance(items, list):  # draft-04 tuple form
            prefix, items = items, s.get("additionalItems", True)
        names = {k.encode() for k in props}
        return Node(
            props={k.encode(): v for k, v in props.items()},
            required=frozenset(r.encode() for r in required),
            extra=s.get("additionalProperties", True),
            items=items,
            prefix_items=tuple(prefix),
            enum_strings=enum_strings,
            is_enum=enum_values is not None,
            envelope=ENVELOPE_NAME in names and any(a in names for a in ENVELOPE_ARGS),
        )

    def _build_tables(self, limit: int) -> None:
        """Fill the navigation tables of every candidate set reachable from the root (at most
        ``limit`` sets).

        Reachable: the root, the alternatives under every known key (and under any other key) and
        every array index of a reached set, and the sets an object narrows to by an enum value.
        """
        seen = {self.root}
        todo = [self.root]
        done = 0
        while todo and done < limit:
            cands = todo.pop()
            done += 1
            known = self.keys(cands)[0]
            self.enum_prefixes(cands)
            self._flags(cands)
            nexts = [self.child(cands, None)]
            for key in known:
                nexts.append(self.child(cands, key))
                by_value, other = self._narrowing(cands, key)
                nexts.extend(by_value.values())
                nexts.append(other)
            nexts.extend(self.item(cands, i) for i in range(self.max_prefix(cands) + 1))
            for n in nexts:
                if n not in seen:
                    seen.add(n)
                    todo.append(n)

    # --------------------------------------------------------------------------------- navigation
    def child(self, cands: Cands, key: bytes | None) -> Cands:
        """Alternatives of the value under ``key`` in an object matching ``cands`` (``None``: a key
        the schema does not list)."""
        cache_key = (cands, key)
        got = self._child_cache.get(cache_key)
        if got is None:
            out: list[int] = []
            for c in cands:
                node = self.nodes[c]
                sub = node.props.get(key, node.extra) if key is not None else node.extra
                for i in self.candidates(sub):
                    if i not in out:
                        out.append(i)
            got = self._child_cache[cache_key] = tuple(out) or ANY
        return got

    def item(self, cands: Cands, index: int) -> Cands:
        """Alternatives of element ``index`` of an array matching ``cands``."""
        cache_key = (cands, index)
        got = self._item_cache.get(cache_key)
        if got is None:
            out: list[int] = []
            for c in cands:
                node = self.nodes[c]
                sub = node.prefix_items[index] if index < len(node.prefix_items) else node.items
                for i in self.candidates(sub):
                    if i not in out:
                        out.append(i)
            got = self._item_cache[cache_key] = tuple(out) or ANY
        return got

    def _flags(self, cands: Cands) -> Flags:
        got = self._flags_cache.get(cands)
        if got is None:
            nodes = [self.nodes[c] for c in cands]
            got = self._flags_cache[cands] = (
                all(n.envelope for n in nodes),
                all(n.is_enum for n in nodes),
                max(len(n.prefix_items) for n in nodes),
            )
        return got

    def max_prefix(self, cands: Cands) -> int:
        """Array index from which every element has the same schema."""
        return self._flags(cands)[2]

    def keys(self, cands: Cands) -> KeySets:
        """Known keys, required keys, and every prefix of each, over the alternatives ``cands``."""
        got = self._keys_cache.get(cands)
        if got is None:
            known = frozenset(k for c in cands for k in self.nodes[c].props)
            required = frozenset(r for c in cands for r in self.nodes[c].required)
            got = (known, required, _prefixes(known), _prefixes(required))
            self._keys_cache[cands] = got
        return got

    def is_envelope(self, cands: Cands) -> bool:
        """True if every alternative is a function-call envelope (``name`` plus ``parameters``)."""
        return self._flags(cands)[0]

    def is_enum(self, cands: Cands) -> bool:
        """True if the value is restricted by ``enum`` / ``const`` in every alternative."""
        return self._flags(cands)[1]

    def enum_strings(self, cands: Cands) -> frozenset[bytes] | None:
        """Union of string enum members over ``cands`` (None if some alternative has no enum)."""
        if cands in self._enum_cache:
            return self._enum_cache[cands]
        out: set[bytes] | None = set()
        for c in cands:
            strings = self.nodes[c].enum_strings
            if strings is None:
                out = None
                break
            out.update(strings)
        got = self._enum_cache[cands] = frozenset(out) if out is not None else None
        return got

    def enum_prefixes(self, cands: Cands) -> frozenset[bytes]:
        """Every prefix of the string enum members over ``cands`` (empty if there is no enum)."""
        got = self._enum_prefix_cache.get(cands)
        if got is None:
            got = self._enum_prefix_cache[cands] = _prefixes(self.enum_strings(cands) or frozenset())
        return got

    def narrow(self, cands: Cands, key: bytes, value: bytes) -> Cands:
        """Drop object alternatives whose ``key`` has a string enum that excludes ``value``."""
        by_value, other = self._narrowing(cands, key)
        return by_value.get(value, other)

    def _narrowing(self, cands: Cands, key: bytes) -> Narrowing:
        """:meth:`narrow` for every value of ``key`` at once."""
        got = self._narrow_cache.get((cands, key))
        if got is None:
            alts: list[tuple[int, frozenset[bytes] | None]] = []
            for c in cands:
                sub = self.nodes[c].props.get(key)
                alts.append((c, None if sub is None else self.enum_strings(self.candidates(sub))))
            members = {v for _, strings in alts if strings is not None for v in strings}
            by_value = {v: tuple(c for c, s in alts if s is None or v in s) for v in members}
            other = tuple(c for c, s in alts if s is None) or cands
            got = self._narrow_cache[(cands, key)] = (by_value, other)
        return got
