"""BFCL's prompting format as chat messages.

This is what BFCL's generation step does for an open-weights model in prompting mode
(``OSSHandler._pre_query_processing_prompting`` after ``load_dataset_entry``), with BFCL's own
functions: add the Python language hint to every function description, then put BFCL's default
system prompt (persona, task, the ``[func_name1(params_name1=params_value1, ...)]`` output format and
the function docs as indented JSON) first, merged in front of the item's own system message if it has
one. The chat template is applied by the server (``/v1/chat/completions``) or by the caller.
"""

from __future__ import annotations

import copy

from sglang_pask.bfcl.data import BfclItem
from sglang_pask.bfcl.offline import import_bfcl


def build_messages(item: BfclItem) -> list[dict[str, str]]:
    """Build the chat messages that BFCL sends for an item.

    Parameters
    ----------
    item : BfclItem
        The item (left unchanged).

    Returns
    -------
    list of dict
        ``[{"role": "system", "content": <BFCL system prompt>}, {"role": "user", ...}, ...]``.
    """
    api = import_bfcl()
    functions = api.func_doc_language_specific_pre_processing(item.copy_functions(), item.category)
    messages = copy.deepcopy(item.messages)
    return api.system_prompt_pre_processing_chat_model(messages, functions, item.id)
