"""Roles of a running request's positions, for policies that read them (PASK).

The request-pool row of every admitted request is remembered (``ReqToTokenPool.alloc``, AFTER hook);
a position's role is its prompt token's role (:func:`~sglang_pask.structure.tag_prompt_ids`, tagged
once per request) or its generated token's role on the grammar's role track
(:func:`~sglang_pask.srt.role_grammar.request_grammar_roles`); generated tokens no grammar saw are
free text.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
from torch import Tensor

from sglang_pask.kvpool.probe import ALL_GROUPS, CalibrationProbe
from sglang_pask.srt.role_grammar import process_vocab, request_grammar_roles
from sglang_pask.structure import Role, tag_prompt_ids

_PROMPT_ROLES = "_pask_prompt_roles"
# custom_params key of a calibration request (python -m sglang_pask.calibrate).
PROBE_PARAM = "pask_probe"
# ``drop_group`` value of a probe that drops its role in every layer group.
ALL_GROUPS_LABEL = "all"


def probe_error(value: Any) -> Optional[str]:
    """Why ``custom_params["pask_probe"]`` is malformed, or None. It is an object with
    ``drop_group`` (a layer group index, or ``"all"``) and ``drop_role`` (a role label) together,
    and/or ``distortion_budget`` in (0, 1]."""
    if not isinstance(value, dict) or not value or set(value) - {"drop_group", "drop_role", "distortion_budget"}:
        return f"{PROBE_PARAM} must be an object with drop_group and drop_role, and/or distortion_budget"
    if ("drop_group" in value) != ("drop_role" in value):
        return f"{PROBE_PARAM}: drop_group and drop_role go together"
    if "drop_group" in value:
        group = value["drop_group"]
        if group != ALL_GROUPS_LABEL and (not isinstance(group, int) or isinstance(group, bool) or group < 0):
            return f"{PROBE_PARAM}: drop_group must be a layer group index or \"all\", got {group!r}"
        try:
            Role.from_label(str(value["drop_role"]))
        except ValueError:
            return f"{PROBE_PARAM}: drop_role {value['drop_role']!r} is not a role"
    budget = value.get("distortion_budget")
    if "distortion_budget" in value and not (isinstance(budget, (int, float)) and 0 < budget <= 1):
        return f"{PROBE_PARAM}: distortion_budget must be in (0, 1], got {budget!r}"
    return None


def parse_probe(custom_params: Any) -> Optional[CalibrationProbe]:
    """The calibration probe of a request's custom params (checked by the API contract), or None."""
    if not isinstance(custom_params, dict) or PROBE_PARAM not in custom_params:
        return None
    value = custom_params[PROBE_PARAM]
    if probe_error(value) is not None:
        return None
    group = value.get("drop_group")
    return CalibrationProbe(
        drop_group=ALL_GROUPS if group == ALL_GROUPS_LABEL else group,
        drop_role=int(Role.from_label(str(value["drop_role"]))) if "drop_role" in value else None,
        distortion_budget=value.get("distortion_budget"),
    )


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
