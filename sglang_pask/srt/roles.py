"""Roles of a running request's positions, for policies that read them (PASK).

The request-pool row of every admitted request is remembered (``ReqToTokenPool.alloc``, AFTER hook);
a position's role is its prompt token's role (:func:`~sglang_pask.structure.tag_prompt_ids`, tagged
once per request) or its generated token's role on the grammar's role track
(:func:`~sglang_pask.srt.grammar.request_grammar_roles`); generated tokens no grammar saw are
free text. The same map gives a row's calibration probe, if its request carries one
(:func:`~sglang_pask.api.probe.parse_probe`), read once when the row's views are made.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
from torch import Tensor

from sglang_pask.api.probe import parse_probe
from sglang_pask.kvpool.probe import CalibrationProbe
from sglang_pask.srt.grammar import process_vocab, request_grammar_roles
from sglang_pask.structure import Role, tag_prompt_ids

_PROMPT_ROLES = "_pask_prompt_roles"


class RequestRoles:
    """Maps request-pool rows to their requests and answers role lookups."""

    def __init__(self) -> None:
        self.requests: dict[int, Any] = {}

    def on_alloc(self, result: Any, req_pool: Any, reqs: list[Any], *args: Any, **kwargs: Any) -> Any:
        """AFTER hook of ``ReqToTokenPool.alloc``: remember each request's row."""
        if result is not None:
            for req in reqs:
                if req.kv.req_pool_idx is not None:
                    self.requests[int(req.kv.req_pool_idx)] = req
        return result

    def forget(self, row: int) -> None:
        """The row was freed."""
        self.requests.pop(row, None)

    def probe_of(self, row: int) -> Optional[CalibrationProbe]:
        """The calibration probe of the request in ``row``, if it carries one."""
        req = self.requests.get(row)
        return None if req is None else parse_probe(getattr(req.sampling_params, "custom_params", None))

    def roles_of(self, row: int, positions: Tensor) -> Tensor:
        """``(n,)`` int64 roles of ``positions`` (``(n,)`` int64) of the request in ``row``."""
        free_text = torch.full_like(positions, int(Role.FREE_TEXT))
        req = self.requests.get(row)
        vocab = process_vocab()
        if req is None or vocab is None or positions.numel() == 0:
            return free_text
        prompt = getattr(req, _PROMPT_ROLES, None)
        if prompt is None:
            prompt = torch.tensor(tag_prompt_ids(list(req.origin_input_ids), vocab), dtype=torch.int64)
            setattr(req, _PROMPT_ROLES, prompt)
        offset, generated = request_grammar_roles(req)
        start = prompt.numel() + offset
        length = max(int(positions.max()) + 1, start + len(generated))
        table = torch.full((length,), int(Role.FREE_TEXT), dtype=torch.int64)
        table[: prompt.numel()] = prompt
        if generated:
            table[start : start + len(generated)] = torch.tensor(list(generated), dtype=torch.int64)
        return table[positions.cpu()].to(positions.device)
