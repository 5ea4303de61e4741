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


# SGLang's parallelism flags and their long spellings.
PARALLEL_SIZE_FLAGS = (
    ("--tp-size", "--tensor-parallel-size"),
    ("--dp-size", "--data-parallel-size"),
    ("--pp-size", "--pipeline-parallel-size"),
)


def parallel_size(sglang_argv: list[str], names: tuple[str, ...]) -> int:
    """The value of one of SGLang's parallelism flags (either spelling); 1 when absent."""
    value = next((v for v in (flag_value(sglang_argv, name) for name in names) if v is not None), None)
    return int(value) if value is not None and value.strip().isdigit() else 1
