"""Stand-in for ``bfcl_eval.model_handler.parser.java_parser``, installed only when the tree-sitter
Java grammar (``tree_sitter`` + ``tree_sitter_java``) is not importable.

Why a stand-in: ``bfcl_eval.model_handler.utils`` imports the Java parser at module level, and the
real module builds a tree-sitter parser at import time. Only the ``simple_java`` category decodes Java;
the eight AST categories this project evaluates are all Python.
"""

from __future__ import annotations

from typing import NoReturn


def parse_java_function_call(source_code: str) -> NoReturn:
    """Raise: Java answers cannot be decoded without tree-sitter-java."""
    raise NotImplementedError(
        "Java decoding is a stand-in here (tree-sitter-java is not installed); only Python categories are supported"
    )
