"""The policy registry: ``--kv-policy`` names to policy classes.

Each policy module registers its class with :func:`register_policy`; importing
:mod:`sglang_pask.policy` imports them all.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import fields, is_dataclass
from typing import Any, TypeVar

from .base import KVPolicy

P = TypeVar("P", bound=type[KVPolicy])

_POLICIES: dict[str, type[KVPolicy]] = {}


def register_policy(name: str) -> Callable[[P], P]:
    """Class decorator: register a :class:`KVPolicy` dataclass under ``name`` and set its ``name``.

    Raises
    ------
    ValueError
        If another class already holds ``name``.
    TypeError
        If the class is not a dataclass (its fields are its options).
    """

    def register(cls: P) -> P:
        if not is_dataclass(cls):
            raise TypeError(f"KV policy {cls.__qualname__} must be a dataclass (its fields are its options)")
        holder = _POLICIES.get(name)
        if holder is not None and holder is not cls:
            raise ValueError(f"KV policy name {name!r} is already registered by {holder.__qualname__}")
        cls.name = name
        _POLICIES[name] = cls
        return cls

    return register


def available_policies() -> tuple[str, ...]:
    """Names of the registered policies, sorted."""
    return tuple(sorted(_POLICIES))


def get_policy(name: str, **options: Any) -> KVPolicy:
    """A policy instance by registry name, configured with ``options`` (its dataclass fields).

    Raises
    ------
    ValueError
        If ``name`` is unknown (the message lists the known names), an option is unknown (the
        message lists the policy's options), or an option value is invalid.
    """
    try:
        cls = _POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown KV policy {name!r}; known: {', '.join(available_policies())}") from None
    known = [f.name for f in fields(cls)]  # type: ignore[arg-type]
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise ValueError(
            f"KV policy {name!r} has no option {', '.join(map(repr, unknown))}; "
            f"its options: {', '.join(known) if known else 'none'}"
        )
    return cls(**options)
