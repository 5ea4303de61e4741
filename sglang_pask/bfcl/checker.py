"""Score a model's answer with BFCL's own AST checker, offline.

This follows BFCL's evaluation of one AST entry (``eval_runner._evaluate_single_ast_entry``) for a
prompting (non function-calling) model: decode the text with
``default_decode_ast_prompting``, require the ``[{name: {param: value}}]`` shape, then run
``ast_checker`` on the item's raw function docs and possible answer.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sglang_pask.bfcl.data import BfclItem
from sglang_pask.bfcl.offline import import_bfcl

#: The model name handed to BFCL's checker; it only affects the ``.`` -> ``_`` renaming of function
#: names, which the stand-in model config turns off for every name.
CHECKER_MODEL_NAME = "sglang-pask"


@dataclass(frozen=True)
class CheckResult:
    """The verdict on one answer.

    Attributes
    ----------
    valid : bool
        Whether BFCL counts the answer as correct.
    error : list of str
        BFCL's error messages (empty when valid).
    error_type : str
        BFCL's error class, e.g. ``"ast_decoder:decoder_failed"`` or ``"value_error:string"``
        (empty when valid).
    decoded : list of dict or None
        The decoded calls ``[{name: {param: value}}]``, or None when decoding failed.
    """

    valid: bool
    error: list[str] = field(default_factory=list)
    error_type: str = ""
    decoded: list[dict] | None = None


def check(item: BfclItem, model_output: str) -> CheckResult:
    """Check a model's answer to an item with BFCL's AST checker.

    Parameters
    ----------
    item : BfclItem
        The item that was asked.
    model_output : str
        The model's raw text, e.g. ``'[math.factorial(number=5)]'``.

    Returns
    -------
    CheckResult
        ``valid`` is BFCL's verdict.
    """
    api = import_bfcl()
    try:
        decoded = api.decode_ast(model_output, api.return_format_python)
    except Exception as exc:  # BFCL counts any decoding failure as a wrong answer
        return CheckResult(
            valid=False,
            error=[f"Invalid syntax. Failed to decode AST. {exc}"],
            error_type="ast_decoder:decoder_failed",
        )
    if not api.is_function_calling_format_output(decoded):
        return CheckResult(
            valid=False,
            error=["Did not output in the specified format."],
            error_type="ast_decoder:decoder_wrong_output_format",
            decoded=decoded,
        )
    verdict = api.ast_checker(
        item.copy_functions(),
        decoded,
        item.ground_truth,
        api.language_python,
        item.category,
        CHECKER_MODEL_NAME,
    )
    return CheckResult(
        valid=bool(verdict["valid"]),
        error=list(verdict.get("error", [])),
        error_type=str(verdict.get("error_type", "")) if not verdict["valid"] else "",
        decoded=decoded,
    )
