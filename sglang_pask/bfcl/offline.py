"""Import ``bfcl_eval``'s prompt and AST-checker functions offline.

``bfcl-eval`` is installed with ``--no-deps`` (``requirements/bfcl-nodeps.txt``): its declared
dependency set is about 90 packages (every provider SDK, a numpy pin). The functions this project uses
need none of them, but their modules import a few at module level. :func:`import_bfcl` puts the
stand-ins of :mod:`sglang_pask.bfcl.standins` in place of exactly those imports and then imports the
real BFCL functions:

- ``bfcl_eval.constants.model_config`` always (the real one imports every provider SDK);
- the Java / JavaScript tree-sitter parsers when the real ones cannot be imported;
- ``tenacity`` and ``filelock`` when missing, and only while ``bfcl_eval`` is being imported (they are
  removed from ``sys.modules`` afterwards, so nothing else in the process sees them).

``bfcl_eval.constants.eval_config`` creates ``result/``, ``score/`` and ``.file_locks/`` folders under
``BFCL_PROJECT_ROOT`` (by default beside the installed package) on import; when that variable is unset
it is pointed at a fresh temporary directory first.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import tempfile
import threading
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Callable

_MODEL_CONFIG = "bfcl_eval.constants.model_config"
_PARSERS = {
    "bfcl_eval.model_handler.parser.java_parser": "java_parser",
    "bfcl_eval.model_handler.parser.js_parser": "js_parser",
}
_OPTIONAL_TOP_LEVEL = ("tenacity", "filelock")


@dataclass(frozen=True)
class BfclApi:
    """The ``bfcl_eval`` functions and enums that this project calls.

    Attributes
    ----------
    ast_checker : Callable
        ``bfcl_eval.eval_checker.ast_eval.ast_checker.ast_checker(functions, decoded, ground_truth,
        language, category, model_name) -> dict`` with ``valid`` and ``error``.
    decode_ast : Callable
        ``bfcl_eval.model_handler.utils.default_decode_ast_prompting(text, return_format)``: the
        decoder BFCL uses for every prompting (non-FC) open-weights model.
    is_function_calling_format_output : Callable
        BFCL's check that a decoded output is ``[{name: {param: value}}, ...]``.
    system_prompt_pre_processing_chat_model : Callable
        Inserts BFCL's default system prompt (function docs as JSON) into a message list.
    func_doc_language_specific_pre_processing : Callable
        Adds BFCL's language hint to each function description, as its generation step does.
    language_python : Any
        ``bfcl_eval.constants.enums.Language.PYTHON``.
    return_format_python : Any
        ``bfcl_eval.constants.enums.ReturnFormat.PYTHON``.
    """

    ast_checker: Callable[..., dict]
    decode_ast: Callable[..., list]
    is_function_calling_format_output: Callable[[Any], bool]
    system_prompt_pre_processing_chat_model: Callable[..., list]
    func_doc_language_specific_pre_processing: Callable[..., list]
    language_python: Any
    return_format_python: Any


_lock = threading.Lock()
_api: BfclApi | None = None


def _standin(name: str) -> ModuleType:
    return importlib.import_module(f"sglang_pask.bfcl.standins.{name}")


def _install_permanent_standins() -> None:
    if _MODEL_CONFIG not in sys.modules:
        sys.modules[_MODEL_CONFIG] = _standin("model_config")
    for module_name, standin_name in _PARSERS.items():
        if module_name in sys.modules:
            continue
        try:
            importlib.import_module(module_name)
        except Exception:  # ImportError, or an incompatible tree-sitter API at import time
            sys.modules.pop(module_name, None)
            sys.modules[module_name] = _standin(standin_name)


def _import_real() -> BfclApi:
    if importlib.util.find_spec("bfcl_eval") is None:
        raise ImportError("bfcl_eval is not installed: run `pip install --no-deps -r requirements/bfcl-nodeps.txt`")
    os.environ.setdefault("BFCL_PROJECT_ROOT", tempfile.mkdtemp(prefix="sglang_pask_bfcl_"))
    _install_permanent_standins()
    temporary = [
        name for name in _OPTIONAL_TOP_LEVEL if name not in sys.modules and importlib.util.find_spec(name) is None
    ]
    for name in temporary:
        sys.modules[name] = _standin(name)
    try:
        from bfcl_eval import utils as bfcl_utils
        from bfcl_eval.constants.enums import Language, ReturnFormat
        from bfcl_eval.eval_checker.ast_eval.ast_checker import ast_checker
        from bfcl_eval.model_handler import utils as handler_utils
    finally:
        for name in temporary:
            sys.modules.pop(name, None)
    return BfclApi(
        ast_checker=ast_checker,
        decode_ast=handler_utils.default_decode_ast_prompting,
        is_function_calling_format_output=bfcl_utils.is_function_calling_format_output,
        system_prompt_pre_processing_chat_model=handler_utils.system_prompt_pre_processing_chat_model,
        func_doc_language_specific_pre_processing=bfcl_utils._func_doc_language_specific_pre_processing,
        language_python=Language.PYTHON,
        return_format_python=ReturnFormat.PYTHON,
    )


def import_bfcl() -> BfclApi:
    """Import (once) and return the ``bfcl_eval`` functions this project uses.

    Returns
    -------
    BfclApi
        The real BFCL functions, importable offline thanks to the stand-ins described above.

    Raises
    ------
    ImportError
        If ``bfcl_eval`` is not installed.
    """
    global _api
    with _lock:
        if _api is None:
            _api = _import_real()
        return _api
