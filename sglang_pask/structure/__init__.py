"""Structural roles of tokens: the vocabulary, generated-token tracks, prompt tagging.

Pure Python (no sglang import). :mod:`.roles` defines the role vocabulary; :mod:`.tracker` tags
generated tokens from the request's grammar; :mod:`.prompt` tags prompt tokens.
"""

from .prompt import tag_prompt, tag_prompt_ids
from .roles import LABELS, NUM_ROLES, PRIORITY, Role, combine
from .tracker import KINDS, RoleGrammar, RoleTracker
from .vocab import TokenVocab

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
    "tag_prompt",
    "tag_prompt_ids",
]
