"""Reading SGLang's own flags in an argv list (``--flag value`` or ``--flag=value``), without parsing it."""

from __future__ import annotations

from typing import Optional


def has_flag(argv: list[str], flag: str) -> bool:
    """Whether ``flag`` is given in ``argv``."""
    return any(arg == flag or arg.startswith(flag + "=") for arg in argv)


def flag_value(argv: list[str], flag: str) -> Optional[str]:
    """The value of the first ``flag`` in ``argv``, or None when it is absent or has no value."""
    for index, arg in enumerate(argv):
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
        if arg == flag and index + 1 < len(argv):
            return argv[index + 1]
    return None
