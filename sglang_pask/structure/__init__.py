"""Structural roles of tokens: the vocabulary, generated-token tracks, prompt tagging.

Pure Python (no sglang import; xgrammar only where a matcher or tokenizer info is handed in).

- :mod:`.roles`: the role vocabulary (:class:`Role`, stable values) and the priority rule for
  tokens that span several roles.
- :mod:`.tracker`: :class:`RoleGrammar` (one per grammar, shared by its requests) and
  :class:`RoleTracker` (one per request: ``accept``, ``rollback``, ``copy``).
- :mod:`.prompt`: roles of prompt tokens (:func:`tag_prompt`, :func:`tag_prompt_ids`) and the
  function docs found in a prompt (:func:`find_function_docs`).
- :mod:`.vocab`: :class:`TokenVocab`, the bytes of every token id.
"""

from .prompt import find_function_docs, tag_prompt, tag_prompt_ids
from .roles import LABELS, NUM_ROLES, PRIORITY, Role, combine
from .tracker import KINDS, RoleGrammar, RoleTracker
from .vocab import TokenVocab, hf_special_ids, hf_special_tokens

__all__ = [
    "KINDS",
    "LABELS",
    "NUM_ROLES",
    "PRIORITY",
    "Role",
    "RoleGrammar",
    "RoleTracker",
    "TokenVocab",
    "combine",
    "find_function_docs",
    "hf_special_ids",
    "hf_special_tokens",
    "tag_prompt",
    "tag_prompt_ids",
]
