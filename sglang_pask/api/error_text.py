"""The text of client errors without the server's internals: no file paths, line numbers or tracebacks.

* :func:`validation_message`: one line per problem of a request body that FastAPI could not parse or
  validate (``RequestValidationError.errors()``), naming the field and what is wrong. SGLang 0.5.23
  answers such bodies with ``str(exc)``, which names the server's source file and line.
* :func:`without_source_locations`: an error message with the source locations native libraries put
  in it removed (xgrammar: ``[06:23:49] /project/cpp/regex_converter.cc:83: Regex parsing error ...``).

Pure Python (no sglang import).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

# "[06:23:49] /project/cpp/regex_converter.cc:83: " (a native library's log prefix), and Python's
# traceback lines ('File "/x/y.py", line 928, in generate_request').
_NATIVE_LOCATION = re.compile(r"\[\d{2}:\d{2}:\d{2}\] [^\s:]+:\d+: ")
_PYTHON_LOCATION = re.compile(r'\s*File "[^"]+", line \d+(, in \S+)?')


def without_source_locations(text: str) -> str:
    """``text`` without native log prefixes naming a source file and line, and without Python
    traceback location lines; whitespace at either end is dropped."""
    text = _NATIVE_LOCATION.sub("", text)
    return _PYTHON_LOCATION.sub("", text).strip()


def validation_message(errors: Iterable[Mapping[str, Any]]) -> str:
    """One ``; ``-separated line naming each problem of a request body.

    ``errors`` are FastAPI/Pydantic error dicts (``loc``, ``msg``, ``type``, optional ``ctx``). A
    body that is not JSON reads ``request body is not valid JSON at character 14: unexpected end of
    data``; a field reads ``sampling_params.max_new_tokens: Input should be a valid integer``.
    """
    parts = []
    for error in errors:
        loc = [part for part in error.get("loc") or () if part != "body"]
        msg = str(error.get("msg") or "invalid value").strip()
        ctx = error.get("ctx") or {}
        if error.get("type") == "json_invalid":
            where = f" at character {loc[0]}" if loc and isinstance(loc[0], int) else ""
            detail = ctx.get("error") if isinstance(ctx, Mapping) else None
            parts.append(f"request body is not valid JSON{where}" + (f": {detail}" if detail else ""))
            continue
        field = ".".join(str(part) for part in loc)
        parts.append(f"{field}: {msg}" if field else msg)
    return without_source_locations("; ".join(parts)) or "invalid request body"
