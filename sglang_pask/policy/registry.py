"""The policy registry: ``--kv-policy`` names to policy classes.

Each policy module registers its class with :func:`register_policy`; importing
:mod:`sglang_pask.policy` imports them all.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import MISSING, fields, is_dataclass
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


# The option types a policy can take from the command line (``--kv-policy-args``).
_SETTABLE_TYPES = (bool, int, float, str)


def settable_options(name: str) -> dict[str, Any]:
    """The options of policy ``name`` that ``--kv-policy-args`` may set, with their defaults: its
    dataclass fields whose default is a bool, int, float or str (not, e.g., PASK's calibrated table).

    Raises
    ------
    ValueError
        If ``name`` is unknown.
    """
    if name not in _POLICIES:
        raise ValueError(f"unknown KV policy {name!r}; known: {', '.join(available_policies())}")
    return {
        f.name: f.default
        for f in fields(_POLICIES[name])  # type: ignore[arg-type]
        if f.init and f.default is not MISSING and type(f.default) in _SETTABLE_TYPES
    }


def policy_options(name: str, pairs: tuple[tuple[str, str], ...]) -> dict[str, Any]:
    """``--kv-policy-args`` text pairs as typed options of policy ``name``, checked by building it.

    Each value is read as the type of the option's default (``true``/``false`` for a bool).

    Raises
    ------
    ValueError
        Naming the key: an option the policy does not have (the message lists those it has), a
        value of the wrong type, or one the policy itself refuses.
    """
    settable = settable_options(name)
    options: dict[str, Any] = {}
    for key, text in pairs:
        if key not in settable:
            known = ", ".join(sorted(settable)) or "none"
            raise ValueError(f"policy {name!r} has no option {key!r}; its options: {known}")
        options[key] = _typed(key, text, type(settable[key]))
    get_policy(name, **options)
    return options


def _typed(key: str, text: str, kind: type) -> Any:
    if kind is bool:
        if text.lower() not in ("true", "false"):
            raise ValueError(f"{key} must be true or false, got {text!r}")
        return text.lower() == "true"
    try:
        return kind(text)
    except ValueError:
        raise ValueError(f"{key} must be {'a whole number' if kind is int else 'a number'}, got {text!r}") from None
