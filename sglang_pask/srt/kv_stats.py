"""``meta_info["kv_stats"]``: what the layer groups kept of each request, in its response.

Every finished request served by a layer-group pool carries ``{"full_tokens": n, "kept_tokens":
[k_0, ...], "budget": b, "group_budgets": [...], "policy": name}``: its final length, the positions
each layer group read at its last step, and the budgets. A request that asked with the sampling
parameter ``"return_kv_kept": true`` also gets ``"kept_positions"``: per group, those positions
themselves, ascending. Under StructKV, ``"structkv"`` adds what its prefill did
(:meth:`~sglang_pask.structkv.forward_pass.StructKVPass.report`: pivot, skeleton, rows per layer). The path is the same
as the role fields' (:mod:`.role_output`): SGLang's ``customized_info`` from the scheduler's output
streamer.
"""

from __future__ import annotations

from typing import Any, Optional

from sglang_pask.srt.layer_group_runtime import STATS_ATTRIBUTE
from sglang_pask.srt.role_output import RoleReportingOutputStreamer

KV_STATS_KEY = "kv_stats"


class PaskOutputStreamer(RoleReportingOutputStreamer):
    """The role-reporting output streamer plus ``kv_stats`` for finished requests."""

    def build_additional_customized_info(self, reqs: list[Any]) -> dict[str, list[Optional[Any]]]:
        fields: dict[str, list[Optional[Any]]] = super().build_additional_customized_info(reqs)
        stats = [getattr(req, STATS_ATTRIBUTE, None) if req.finished() else None for req in reqs]
        # SGLang accumulates a field's values as a list: send [stats] (unwrapped by the tokenizer side).
        fields[KV_STATS_KEY] = [None if s is None else [s] for s in stats]
        return fields

    def is_request_level_customized_info_key(self, key: str) -> bool:
        return key == KV_STATS_KEY or super().is_request_level_customized_info_key(key)
