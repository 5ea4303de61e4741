"""Stand-in for ``bfcl_eval.model_handler.parser.js_parser``, installed only when the tree-sitter
JavaScript grammar (``tree_sitter`` + ``tree_sitter_javascript``) is not importable.

Why a stand-in: ``bfcl_eval.model_handler.utils`` imports the JavaScript parser at module level, and the
real module builds a tree-sitter parser at import time. Only the ``simple_javascript`` category decodes
JavaScript; the eight AST categories this project evaluates are all Python.
"""

from __future__ import annotations

from typing import NoReturn


def parse_javascript_function_call(source_code: str) -> NoReturn:
    """Raise: JavaScript answers cannot be decoded without tree-sitter-javascript."""
    raise NotImplementedError(
        "JavaScript decoding is a stand-in here (tree-sitter-javascript is not installed); only "
        "Python categories are supported"
    )
