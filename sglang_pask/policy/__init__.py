"""KV persistence policies: which tokens' KV each layer group keeps (pure torch, no sglang import).

- :mod:`.base`: :class:`KVPolicy` (the interface), :class:`KeepDecision`, :class:`RankingPolicy`
  (window + priority fill) and :func:`keep_highest`.
- :mod:`.budget`: group capacity, budget checks at start-up, the per-group split.
- :mod:`.registry`: ``--kv-policy`` names (:func:`get_policy`, :func:`available_policies`) and the
  options ``--kv-policy-args`` may set (:func:`settable_options`, :func:`policy_options`).
- One module per policy: :mod:`.full`, :mod:`.streaming_llm`, :mod:`.h2o`, :mod:`.snapkv`,
  :mod:`.pyramidkv`, :mod:`.pask` (with its calibrated table's file form in :mod:`.pask_file`).
"""

from .base import KeepDecision, KVPolicy, RankingPolicy, keep_highest
from .budget import capacity, check_budget, extend_capacity, plan_group_budgets
from .full import FullPolicy
from .h2o import H2OPolicy
from .pask import PaskPolicy, PaskTable
from .pask_file import PolicyFileError, load_policy_file
from .pyramidkv import PyramidKVPolicy
from .registry import available_policies, get_policy, policy_options, register_policy, settable_options
from .snapkv import SnapKVPolicy
from .streaming_llm import StreamingLLMPolicy

__all__ = [
    "FullPolicy",
    "H2OPolicy",
    "KVPolicy",
    "KeepDecision",
    "PaskPolicy",
    "PaskTable",
    "PolicyFileError",
    "PyramidKVPolicy",
    "RankingPolicy",
    "SnapKVPolicy",
    "StreamingLLMPolicy",
    "available_policies",
    "capacity",
    "extend_capacity",
    "check_budget",
    "get_policy",
    "keep_highest",
    "load_policy_file",
    "plan_group_budgets",
    "policy_options",
    "register_policy",
    "settable_options",
]
